"""Adopting a database that Akka/Pekko Persistence R2DBC created: pgjournal keeps Akka's tables as they are.

``pgjournal migrate`` on a database with Akka's ``event_journal`` (or its data partitions ``event_journal_0``
.. ``event_journal_<n-1>``) and no pgjournal schema does not run revision 0001 (which would create a
partitioned ``event_journal`` of its own). Instead, in one transaction, it

* checks Akka's tables have every column pgjournal reads and writes (Akka's schema since 1.1: ``tags`` on
  the journal, ``db_timestamp`` and ``tags`` on the snapshot table) and that payloads are BYTEA or JSONB;
* creates only what pgjournal needs beyond them: its offset store and management tables, the tag path,
  leases, dead letters, ``pgjournal_format`` (and ``snapshot`` when Akka's is absent); with data partitions
  a read-only view ``event_journal`` over them (UNION ALL; writes go to the partition of the slice);
* records the adoption in ``pgjournal_format`` (``event_layout = akka``, ``akka_data_partitions = n``), read
  at open into the dialect, whose ``event_table(slice)`` then names Akka's table;
* stamps revision :data:`ADOPTED_REVISION`, so later revisions run through Alembic as usual.

Akka's tables are never altered, re-keyed or rewritten: no column, index or constraint is added to them.
``plan`` says what ``adopt`` would do (``pgjournal migrate --check``) without doing it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import psycopg
from sqlalchemy import Table

from pgjournal.admin.stored_format import AKKA_LAYOUT, DATA_PARTITIONS, EVENT_LAYOUT, FORMAT_TABLE
from pgjournal.dialects import Dialect
from pgjournal.model.slices import NUMBER_OF_SLICES
from pgjournal.store.schema import (
    CORE_TABLES,
    DEAD_LETTER_TABLES,
    FORMAT_TABLES,
    PROJECTION_TABLES,
    TAG_TABLES,
    event_journal,
)

#: The revision an adopted database is stamped at: the tables of 0001-0005 exist (Akka's or created here).
ADOPTED_REVISION = "0005"
#: pgjournal's tables as of :data:`ADOPTED_REVISION` (later revisions create theirs through Alembic).
ADOPTED_TABLES: tuple[Table, ...] = (*CORE_TABLES, *TAG_TABLES, *PROJECTION_TABLES, *DEAD_LETTER_TABLES,
                                     *FORMAT_TABLES)
_PARTITION = re.compile(r"event_journal_([0-9]+)")
_PAYLOAD_TYPES = {"bytea", "jsonb"}
_SNAPSHOT_COLUMNS = ("slice", "entity_type", "persistence_id", "seq_nr", "db_timestamp", "write_timestamp",
                     "ser_id", "ser_manifest", "snapshot", "tags", "meta_ser_id", "meta_ser_manifest",
                     "meta_payload")

_COLUMNS_SQL = """
SELECT c.relname, c.relkind::text, a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE c.relnamespace = to_regnamespace(current_schema()) AND c.relkind IN ('r', 'p', 'v')
ORDER BY c.relname, a.attnum"""


@dataclass(frozen=True, slots=True)
class Step:
    """One line of a migration plan."""

    action: str
    target: str
    detail: str = ""


@dataclass
class AkkaSchema:
    """What an inspection found of Akka's tables (``problems`` empty: it can be adopted)."""

    event_tables: list[str]
    partitions: int
    #: ``table.column`` of payload columns that are JSONB.
    jsonb: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: Tables of the database (name -> kind: r table, p partitioned, v view).
    tables: dict[str, str] = field(default_factory=dict)


def _catalog(conn: psycopg.Connection) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    kinds: dict[str, str] = {}
    columns: dict[str, dict[str, str]] = {}
    for table, kind, column, type_ in conn.execute(_COLUMNS_SQL).fetchall():
        kinds[table] = kind
        columns.setdefault(table, {})[column] = type_
    return kinds, columns


