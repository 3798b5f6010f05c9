"""Poison events: envelopes a projection cannot decode or handle.

The runner reads with *lenient* serializers (:func:`lenient`, passed to its queries as ``serializers=``): a
payload that does not decode becomes an :class:`Undecodable` event instead of failing the query (which made
the range restart without end). The runner treats it like a handler failure: retried with backoff, then
``ProjectionSettings.on_failure`` applies — ``stop`` raises :class:`~projections.runner.ProjectionFailed`
naming projection, persistence id, sequence number, serializer id and manifest; ``dead-letter`` stores the
envelope in ``projection_dead_letter`` (payload kept) and goes on, in exactly-once and grouped modes in the
same transaction as the offset past it. With an encrypting journal the stored error is sealed with the
persistence id's key (:func:`stored_error`): a handler's message may quote the event, and crypto-shredding must
leave nothing of it readable.

:func:`retry_dead_letters` replays stored dead letters through a (fixed) handler and removes each that
succeeds. A replay runs after later events of the same persistence id were handled: handlers that depend on
per-entity order must tolerate that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from pgjournal.codec.transcoding import open_text, seal_text
from pgjournal.errors import SerializationError
from pgjournal.model.envelope import EventEnvelope, Source
from pgjournal.model.offsets import TimestampOffset
from pgjournal.model.slices import entity_type_of
from pgjournal.runtime.steps import Step, first_of, run
from pgjournal.store import dead_letters as sql
from pgjournal.store.dead_letters import DeadLetter as DeadLetter  # the row shape, part of this module's API
from pgjournal.validation import check_name

from .handlers import AtLeastOnce, ExactlyOnce, Grouped, Projection

if TYPE_CHECKING:
    import psycopg

    from pgjournal.codec.serialization import SerializerRegistry
    from pgjournal.core.journal_core import JournalCore
    from pgjournal.journal import Journal
    from pgjournal.state.keystore import KeyStore
    from pgjournal.store import Query as Statement


@dataclass(frozen=True)
class Undecodable:
    """The event (or metadata) of an envelope whose payload the serializers could not decode."""

    ser_id: int
    manifest: str
    payload: bytes = field(repr=False)
    error: SerializationError


class LenientSerializers:
    """Delegates to a registry; a payload that does not decode becomes an :class:`Undecodable`."""

    def __init__(self, inner: SerializerRegistry) -> None:
        self._inner = inner

    def deserialize(self, ser_id: int, manifest: str, payload: bytes, **where: Any) -> Any:
        try:
            return self._inner.deserialize(ser_id, manifest, payload, **where)
        except SerializationError as exc:
            return Undecodable(ser_id, manifest, bytes(payload), exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def lenient(journal: Journal) -> SerializerRegistry:
    """The journal's serializers, but a payload they cannot decode becomes an :class:`Undecodable` event instead
    of an error: for the ``serializers=`` of the queries a projection reads through. For reading only."""
    return cast("SerializerRegistry", LenientSerializers(journal.serializers))


def undecodable(env: EventEnvelope) -> Undecodable | None:
    """The envelope's event, else its metadata, when it did not decode (asked of every envelope handed out)."""
    if isinstance(env.event, Undecodable):
        return env.event
    if isinstance(env.metadata, Undecodable):
        return env.metadata
    return None


def decoded(journal: Journal, env: EventEnvelope) -> EventEnvelope:
    """``env`` with an :class:`Undecodable` event or metadata decoded again (a serializer may have been
    registered since), or :class:`~pgjournal.errors.SerializationError`."""
    if undecodable(env) is None:
        return env
    where = f" of {env.persistence_id!r} seq_nr {env.seq_nr}"
    parts = [journal.serializers.deserialize(p.ser_id, p.manifest, p.payload, where=where,
                                             persistence_id=env.persistence_id, seq_nr=env.seq_nr)
             if isinstance(p, Undecodable) else p for p in (env.event, env.metadata)]
    return replace(env, event=parts[0], metadata=parts[1])


def serializer_of(conn: psycopg.Connection, journal: Journal, env: EventEnvelope) -> tuple[int | None, str | None]:
    """The serializer id and manifest stored with the envelope's event (``None`` when it is gone)."""
    return run(serializer_of_step(journal, env), conn)


def serializer_of_step(journal: JournalCore, env: EventEnvelope) -> Step[tuple[int | None, str | None]]:
    """:func:`serializer_of` as a step (:mod:`pgjournal.runtime.steps`)."""
    bad = undecodable(env)
    if bad is not None:
        return bad.ser_id, bad.manifest
    stored = yield from first_of(sql.serializer(journal.events, env.persistence_id, env.seq_nr))
    return (stored.ser_id, stored.manifest) if stored else (None, None)


