"""Least-privilege roles for a pgjournal database, as one idempotent SQL script (``pgjournal roles --sql``).

Why a script and not a migration: roles are cluster-wide, need a superuser (or CREATEROLE) to create, and
a DBA usually wants to read, adapt and run them once, outside the application's migrations; the schema
migrations then run as the *owner* role the script creates. The script:

* **owner** (``pgjournal_owner``): owns pgjournal's tables (existing ones change hands to it) and is the
  only role that may create objects in the schema; it runs ``pgjournal migrate``, physical cleanup
  (``pgjournal cleanup ... --execute``) and ``pgjournal tags truncate``. Its default privileges hand the
  tables of later migrations to the other two roles.
* **writer** (``pgjournal_writer``): applications and projection workers. Reads everything; appends to
  ``event_journal`` and may change only its ``deleted`` column (logical delete), so history cannot be
  rewritten or removed; reads and writes the other tables (snapshots, tag views, every projection's offsets,
  management, leases, payload keys) except the migrations' own records (schema version, stored format), which
  it only reads. It cannot create, alter, drop or truncate anything. On PostgreSQL 17+ it may VACUUM the key
  table (``MAINTAIN``): shredding a key rewrites that table so the key's bytes leave its file.
* **reader** (``pgjournal_reader``): Spark exports, queries, ``pgjournal verify``: SELECT only, and not on the
  wrapped data keys (``pgjournal_payload_keys``).
* **loader** (``pgjournal_loader``): the Spark incremental load. Reads everything; keeps its watermarks in
  ``projection_timestamp_offset_store`` (INSERT, DELETE there and nowhere else), and row-level security on
  that table confines it to the load's rows (projection names ``spark-load:...``): it can neither see nor
  write a projection's offsets. Every other role sees every row, as without row-level security (the owner
  and superusers bypass it).

Reader and loader get limits (:data:`READ_ONLY_LIMITS`, and ``transaction_timeout`` on PostgreSQL 17+) so that a
transaction they forget open ends on its own; they are role defaults, which a session may change. No role may
create a large object (EXECUTE on the ``lo_`` functions that make one is revoked from PUBLIC in the database).

The refusals, role by role, are in SECURITY.md and tested in ``tests/security/test_role_boundaries.py``.

No password is in the script (set them with ``\\password`` or ``ALTER ROLE ... PASSWORD``). PUBLIC loses
every privilege on the database and CREATE on the schema, so only these roles (and superusers) get in.
``visibility_horizon=True`` also grants ``pg_read_all_stats`` to writer, reader and loader: then readers see
when other roles' journal writers started and bound reads by that at once. Without it, a reader waits for a
journal writer of another role to finish before it reads past the moment it saw it (exact, but a one-shot
read such as a current query or a load may wait up to ``longest_transaction`` and then fails with
HorizonBlocked if that writer is still open; see :mod:`pgjournal.core.horizon`). It is opt-in because that role
also shows every session's query text.
"""

from __future__ import annotations

import re

import psycopg

from pgjournal.admin.migrate import VERSION_TABLE
from pgjournal.admin.stored_format import FORMAT_TABLE
from pgjournal.errors import ConfigurationError, JournalError
from pgjournal.server.connections import connect
from pgjournal.server.dsn import mask_dsn
from pgjournal.store.keys import TABLE as KEY_TABLE
from pgjournal.store.schema import metadata
from pgjournal.store.shard_layout import LAYOUT_TABLE
from pgjournal.store.timestamp_offsets import LOAD_PREFIX, OFFSET_TABLE

#: The reader's and loader's defaults (``ALTER ROLE ... SET``): an idle transaction of theirs ends after 5 s
#: (pgjournal's own reads run in autocommit; a key table rewrite waits up to 10 s for locks to go), a statement
#: after an hour (an export reads a range of slices per statement).
READ_ONLY_LIMITS = {"idle_in_transaction_session_timeout": "5s", "statement_timeout": "1h"}
#: Their whole transaction's limit, PostgreSQL 17+ (``transaction_timeout``): statements one after another
#: would otherwise keep a transaction open for good.
TRANSACTION_LIMIT = "1h"
#: The functions that create a large object (``lo_import`` reads server files and is a superuser's anyway):
#: EXECUTE revoked from PUBLIC in the journal's database.
LARGE_OBJECT_MAKERS = ("lo_from_bytea(oid, bytea)", "lo_create(oid)", "lo_creat(integer)", "lo_import(text)",
                       "lo_import(text, oid)")

_ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_role_name(name: str, what: str) -> str:
    """A role name the script can use unquoted and unambiguously: lower-case letters, digits, ``_``."""
    if not isinstance(name, str) or not _ROLE_NAME.match(name) or name.startswith("pg_"):
        raise ConfigurationError(
            f"{what} role name must be 1-63 lower-case letters, digits or '_' (not starting with a digit or "
            f"'pg_'), got {name!r}"
        )
    return name


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def role_script(
    *,
    owner: str = "pgjournal_owner",
    writer: str = "pgjournal_writer",
    reader: str = "pgjournal_reader",
    loader: str = "pgjournal_loader",
    schema: str = "public",
    visibility_horizon: bool = False,
) -> str:
    """The SQL that creates (or updates) the four roles and their privileges in the current database."""
    names = [check_role_name(owner, "owner"), check_role_name(writer, "writer"), check_role_name(reader, "reader"),
             check_role_name(loader, "loader")]
    if len(set(names)) != 4:
        raise ConfigurationError(f"owner, writer, reader and loader must be four different roles, got {names}")
    check_role_name(schema, "schema")
    o, w, r, ld, s = (_quote_ident(n) for n in (owner, writer, reader, loader, schema))
    tables = [*sorted(metadata.tables), VERSION_TABLE, LAYOUT_TABLE]
    table_list = ", ".join(f"'{t}'" for t in tables)  # names from pgjournal.store.schema: plain identifiers
    attributes = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
    create_roles = "\n".join(
        f"  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{name}') THEN CREATE ROLE {_quote_ident(name)}; "
        f"END IF;\n  ALTER ROLE {_quote_ident(name)} {attributes};"
        for name in names
    )
    limits = "\n".join(f"ALTER ROLE {role} SET {name} = '{value}';" for role in (r, ld)
                       for name, value in READ_ONLY_LIMITS.items())
    transaction_limits = "\n".join(f"    ALTER ROLE {role} SET transaction_timeout = '{TRANSACTION_LIMIT}';"
                                   for role in (r, ld))
    large_objects = ", ".join(LARGE_OBJECT_MAKERS)
    horizon = (f"GRANT pg_read_all_stats TO {w}, {r}, {ld};\n" if visibility_horizon else
               "-- (not granted: pg_read_all_stats for the visibility horizon; see pgjournal.admin.roles)\n")
    return f"""-- pgjournal least-privilege roles: owner {owner}, writer {writer}, reader {reader}, loader {loader}.
-- Run once per database as a superuser, connected to the journal's database; running it again is safe.
-- Passwords are not set here: \\password {owner} (and the others), or ALTER ROLE ... PASSWORD.
BEGIN;
DO $roles$ BEGIN
{create_roles}
END $roles$;

-- Only these roles may connect; only the owner may create objects.
DO $db$ BEGIN
  EXECUTE format('REVOKE ALL ON DATABASE %I FROM PUBLIC', current_database());
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO {o}, {w}, {r}, {ld}', current_database());
END $db$;
REVOKE CREATE ON SCHEMA {s} FROM PUBLIC;
GRANT USAGE, CREATE ON SCHEMA {s} TO {o};
GRANT USAGE ON SCHEMA {s} TO {w}, {r}, {ld};

-- pgjournal's tables (and event_journal's partitions): owned by the owner; writer and reader as above.
DO $tables$
DECLARE t record;
BEGIN
  FOR t IN
    SELECT c.relname, c.relname = 'event_journal' OR p.inhparent IS NOT NULL AS journal
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    LEFT JOIN pg_inherits AS p ON p.inhrelid = c.oid AND p.inhparent = to_regclass('{schema}.event_journal')
    WHERE n.nspname = '{schema}' AND c.relkind IN ('r', 'p')
      AND (c.relname IN ({table_list}) OR p.inhparent IS NOT NULL)
  LOOP
    EXECUTE format('ALTER TABLE {s}.%I OWNER TO {o}', t.relname);
    EXECUTE format('REVOKE ALL ON {s}.%I FROM PUBLIC, {w}, {r}, {ld}', t.relname);
    EXECUTE format('GRANT SELECT ON {s}.%I TO {w}, {ld}', t.relname);
    IF t.relname <> '{KEY_TABLE}' THEN  -- wrapped data keys: not for the reader
      EXECUTE format('GRANT SELECT ON {s}.%I TO {r}', t.relname);
    ELSIF current_setting('server_version_num')::int >= 170000 THEN  -- the key store's VACUUM FULL on shredding
      EXECUTE format('GRANT MAINTAIN ON {s}.%I TO {w}', t.relname);
    END IF;
    IF t.relname = '{OFFSET_TABLE}' THEN  -- the load's watermarks, and no other rows (row-level security)
      EXECUTE format('GRANT INSERT, DELETE ON {s}.%I TO {ld}', t.relname);
      EXECUTE format('ALTER TABLE {s}.%I ENABLE ROW LEVEL SECURITY', t.relname);
      EXECUTE format('DROP POLICY IF EXISTS "pgjournal: every row" ON {s}.%I', t.relname);
      EXECUTE format('CREATE POLICY "pgjournal: every row" ON {s}.%I USING (true) WITH CHECK (true)', t.relname);
      EXECUTE format('DROP POLICY IF EXISTS {ld} ON {s}.%I', t.relname);
      EXECUTE format('CREATE POLICY {ld} ON {s}.%I AS RESTRICTIVE TO {ld} USING (starts_with(projection_name, %L)) '
                     'WITH CHECK (starts_with(projection_name, %L))', t.relname, '{LOAD_PREFIX}', '{LOAD_PREFIX}');
    END IF;
    IF t.journal THEN
      EXECUTE format('GRANT INSERT, UPDATE (deleted) ON {s}.%I TO {w}', t.relname);
    ELSIF t.relname NOT IN ('{VERSION_TABLE}', '{FORMAT_TABLE}', '{LAYOUT_TABLE}') THEN  -- read-only to them
      EXECUTE format('GRANT INSERT, UPDATE, DELETE ON {s}.%I TO {w}', t.relname);
    END IF;
  END LOOP;
END $tables$;

-- Tables that later migrations create (as the owner) get the same grants (event_journal keeps its own).
ALTER DEFAULT PRIVILEGES FOR ROLE {o} IN SCHEMA {s} GRANT SELECT ON TABLES TO {w}, {r}, {ld};
ALTER DEFAULT PRIVILEGES FOR ROLE {o} IN SCHEMA {s} GRANT INSERT, UPDATE, DELETE ON TABLES TO {w};

-- Reader and loader: a transaction they forget open, or a statement left running, ends on its own (defaults
-- the session may change: see SECURITY.md, "Roles").
{limits}
DO $limits$ BEGIN
  IF current_setting('server_version_num')::int >= 170000 THEN
{transaction_limits}
  END IF;
END $limits$;

-- Large objects are rows of pg_largeobject that any role may create: nobody here needs them.
REVOKE EXECUTE ON FUNCTION {large_objects} FROM PUBLIC;
{horizon}COMMIT;
"""


def apply_roles(dsn: str, script: str) -> None:
    """Run ``script`` (from :func:`role_script`) on ``dsn`` in one transaction."""
    try:
        with connect(dsn, doing="set up roles on") as conn:
            conn.execute(script.encode())  # bytes: no client-side placeholder parsing of the script
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise JournalError(f"setting up roles on {mask_dsn(dsn)} failed (SQLSTATE {exc.sqlstate}): {first}; "
                           "run it as a superuser connected to the journal's database") from None
