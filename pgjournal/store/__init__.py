"""The store layer: SQL text, table names and row shapes, one module per concern. Everything above it (the
write path, queries, projections, Spark jobs) calls these instead of writing SQL of its own.

A store runs nothing: a statement is ``(sql, params)`` for the caller's connection, and a statement that
returns rows is a :class:`Read`, which also says how its rows decode (a dataclass whose fields are the
SELECT list, in order, next to the SELECT). ``Read.all`` / ``Read.one`` are the synchronous face; an asyncio
face runs the same ``sql``, ``params`` and ``row`` on an ``AsyncConnection``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from psycopg.rows import args_row, scalar_row

if TYPE_CHECKING:
    import psycopg
    from psycopg.rows import RowFactory

R = TypeVar("R")
Params = tuple[Any, ...] | dict[str, Any]
#: A statement and its parameters.
Query = tuple[str, Params]


@dataclass(frozen=True, slots=True)
class Read(Generic[R]):
    """A statement that returns rows, its parameters and how a row decodes (a psycopg row factory)."""

    sql: str
    params: Params
    row: RowFactory[R]

    def all(self, conn: psycopg.Connection[Any], *, prepare: bool | None = None) -> list[R]:
        with conn.cursor(row_factory=self.row) as cur:
            return cur.execute(self.sql, self.params, prepare=prepare).fetchall()

    def one(self, conn: psycopg.Connection[Any], *, prepare: bool | None = None) -> R | None:
        with conn.cursor(row_factory=self.row) as cur:
            return cur.execute(self.sql, self.params, prepare=prepare).fetchone()

    def stream(self, conn: psycopg.Connection[Any], name: str, itersize: int = 2000) -> Iterator[R]:
        """The rows through a server-side cursor called ``name``, in a transaction: for results too large to
        hold at once."""
        with conn.transaction(), conn.cursor(name, row_factory=self.row) as cur:
            cur.itersize = itersize
            cur.execute(self.sql, self.params)
            yield from cur


def rows(row_type: type[R], sql: str, params: Params = ()) -> Read[R]:
    """A :class:`Read` whose rows are ``row_type(*columns)`` (a dataclass with the SELECT list as fields)."""
    return Read(sql, params, args_row(row_type))


def scalars(sql: str, params: Params = ()) -> Read[Any]:
    """A :class:`Read` of one column: each row is its value."""
    return Read(sql, params, scalar_row)