def store_dead_letter(conn: psycopg.Connection, journal: Journal, name: str, key: str, env: EventEnvelope,
                      error: BaseException) -> None:
    """Copy the envelope's journal row into ``projection_dead_letter`` (in the caller's transaction)."""
    conn.execute(*dead_letter_statement(journal, name, key, env, error))


def dead_letter_statement(journal: JournalCore, name: str, key: str, env: EventEnvelope, error: BaseException
                          ) -> tuple[str, Any]:
    """The statement of :func:`store_dead_letter`."""
    return sql.store(journal.events, name, key, env.persistence_id, env.seq_nr,
                     stored_error(journal, env.persistence_id, error))


def stored_error(journal: JournalCore, pid: str, error: BaseException) -> str:
    """``error`` as a dead letter keeps it. A handler's message may quote the event: when the journal encrypts,
    it is sealed with the persistence id's key (:func:`~pgjournal.codec.transcoding.seal_text`), so it is as unreadable
    as the payload to a role without the keys and gone when the key is shredded; with no key for the persistence
    id (shredded already, or an event written unencrypted) only the error's type is kept."""
    text = f"{type(error).__name__}: {error}"
    key_store = _key_store(journal)
    if key_store is None:
        return text
    sealed = seal_text(key_store, pid, text)
    return sealed if sealed is not None else f"{type(error).__name__} (message not kept: {pid!r} has no payload key)"


def _key_store(journal: JournalCore) -> KeyStore | None:
    transcoder = journal.serializers.transcoder
    return transcoder.key_store if transcoder is not None else None


def list_dead_letters(journal: Journal, name: str) -> list[DeadLetter]:
    """The dead letters of projection ``name``, by persistence id and sequence number; errors sealed with a
    persistence id's key are opened with the journal's key store (``<redacted: ...>`` once it is shredded)."""
    check_name(name, "projection name")
    with journal.connection() as conn:
        letters = sql.dead_letters(name).all(conn)
    key_store = _key_store(journal)
    return [replace(letter, error=open_text(key_store, letter.persistence_id, letter.error)) for letter in letters]


@dataclass(frozen=True)
class RetryOutcome:
    succeeded: list[tuple[str, int]]
    #: ``(persistence_id, seq_nr, error)`` of those that failed again (they stay, with the new error).
    failed: list[tuple[str, int, str]]


def retry_dead_letters(journal: Journal, projection: Projection) -> RetryOutcome:
    """Replay the dead letters of ``projection.name`` through its handler, once each; remove each that
    succeeds (exactly-once and grouped: in the handler's transaction). The event is read from the journal
    again (it may have been repaired), or decoded from the stored payload when the journal no longer has it."""
    succeeded: list[tuple[str, int]] = []
    failed: list[tuple[str, int, str]] = []
    for letter in list_dead_letters(journal, projection.name):
        try:
            env = _envelope(journal, letter)
            _handle(journal, projection, env, sql.delete(projection.name, letter.persistence_id, letter.seq_nr))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            with journal.connection() as conn:
                conn.execute(*sql.set_error(projection.name, letter.persistence_id, letter.seq_nr,
                                            stored_error(journal, letter.persistence_id, exc)))
            failed.append((letter.persistence_id, letter.seq_nr, error))
        else:
            succeeded.append((letter.persistence_id, letter.seq_nr))
    return RetryOutcome(succeeded, failed)


def _envelope(journal: Journal, letter: DeadLetter) -> EventEnvelope:
    found = list(journal.query.current_events_by_persistence_id(letter.persistence_id, letter.seq_nr,
                                                                letter.seq_nr))
    if found:
        return found[0]
    where = f" of {letter.persistence_id!r} seq_nr {letter.seq_nr}"
    event = journal.serializers.deserialize(letter.ser_id, letter.manifest, letter.payload, where=where,
                                            persistence_id=letter.persistence_id, seq_nr=letter.seq_nr)
    ts = letter.db_timestamp
    return EventEnvelope(letter.persistence_id, letter.seq_nr, letter.slice, entity_type_of(letter.persistence_id),
                         ts, TimestampOffset(ts, ts, {letter.persistence_id: letter.seq_nr}), event,
                         source=Source.BACKTRACKING)


def _handle(journal: Journal, projection: Projection, env: EventEnvelope, remove: Statement) -> None:
    """Handle ``env`` and run ``remove`` (the dead letter's delete) after it, in its transaction if it has one."""
    handler = projection.handler
    if isinstance(handler, AtLeastOnce):
        handler.handle(env)
        with journal.connection() as conn:
            conn.execute(*remove)
        return
    with journal.connection() as conn, conn.transaction():
        if isinstance(handler, ExactlyOnce):
            handler.handle(conn, env)
        else:
            assert isinstance(handler, Grouped)
            envs: Sequence[EventEnvelope] = [env]
            handler.handle(conn, envs)
        conn.execute(*remove)
