"""Lookups: timestamp_of, load_envelope and current_persistence_ids by entity type (Akka's timestampOf,
loadEnvelope and currentPersistenceIds(entityType, afterId, limit))."""

from __future__ import annotations

import pytest

from pgjournal import EventNotFound, InvalidArgument, InvalidPersistenceId, Journal, TimestampOffset


def test_timestamp_of_is_the_events_db_timestamp(journal: Journal) -> None:
    written = journal.append("Cart|1", ["a", "b"])
    assert journal.query.timestamp_of("Cart|1", 1) == written[0].db_timestamp
    assert journal.query.timestamp_of("Cart|1", 2) == written[1].db_timestamp
    assert journal.query.timestamp_of("Cart|1", 3) is None
    assert journal.query.timestamp_of("Cart|2", 1) is None
    journal.delete_events("Cart|1", 1)
    assert journal.query.timestamp_of("Cart|1", 1) is None  # deleted events are not there for readers


def test_load_envelope_returns_the_event(journal: Journal) -> None:
    journal.append("Cart|1", [{"added": "socks"}], tags=["t"], metadata={"by": "me"})
    env = journal.query.load_envelope("Cart|1", 1)
    assert (env.persistence_id, env.seq_nr, env.entity_type, env.event) == ("Cart|1", 1, "Cart", {"added": "socks"})
    assert env.tags == ("t",) and env.metadata == {"by": "me"}
    assert env.db_timestamp == journal.query.timestamp_of("Cart|1", 1)
    assert env.offset == TimestampOffset(env.db_timestamp, env.db_timestamp, {"Cart|1": 1})
    # the same envelope as the by-pid query delivers
    [same] = journal.query.current_events_by_persistence_id("Cart|1")
    assert (same.event, same.db_timestamp, same.slice) == (env.event, env.db_timestamp, env.slice)


def test_load_envelope_of_a_missing_or_deleted_event_is_a_typed_error(journal: Journal) -> None:
    journal.append("Cart|1", ["a", "b"])
    with pytest.raises(EventNotFound, match=r"sequence number 3 of persistence id 'Cart\|1'") as caught:
        journal.query.load_envelope("Cart|1", 3)
    assert (caught.value.persistence_id, caught.value.seq_nr) == ("Cart|1", 3)
    assert isinstance(caught.value, LookupError)
    journal.delete_events("Cart|1", 1)
    with pytest.raises(EventNotFound, match="sequence number 1 "):
        journal.query.load_envelope("Cart|1", 1)
    assert journal.query.load_envelope("Cart|1", 2).event == "b"


@pytest.mark.parametrize("call, error, text", [
    (lambda q: q.timestamp_of("", 1), InvalidPersistenceId, "must not be empty"),
    (lambda q: q.timestamp_of("Cart|1", 0), InvalidArgument, "seq_nr must be an integer from 1 .*got 0"),
    (lambda q: q.load_envelope("Cart|1", -1), InvalidArgument, "got -1"),
    (lambda q: q.load_envelope(7, 1), InvalidPersistenceId, "got int 7"),
    (lambda q: list(q.current_persistence_ids(entity_type="a\x00b")), InvalidArgument, "entity type"),
    (lambda q: list(q.current_persistence_ids(entity_type=3)), InvalidArgument, "entity type .*got 3"),
])
def test_lookups_refuse_bad_input(journal: Journal, call, error, text) -> None:
    with pytest.raises(error, match=text):
        call(journal.query)


def test_current_persistence_ids_by_entity_type_are_keyset_paged(dsn: str) -> None:
    with Journal.open(dsn, buffer_size=3) as journal:  # pages of 3: the limit and paging both matter
        carts = sorted(f"Cart|{i:02d}" for i in range(8))
        for pid in [*reversed(carts), "Cartoon|1", "Order|1", "plain", "other"]:
            journal.append(pid, ["x", "y"])  # two events each: every id must come once
        query = journal.query
        assert list(query.current_persistence_ids(entity_type="Cart", limit=None)) == carts
        assert list(query.current_persistence_ids(entity_type="Cart", limit=5)) == carts[:5]
        assert list(query.current_persistence_ids(after="Cart|03", limit=2, entity_type="Cart")) == carts[4:6]
        assert list(query.current_persistence_ids(entity_type="Order")) == ["Order|1"]
        assert list(query.current_persistence_ids(entity_type="")) == ["other", "plain"]  # ids without '|'
        assert list(query.current_persistence_ids(entity_type="Nope")) == []
        resumed, after = [], None
        while page := list(query.current_persistence_ids(after=after, limit=3, entity_type="Cart")):
            resumed += page
            after = page[-1]
        assert resumed == carts
        # the all-ids form is unchanged
        assert list(query.current_persistence_ids()) == sorted([*carts, "Cartoon|1", "Order|1", "plain", "other"])
        assert list(query.current_persistence_ids("Order|1", 1)) == ["other"]
