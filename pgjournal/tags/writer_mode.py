"""Which tag writer a database's tag view is written by, recorded in ``tag_settings`` beside the bucket size.

The two writers must not share a database: an in-statement tagged append (:mod:`pgjournal.tags.statement_writer`) moves
``tag_write_progress`` past a batched event (:mod:`pgjournal.write.tag_batcher`) whose tag rows are still pending,
and that event would never get its row. So the first tagged write records its journal's
``tag_batch_writer`` setting in the database (in the same transaction as the in-statement append, before the
batched writer's first row), and a journal with the other setting is refused: when it opens, and again before
its own first tagged write (a journal that opened before the mode was recorded). Readers are checked too, as
for the bucket size: every process of a database uses one setting.

A journal opened without the setting (``tag_batch_writer=None``, the default) follows what the database records;
with nothing recorded it takes the batched writer, unless tag rows exist and no batched writer has a row: those
were written by a version that recorded nothing, whose only default was the in-statement writer, so the journal
stays with it (:func:`resolve_mode_step`).

Changing it: stop every writer, then ``pgjournal tags writer --set batched|in-statement`` (refused while a
batched writer still owes tag rows).
"""

from __future__ import annotations

import psycopg

from pgjournal.errors import ConfigurationError
from pgjournal.runtime.steps import Step, first_of, rows_of, run, statement
from pgjournal.server.connections import connect, unreachable
from pgjournal.server.dsn import resolve_dsn
from pgjournal.store import format as sql
from pgjournal.store import tags

SETTING = "tag_writer"
BATCHED = "batched"
IN_STATEMENT = "in-statement"
MODES = (BATCHED, IN_STATEMENT)


def recorded_mode(dsn: str | None) -> str | None:
    """The tag writer recorded in the database at ``dsn`` (None: none yet, or no tag settings table)."""
    resolved = resolve_dsn(dsn)
    try:
        with connect(resolved) as conn:
            return run(first_of(sql.tag_setting(SETTING)), conn)  # type: ignore[no-any-return]
    except psycopg.errors.UndefinedTable:
        return None
    except psycopg.OperationalError as exc:  # lost after connecting
        raise unreachable(resolved, exc) from None


def mode_of(batched: bool) -> str:
    """The recorded value for a journal's ``tag_batch_writer`` setting."""
    return BATCHED if batched else IN_STATEMENT


def _mismatch(recorded: str, batched: bool) -> ConfigurationError:
    want = "True" if recorded == BATCHED else "False"
    return ConfigurationError(
        f"tag_batch_writer is {batched} but this database's tag view is written by {recorded} tag writers "
        f"(tag_settings {SETTING!r} = {recorded!r}): the two writers cannot share a database (an in-statement "
        f"tagged append would leave batched events without tag rows); set tag_batch_writer={want} in every "
        f"process, or stop every writer and run `pgjournal tags writer --set {mode_of(batched)}`")


def check_mode_step(batched: bool) -> Step[None]:
    """Raise :class:`ConfigurationError` when the other tag writer is recorded (nothing recorded: fine)."""
    recorded = yield from first_of(sql.tag_setting(SETTING))
    if recorded is not None and recorded != mode_of(batched):
        raise _mismatch(recorded, batched)


def resolve_mode_step(batched: bool | None) -> Step[bool]:
    """What a journal opening with ``tag_batch_writer=batched`` uses: the setting when it agrees with what is
    recorded (else :class:`ConfigurationError`); None: the recorded writer, else the one the tag rows imply."""
    recorded = yield from first_of(sql.tag_setting(SETTING))
    if batched is None:
        if recorded is None:
            recorded = yield from first_of(tags.unrecorded_writer())
        return bool(recorded == BATCHED)
    if recorded is not None and recorded != mode_of(batched):
        raise _mismatch(recorded, batched)
    return batched


def ensure_mode_step(batched: bool) -> Step[None]:
    """Record this journal's tag writer unless one is recorded, then check it (run in the transaction of the
    first tagged write: a concurrent first write of the other writer waits for it and is refused)."""
    yield statement(sql.record_tag_setting(SETTING, mode_of(batched)))
    yield from check_mode_step(batched)


def set_mode_step(mode: str) -> Step[str | None]:
    """Record ``mode`` (:data:`MODES`) whatever was recorded; returns the previous one. The caller makes sure
    no writer runs; switching to in-statement is refused while batched writers still owe rows."""
    if mode not in MODES:
        raise ConfigurationError(f"tag writer must be one of {', '.join(MODES)}, got {mode!r}")
    previous = yield from first_of(sql.tag_setting(SETTING))
    if mode == IN_STATEMENT and previous == BATCHED:
        owing = len((yield from rows_of(tags.batch_writers())))
        if owing:
            raise ConfigurationError(
                f"{owing} batched tag writer(s) still have a row in tag_batch_writers (running, or owing tag rows): "
                "close them, or run `pgjournal tags recover --silent-for 0` once they are stopped, then switch")
    yield statement(sql.set_tag_setting(SETTING, mode))
    return previous  # type: ignore[no-any-return]
