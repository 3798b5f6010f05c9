"""Upcasting: rows written by three versions of one event type (Jackson's ``Name#N`` manifests) read as the
current version through registered upcasters, on every read path; an unknown version is a typed error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from support import FAST
from support.upcasting import NAME, ItemAdded, ItemAddedV1, ItemAddedV2, registry_v

from pgjournal import Journal, SerializationError, SerializerRegistry

pytestmark = pytest.mark.mode_independent

TAGGED = dict(FAST, tag_bucket_size="Minute", tag_eventual_consistency_delay=0.05,
              tag_new_persistence_id_scan_timeout=0.1)


def first(stream: Any, count: int) -> list[Any]:
    out = []
    with stream:
        for env in stream:
            out.append(env)
            if len(out) == count:
                break
    return out


@pytest.fixture
def three_versions(dsn: str) -> str:
    """Three application versions appended one event each (tagged) and saved a durable state each."""
    for version, event in ((1, ItemAddedV1("socks")), (2, ItemAddedV2("mug")), (3, ItemAdded("hat", 4))):
        with Journal.open(dsn, serializers=registry_v(version), **TAGGED) as journal:
            journal.append("Cart|1", [event], tags=["cart"])
            journal.durable_state.upsert("Cart|1", version, event)
    return dsn


EXPECTED = [ItemAdded("socks", 1), ItemAdded("mug", 1), ItemAdded("hat", 4)]


def test_the_three_versions_are_stored_under_jackson_manifests(three_versions: str) -> None:
    with psycopg.connect(three_versions) as conn:
        rows = conn.execute("SELECT event_ser_manifest, convert_from(event_payload, 'UTF8') FROM event_journal "
                            "ORDER BY seq_nr").fetchall()
    assert rows == [(NAME, '{"name":"socks"}'), (f"{NAME}#2", '{"item":"mug"}'),
                    (f"{NAME}#3", '{"item":"hat","quantity":4}')]


def test_every_read_path_upcasts_to_the_current_version(three_versions: str) -> None:
    with Journal.open(three_versions, serializers=registry_v(3), **TAGGED) as journal:
        query = journal.query
        assert [e.event for e in query.current_events_by_persistence_id("Cart|1")] == EXPECTED
        assert [e.event for e in first(query.events_by_slices("Cart", 0, 1023), 3)] == EXPECTED
        assert [e.event for e in first(query.events_by_tag("cart"), 3)] == EXPECTED
        assert query.load_envelope("Cart|1", 1).event == EXPECTED[0]


def test_snapshots_and_durable_state_upcast_too(dsn: str) -> None:
    with Journal.open(dsn, serializers=registry_v(1), **FAST) as old:
        old.save_snapshot("Cart|1", 1, ItemAddedV1("socks"))
        old.durable_state.upsert("Cart|2", 1, ItemAddedV1("mug"))
    with Journal.open(dsn, serializers=registry_v(3), **FAST) as journal:
        snapshot = journal.load_snapshot("Cart|1")
        assert snapshot is not None and snapshot.snapshot == ItemAdded("socks", 1)
        state = journal.durable_state.get("Cart|2")
        assert state is not None and state.value == ItemAdded("mug", 1)


def test_a_newer_version_than_known_is_a_serialization_error_naming_it(three_versions: str) -> None:
    with Journal.open(three_versions, serializers=registry_v(3), **TAGGED) as journal:
        with journal.connection() as conn:
            conn.execute("UPDATE event_journal SET event_ser_manifest = %s WHERE seq_nr = 2", (f"{NAME}#7",))
        with pytest.raises(SerializationError) as caught:
            list(journal.query.current_events_by_persistence_id("Cart|1"))
    error = caught.value
    assert (error.persistence_id, error.seq_nr, error.manifest, error.ser_id) == ("Cart|1", 2, f"{NAME}#7", 31)
    assert "unknown version 7" in str(error) and "current version is 3" in str(error)
    assert "persistence id 'Cart|1' seq_nr 2" in str(error)


def test_a_version_without_a_path_to_the_current_one_is_a_serialization_error(three_versions: str) -> None:
    reg = SerializerRegistry()
    reg.register(ItemAdded, NAME, version=3)
    reg.register_upcaster(NAME, 2, lambda d: {**d, "quantity": 1})  # nothing from version 1
    with Journal.open(three_versions, serializers=reg, **TAGGED) as journal:
        assert [e.event for e in journal.query.current_events_by_persistence_id("Cart|1", 2)] == EXPECTED[1:]
        missing = r"unknown version 1 of 'com\.example\.ItemAdded': no upcaster from version 1 \(upcasters from " \
            r"versions 2, current version 3\)"
        with pytest.raises(SerializationError, match=missing):
            journal.query.load_envelope("Cart|1", 1)


def test_a_failing_upcaster_is_a_serialization_error_naming_the_step(three_versions: str) -> None:
    reg = SerializerRegistry()
    reg.register(ItemAdded, NAME, version=3)
    reg.register_upcaster(NAME, 1, lambda d: {"item": d["title"]})  # a bug: version 1 has no "title"
    reg.register_upcaster(NAME, 2, lambda d: {**d, "quantity": 1})
    failed = r"upcaster from version 1 of 'com\.example\.ItemAdded' failed on version 1 data: KeyError: 'title'"
    with Journal.open(three_versions, serializers=reg, **TAGGED) as journal, \
            pytest.raises(SerializationError, match=failed) as caught:
        journal.query.load_envelope("Cart|1", 1)
    assert caught.value.seq_nr == 1


def test_upcasters_of_a_manifest_read_as_plain_data() -> None:
    """No type registered: the current version is the one after the highest upcaster; data stays a dict."""
    reg = SerializerRegistry()
    reg.register_upcaster("com.example.Legacy", 1, lambda d: {"v": 2, **d})
    reg.register_upcaster("com.example.Legacy", 2, lambda d: {**d, "v": 3})
    assert reg.deserialize(31, "com.example.Legacy", b'{"a":1}') == {"v": 3, "a": 1}
    assert reg.deserialize(31, "com.example.Legacy#2", b'{"a":1}') == {"a": 1, "v": 3}
    assert reg.deserialize(31, "com.example.Legacy#3", b'{"a":1}') == {"a": 1}
    with pytest.raises(SerializationError, match="unknown version 4"):
        reg.deserialize(31, "com.example.Legacy#4", b'{"a":1}')
    assert reg.deserialize(31, "com.example.Other#4", b'{"a":1}') == {"a": 1}  # no upcasters: as it is


def _dup(reg: SerializerRegistry) -> None:
    reg.register_upcaster(NAME, 1, lambda d: d)
    reg.register_upcaster(NAME, 1, lambda d: d)


def _unversioned_type(reg: SerializerRegistry) -> None:
    reg.register(ItemAdded, NAME)
    reg.register_upcaster(NAME, 1, lambda d: d)


def _past_current(reg: SerializerRegistry) -> None:
    reg.register(ItemAdded, NAME, version=3)
    reg.register_upcaster(NAME, 3, lambda d: d)


def _type_after_upcasters(reg: SerializerRegistry) -> None:
    reg.register_upcaster(NAME, 1, lambda d: d)
    reg.register_upcaster(NAME, 2, lambda d: d)
    reg.register(ItemAdded, NAME, version=2)


def _both_ways(reg: SerializerRegistry) -> None:
    reg.register(ItemAdded, NAME, version=3, upcast=lambda d, v: d)
    reg.register_upcaster(NAME, 1, lambda d: d)


@pytest.mark.parametrize("register, text", [
    (lambda r: r.register_upcaster(f"{NAME}#1", 1, lambda d: d), "without '#'"),
    (lambda r: r.register_upcaster("", 1, lambda d: d), "non-empty class name"),
    (lambda r: r.register_upcaster(NAME, 0, lambda d: d), "from_version must be a positive int, got 0"),
    (lambda r: r.register_upcaster(NAME, True, lambda d: d), "got True"),
    (lambda r: r.register_upcaster(NAME, "1", lambda d: d), "got '1'"),
    (lambda r: r.register_upcaster(NAME, 1, "not a function"), "must be callable, got str"),
    (_dup, "already has an upcaster from version 1"),
    (_unversioned_type, r"goes past the version ItemAdded is registered with \(None\)"),
    (_past_current, r"upcaster from version 3 .* goes past the version ItemAdded is registered with \(3\)"),
    (_type_after_upcasters, "needs version= of at least 3 .got 2"),
    (_both_ways, "either that or register_upcaster"),
])
def test_bad_registrations_are_refused(register: Callable[[SerializerRegistry], None], text: str) -> None:
    with pytest.raises(SerializationError, match=text):
        register(SerializerRegistry())
