"""Login roles of the tests and the DSNs that log in as them (passwords the tests check never show)."""

from __future__ import annotations

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
