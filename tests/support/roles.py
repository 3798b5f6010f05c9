"""Login roles of the tests and the DSNs that log in as them (passwords the tests check never show)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import psycopg.conninfo

#: The password of every login role the tests create (the embedded server admits no one without one).
ROLE_PASSWORD = "pgjournal-test-role"


def create_login_role(server_dsn: str, name: str) -> None:
    """A login role with no privilege but :data:`ROLE_PASSWORD` (a stranger to the journal)."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{ROLE_PASSWORD}'")


def role_dsn(base: str, role: str, password: str = ROLE_PASSWORD) -> str:
    """``base`` as ``role``, with its password (which wins over the password file a DSN may name)."""
    return psycopg.conninfo.make_conninfo(base, user=role, password=password)


#: A password with URL-hostile characters, of :func:`secret_role`: tests check that it never shows.
SECRET = "Zq9-s3cr3t/p@ss?#"


@dataclass
class Roles:
    owner: str
    writer: str
    reader: str
    loader: str

    def dsn(self, base: str, role: str) -> str:
        return role_dsn(base, role)

    @property
    def all(self) -> tuple[str, ...]:
        return self.owner, self.writer, self.reader, self.loader


@contextlib.contextmanager
def least_privilege_roles(dsn: str, server_dsn: str) -> Iterator[Roles]:
    """The four roles of ``pgjournal.admin.roles`` (unique names, :data:`ROLE_PASSWORD`) on the database at ``dsn``,
    dropped afterwards with what they own there."""
    from pgjournal.admin.roles import apply_roles, role_script

    suffix = uuid.uuid4().hex[:8]
    names = Roles(f"pgj_owner_{suffix}", f"pgj_writer_{suffix}", f"pgj_reader_{suffix}", f"pgj_loader_{suffix}")
    apply_roles(dsn, role_script(owner=names.owner, writer=names.writer, reader=names.reader, loader=names.loader))
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for role in names.all:
                conn.execute(f"ALTER ROLE \"{role}\" PASSWORD '{ROLE_PASSWORD}'")
        yield names
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for role in names.all:
                conn.execute(f'REASSIGN OWNED BY "{role}" TO CURRENT_USER')
                conn.execute(f'DROP OWNED BY "{role}"')
        with psycopg.connect(server_dsn, autocommit=True) as conn:
            for role in names.all:
                conn.execute(f'DROP ROLE IF EXISTS "{role}"')
