"""``pgjournal state ...``: the durable state store (Akka's ``durable_state``) from the command line."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from pgjournal.cli.groups import group_help
from pgjournal.cli.support import DsnOption, console, fail, open_journal, parse_json, reported, shown
from pgjournal.codec.transcoding import Redacted
from pgjournal.model.offsets import format_timestamp, parse_offset
from pgjournal.model.printable import json_printable
from pgjournal.model.slices import parse_slice_range
from pgjournal.state.durable_state import DurableState

state_app = typer.Typer(help=group_help("state"), no_args_is_help=True)

RevisionOption = Annotated[int | None, typer.Option(
    "--revision", min=1, help="The revision to write: the current one + 1 (default: read the current one and add 1; "
                              "give it to make the write fail if someone else wrote meanwhile).")]


def _value(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, Redacted):
        return {"$redacted": value.reason}
    return value


def _record(state: DurableState) -> dict[str, Any]:
    return {"pid": state.persistence_id, "revision": state.revision, "deleted": state.deleted,
            "timestamp": format_timestamp(state.db_timestamp), "tags": list(state.tags), "value": _value(state.value)}


def _show(state: DurableState, verb: str) -> None:
    table = Table("persistence id", "revision", "db timestamp", "tags", title=f"durable state {verb}")
    table.add_row(shown(state.persistence_id), str(state.revision), format_timestamp(state.db_timestamp),
                  shown(", ".join(state.tags)) or "-")
    console.print(table)


@state_app.command("get")
def state_get(
    persistence_id: Annotated[str, typer.Argument(help="For example Cart|42.")],
    dsn: DsnOption = None,
) -> None:
    """Print a persistence id's current state as one JSON line (revision, deleted, timestamp, tags, value);
    exit 1 when it has none."""
    with open_journal(dsn) as journal:
        state = journal.durable_state.get(persistence_id)
    if state is None:
        fail(f"persistence id {persistence_id!r} has no durable state")
        return
    sys.stdout.write(json_printable(json.dumps(_record(state), default=str, ensure_ascii=False)) + "\n")


def _next_revision(journal: Any, persistence_id: str, revision: int | None) -> int:
    if revision is not None:
        return revision
    current = journal.durable_state.get(persistence_id)
    return 1 if current is None else current.revision + 1


@state_app.command("put")
def state_put(
    persistence_id: Annotated[str, typer.Argument(help="For example Cart|42 (entity type Cart).")],
    value: Annotated[str, typer.Argument(help="The new state as JSON.")],
    revision: RevisionOption = None,
    tag: Annotated[str | None, typer.Option(help="A tag stored with the state (Akka's durable state tag).")] = None,
    dsn: DsnOption = None,
) -> None:
    """Write a new state (JSON) at the next revision."""
    decoded = parse_json(value, "the state")
    with open_journal(dsn) as journal:
        state = journal.durable_state.upsert(persistence_id, _next_revision(journal, persistence_id, revision),
                                             decoded, tag)
    _show(state, "written")


@state_app.command("delete")
def state_delete(
    persistence_id: str,
    revision: RevisionOption = None,
    dsn: DsnOption = None,
) -> None:
    """Mark a persistence id's state deleted at the next revision (readers of the changes see the deletion; a
    later put continues after it)."""
    with open_journal(dsn) as journal:
        state = journal.durable_state.delete(persistence_id, _next_revision(journal, persistence_id, revision))
    _show(state, "deleted")


@state_app.command("changes")
def state_changes(
    entity_type: Annotated[str, typer.Argument(help="Entity type (the text before | in persistence ids).")],
    slices_range: Annotated[str, typer.Option("--slices", help="Slice range, e.g. 0-255.")] = "0-1023",
    from_offset: Annotated[str | None, typer.Option("--from", help="Offset string or ISO timestamp.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep waiting for new changes.")] = False,
    dsn: DsnOption = None,
) -> None:
    """Print the changed states of a slice range as JSON lines, each with the offset to resume from (each
    persistence id's latest revision; a revision overwritten before it was read is not seen)."""
    with reported():
        lo, hi = parse_slice_range(slices_range)
        offset = parse_offset(from_offset or "")
    with open_journal(dsn) as journal, reported():
        store = journal.durable_state
        stream = (store.changes_by_slices if follow else store.current_changes_by_slices)(entity_type, lo, hi, offset)
        try:
            for change in stream:
                record = {"pid": change.persistence_id, "revision": change.revision, "slice": change.slice,
                          "deleted": change.deleted, "timestamp": format_timestamp(change.db_timestamp),
                          "value": _value(change.value), "offset": str(change.offset)}
                sys.stdout.write(json_printable(json.dumps(record, default=str, ensure_ascii=False)) + "\n")
                sys.stdout.flush()
        except KeyboardInterrupt:
            pass
