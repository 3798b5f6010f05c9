"""The four journal faces offer what :mod:`pgjournal.faces` declares: ``Journal`` and ``ShardedJournal`` the
blocking protocols, ``AsyncJournal`` and ``AsyncShardedJournal`` the asyncio ones, each operation with the
protocol's parameters (names, kinds, defaults), awaited exactly where the protocol awaits. An operation a face
offers beyond its protocol is named here with the reason, so one added to a face and not to the others fails
until it is declared (or listed as what only that kind of journal has). Every public method has a docstring.
Read from the classes: no database."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from pgjournal import faces
from pgjournal.aio.durable_state import AsyncDurableStateStore
from pgjournal.aio.journal import AsyncJournal
from pgjournal.aio.query import AsyncQuery
from pgjournal.core.journal_core import BlockingCore, JournalCore
from pgjournal.journal import Journal
from pgjournal.query import Query
from pgjournal.shards.aio import AsyncShardedDurableState, AsyncShardedJournal, AsyncShardedQuery
from pgjournal.shards.journal import ShardedDurableState, ShardedJournal, ShardedQuery
from pgjournal.shards.routed import RoutedDurableState, RoutedJournal, RoutedParts
from pgjournal.shards.routing import Routed
from pgjournal.state.durable_state import DurableStateRules, DurableStateStore

pytestmark = pytest.mark.mode_independent

#: protocol → the faces that implement it
FACES: dict[type, tuple[type, ...]] = {
    faces.JournalFace: (Journal, ShardedJournal),
    faces.AsyncJournalFace: (AsyncJournal, AsyncShardedJournal),
    faces.Reads: (Query, ShardedQuery),
    faces.AsyncReads: (AsyncQuery, AsyncShardedQuery),
    faces.DurableStates: (DurableStateStore, ShardedDurableState),
    faces.AsyncDurableStates: (AsyncDurableStateStore, AsyncShardedDurableState),
}
#: what a face shares with its twin through a base class (the shared rules): not a face operation
SHARED_BASES = (JournalCore, BlockingCore, Routed, RoutedJournal, RoutedParts, RoutedDurableState, DurableStateRules)

#: what only one kind of journal offers, and why
ONE_DATABASE = {
    # a database's own connections and transactions, the steps and live loop run on them
    "connection", "read_connection", "open_connection", "run", "run_on_primary", "transaction", "live_query",
    # the tag view, which a sharded journal does not merge across databases
    "current_events_by_tag", "events_by_tag",
}
SHARDED = {
    # the layout and the database of a persistence id or a range
    "check_layout", "journal_for", "journal_for_slices", "ranges_within", "shards", "journals", "layout",
}
EXTRA: dict[type, set[str]] = {
    Journal: ONE_DATABASE, AsyncJournal: ONE_DATABASE, Query: ONE_DATABASE, AsyncQuery: ONE_DATABASE,
    ShardedJournal: SHARDED, AsyncShardedJournal: SHARDED,
}
#: ``open`` is each face's constructor: one database's takes a DSN, a sharded journal's its shards
CONSTRUCTORS = {"open"}


def protocol_members(protocol: type) -> dict[str, Any]:
    return {name: value for name, value in vars(protocol).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


def face_members(face: type) -> set[str]:
    """The public names a face defines itself (not through a shared base), ``query`` and ``durable_state``
    (set in ``__init__``) included."""
    own = {name for klass in face.__mro__ if klass is not object and klass not in SHARED_BASES
           and klass.__module__.startswith("pgjournal") for name in vars(klass)}
    own |= {name for name in ("query", "durable_state") if f"self.{name} =" in inspect.getsource(face.__init__)}
    return {name for name in own if not name.startswith("_") and name not in CONSTRUCTORS}


def shape(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def cases() -> list[tuple[type, type]]:
    return [(protocol, face) for protocol, implementing in FACES.items() for face in implementing]


@pytest.mark.parametrize(("protocol", "face"), cases(), ids=lambda c: c.__name__)
def test_a_face_offers_its_protocol_with_the_same_parameters(protocol: type, face: type) -> None:
    for name, declared in protocol_members(protocol).items():
        if isinstance(declared, property):
            assert name in face_members(face), f"{face.__name__} has no {name}"
            continue
        offered = inspect.getattr_static(face, name, None)
        assert offered is not None, f"{face.__name__} has no {name}() ({protocol.__name__} declares it)"
        assert shape(offered) == shape(declared), f"{face.__name__}.{name}: not the parameters of {protocol.__name__}"
        assert inspect.iscoroutinefunction(offered) == inspect.iscoroutinefunction(declared), (
            f"{face.__name__}.{name} is {'' if inspect.iscoroutinefunction(offered) else 'not '}awaited; "
            f"{protocol.__name__}.{name} is {'' if inspect.iscoroutinefunction(declared) else 'not '}")


@pytest.mark.parametrize(("protocol", "face"), cases(), ids=lambda c: c.__name__)
def test_a_face_offers_nothing_its_twins_do_not_unless_named_here(protocol: type, face: type) -> None:
    extra = face_members(face) - set(protocol_members(protocol)) - EXTRA.get(face, set())
    assert extra == set(), (f"{face.__name__} offers {sorted(extra)} beyond {protocol.__name__}: declare it on the "
                            f"protocol (and give it to every face), or name here why only this face has it")


@pytest.mark.parametrize("face", sorted({face for faces_ in FACES.values() for face in faces_},
                                        key=lambda f: f.__name__), ids=lambda f: f.__name__)
def test_every_face_method_has_a_docstring(face: type) -> None:
    missing = [name for name in sorted(face_members(face) | CONSTRUCTORS)
               if callable(inspect.getattr_static(face, name, None))
               and not (inspect.getdoc(getattr(face, name)) or "").strip()]
    assert missing == [], f"{face.__name__}: no docstring on {missing}"
