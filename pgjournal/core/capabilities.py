"""What this journal may use on this server, as this role: resolved once when a journal opens.

Every reader (events_by_slices, events_by_tag, projections through them, the Spark incremental load) takes
its horizon and wake-ups from the same :class:`Capabilities`, so no two of them can disagree about whether
a bound is safe.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from pgjournal.dialects import get_dialect
from pgjournal.runtime.steps import Step, first_of, rows_of, run
from pgjournal.settings import Settings
from pgjournal.store import catalog


@dataclass(frozen=True)
class Capabilities:
    #: Writers NOTIFY after commit and live queries LISTEN.
    notify: bool
    #: The visibility horizon comes from journal writers' locks (PostgreSQL, not portable); else the clock.
    writer_horizon: bool
    #: Other roles' transaction starts are visible, so a horizon needs no waiting (see pgjournal.core.horizon).
    sees_all_sessions: bool
    #: ``event_journal`` and its partitions (OIDs), for the writer-lock view.
    journal_relations: tuple[int, ...]
    #: Seconds by-slice reads stay behind the clock besides the horizon.
    read_margin: float
    #: A journal writer open longer is reported; in portable mode, backtracking's reach behind the clock.
    longest_transaction: float
    #: The role the journal connects as.
    role: str = ""
    #: ``durable_state`` (OID): durable state changes take their horizon from its writers instead.
    state_relations: tuple[int, ...] = ()
    #: The server is in recovery (a hot standby, ``pg_is_in_recovery()``; PostgreSQL only): its ``pg_locks``
    #: show none of the primary's writers.
    in_recovery: bool = False

    @classmethod
    def resolve(cls, conn: psycopg.Connection, settings: Settings) -> Capabilities:
        return run(cls.resolve_step(settings), conn)

    @classmethod
    def resolve_step(cls, settings: Settings) -> Step[Capabilities]:
        """:meth:`resolve` as a step (:mod:`pgjournal.runtime.steps`): the same rules on a blocking or an asyncio
        connection."""
        dialect = get_dialect(settings.dialect)
        writer_horizon = not settings.portable and dialect.supports_visibility_horizon
        role, sees_all = "", False
        relations: tuple[int, ...] = ()
        state_relations: tuple[int, ...] = ()
        if writer_horizon:
            found = yield from first_of(catalog.role())
            role, sees_all = (found.name, found.sees_all_sessions) if found else ("", False)
            relations = tuple(oid for oid in (yield from rows_of(catalog.journal_relations())) if oid is not None)
            state_relations = tuple(oid for oid in (yield from rows_of(catalog.state_relations()))
                                    if oid is not None)
        in_recovery = False
        if dialect.supports_visibility_horizon:
            replayed = yield from first_of(catalog.replayed())
            in_recovery = bool(replayed and replayed.recovering)
        return cls(
            notify=settings.uses_notifications,
            writer_horizon=writer_horizon and bool(relations),
            sees_all_sessions=sees_all,
            journal_relations=relations,
            read_margin=settings.horizon_margin if writer_horizon else settings.behind_current_time,
            longest_transaction=settings.backtracking_behind_current_time,
            role=role,
            state_relations=state_relations,
            in_recovery=in_recovery,
        )

    def describe(self) -> str:
        """One line for ``pgjournal info`` and logs."""
        notify = "on" if self.notify else "off"
        if not self.writer_horizon:
            return f"clock horizon ({self.read_margin:g} s behind), backtracking; notify {notify}"
        seen = "all sessions visible" if self.sees_all_sessions else "other roles' writers waited out"
        return f"writer-lock horizon ({seen}); notify {notify}"