def inspect(conn: psycopg.Connection, version_table: str, shard: tuple[int, int] | None = None) -> AkkaSchema | None:
    """Akka's journal tables on ``conn``, or ``None`` when this is not an Akka database to adopt (it has a
    pgjournal schema already, or no journal table at all).

    ``shard``: ``(i, n)`` when this is database ``i`` of ``n`` of a sharded journal (:mod:`pgjournal.shards`).
    Akka spreads its ``P`` data partitions over its ``n`` databases in order, ``P / n`` each, so database ``i``
    holds ``event_journal_<i*P/n> .. <(i+1)*P/n - 1>``: ``P`` is the count found here times ``n``."""
    kinds, columns = _catalog(conn)
    if version_table in kinds:
        return None
    numbered = sorted(int(m.group(1)) for m in map(_PARTITION.fullmatch, kinds) if m)
    if "event_journal" not in kinds and not numbered:
        return None
    problems: list[str] = []
    if "event_journal" in kinds and numbered:
        problems.append("both event_journal and event_journal_0.. exist: a database holds either Akka's single "
                        "journal table or its data partitions, not both")
    if "event_journal" in kinds and kinds["event_journal"] != "r":
        problems.append("event_journal is not an ordinary table (a partitioned table or a view): it was not "
                        "created by Akka's DDL, and the database has no pgjournal_version either")
    if numbered:
        tables = [f"event_journal_{i}" for i in numbered]
        problem = _partitions_problem(numbered, shard)
        if problem:
            problems.append(f"{problem}, found {', '.join(tables)}")
        partitions = len(numbered) * (shard[1] if shard else 1)
    else:
        partitions, tables = 1, ["event_journal"]
    schema = AkkaSchema(tables, partitions, tables=kinds)
    for table in tables:
        found = columns.get(table, {})
        missing = [c.name for c in event_journal.columns if c.name not in found]
        if missing:
            problems.append(f"{table} lacks column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                            "(Akka's schema since 1.1 has them: apply Akka's migration guide first)")
        for column in ("event_payload", "meta_payload"):
            type_ = found.get(column)
            if type_ is not None and type_ not in _PAYLOAD_TYPES:
                problems.append(f"{table}.{column} is {type_}; pgjournal reads BYTEA or JSONB payloads")
            if type_ == "jsonb":
                schema.jsonb.append(f"{table}.{column}")
    if "snapshot" in kinds:
        missing = [c for c in _SNAPSHOT_COLUMNS if c not in columns.get("snapshot", {})]
        if missing:
            problems.append(f"snapshot lacks column{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                            "(Akka's schema since 1.1 has them)")
        elif columns["snapshot"]["snapshot"] == "jsonb":
            schema.jsonb.append("snapshot.snapshot")
    schema.problems = problems
    return schema


def _partitions_problem(numbered: list[int], shard: tuple[int, int] | None) -> str:
    """What is wrong with the data partition numbers ``numbered`` found in database ``shard`` (``(i, n)``), or
    ``""``: one database holds ``event_journal_0 .. <P-1>``; database ``i`` of ``n``, its ``P / n`` in order."""
    index, databases = shard or (0, 1)
    here = len(numbered)
    total = here * databases
    first = index * here
    if numbered == list(range(first, first + here)) and NUMBER_OF_SLICES % total == 0:
        return ""
    if shard is None:
        if numbered[0] != 0 and numbered == list(range(numbered[0], numbered[0] + here)):
            return ("these are a later run of an Akka journal's data partitions, spread over several databases: "
                    "adopt every database at once with `pgjournal shard migrate` (it knows each database's place)")
        return (f"Akka's data partition tables must be event_journal_0 .. event_journal_<n-1> with n dividing "
                f"{NUMBER_OF_SLICES}")
    return (f"database {index} of {databases} must hold Akka's data partitions event_journal_{first} .. "
            f"event_journal_{first + here - 1} (its {here} of {total}, in order, {total} dividing {NUMBER_OF_SLICES})")


def _view_sql(schema: AkkaSchema) -> str:
    columns = ", ".join(c.name for c in event_journal.columns)
    union = " UNION ALL ".join(f"SELECT {columns} FROM {table}" for table in schema.event_tables)
    return f"CREATE VIEW event_journal AS {union}"


def adoption_steps(schema: AkkaSchema, dialect: Dialect, version_table: str) -> list[tuple[Step, list[str]]]:
    """What adopting takes: each step with its statements (none for what is kept as it is)."""
    steps: list[tuple[Step, list[str]]] = []
    def jsonb(table: str) -> str:
        columns = [name.split(".", 1)[1] for name in schema.jsonb if name.startswith(f"{table}.")]
        return f"; JSONB: {', '.join(columns)}" if columns else ""

    for name in schema.event_tables:
        steps.append((Step("keep", name, "Akka's journal table, not partitioned, key (persistence_id, seq_nr), "
                                         f"not altered{jsonb(name)}"), []))
    if schema.partitions > 1:
        steps.append((Step("create view", "event_journal",
                           f"read-only UNION ALL of the {schema.partitions} data partitions (writes go to "
                           "event_journal_<slice / (1024 / n)>)"), [_view_sql(schema)]))
    for table in ADOPTED_TABLES:
        if table.name == "event_journal":
            continue
        if table.name in schema.tables:
            detail = f"Akka's{jsonb('snapshot')}" if table.name == "snapshot" else "exists"
            steps.append((Step("keep", table.name, detail), []))
            continue
        if table.name == "snapshot" and "snapshot_0" in schema.tables:
            steps.append((Step("note", "snapshot_0..", "Akka's partitioned snapshots are not read: pgjournal keeps "
                                                     "its snapshots in its own snapshot table"), []))
        steps.append((Step("create table", table.name, f"pgjournal's (revisions up to {ADOPTED_REVISION})"),
                      dialect.create_table(table)))
    akka_only = sorted(t for t in schema.tables if t.startswith("akka_projection") or t.startswith("durable_state"))
    for name in akka_only:
        steps.append((Step("keep", name, "Akka's, untouched"), []))
    rows = [(EVENT_LAYOUT, AKKA_LAYOUT)] + ([(DATA_PARTITIONS, str(schema.partitions))] if schema.partitions > 1
                                           else [])
    steps.append((Step("record", FORMAT_TABLE, ", ".join(f"{n} = {v}" for n, v in rows)),
                  [f"INSERT INTO {FORMAT_TABLE} (name, value) VALUES ('{n}', '{v}')" for n, v in rows]))
    steps.append((Step("stamp", version_table, f"revision {ADOPTED_REVISION}"), [
        f"CREATE TABLE {version_table} (version_num VARCHAR(32) NOT NULL, "
        f"CONSTRAINT {version_table}_pkc PRIMARY KEY (version_num))",
        f"INSERT INTO {version_table} (version_num) VALUES ('{ADOPTED_REVISION}')"]))
    return steps


def adopt(conn: psycopg.Connection, schema: AkkaSchema, dialect: Dialect, version_table: str) -> list[Step]:
    """Run the adoption on ``conn`` in one transaction (all of it or nothing). The caller checked
    ``schema.problems`` is empty."""
    steps = adoption_steps(schema, dialect, version_table)
    with conn.transaction():
        for _, statements in steps:
            for statement in statements:
                conn.execute(statement.encode())  # DDL with constants only: no parameters
    return [step for step, _ in steps]
