"""Payload transcoding: zstd/zlib compression and AES-GCM encryption with per-pid keys, crypto-shredding
(redacted envelopes in every reader), tampering, the PostgreSQL key store and bad settings."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from support import FAST
from support.eventually import eventually
from support.projection_handlers import FAST_PROJECTION
from support.tags import tags_written

from pgjournal import ConfigurationError, DecryptionError, Journal, SerializationError
from pgjournal.codec.serialization import SerializerRegistry
from pgjournal.codec.transcoding import TRANSCODED_SER_ID, Redacted, Transcoder, is_redacted
from pgjournal.projections.handlers import AtLeastOnce, Projection
from pgjournal.projections.runner import run_range
from pgjournal.state.keystore import AesGcmKeyWrapper, InMemoryKeyStore, PostgresKeyStore

pytestmark = pytest.mark.mode_independent

BIG = {"text": "lorem ipsum " * 100, "n": 1}  # compresses well


@dataclasses.dataclass
class Item:
    name: str
    qty: int


def registry(**kwargs: object) -> SerializerRegistry:
    reg = SerializerRegistry(transcoder=Transcoder(**kwargs))  # type: ignore[arg-type]
    reg.register(Item, "com.example.Item")
    return reg


@pytest.fixture
def keys() -> InMemoryKeyStore:
    return InMemoryKeyStore()


@pytest.fixture
def secret_journal(dsn: str, keys: InMemoryKeyStore) -> Iterator[Journal]:
    with Journal.open(dsn, serializers=registry(compression="zstd", key_store=keys), **FAST) as journal:
        yield journal


def stored(dsn: str, pid: str) -> list[tuple[int, str, bytes, int | None]]:
    with psycopg.connect(dsn) as conn:
        return [(s, m, bytes(p), ms) for s, m, p, ms in conn.execute(
            "SELECT event_ser_id, event_ser_manifest, event_payload, meta_ser_id FROM event_journal "
            "WHERE persistence_id = %s ORDER BY seq_nr", (pid,)).fetchall()]


@pytest.mark.parametrize("compression", ["zstd", "zlib"])
def test_compression_round_trip_and_plain_registries_read_it(dsn: str, compression: str) -> None:
    with Journal.open(dsn, serializers=registry(compression=compression), **FAST) as journal:
        journal.append("Doc|1", [BIG, {"small": 1}, Item("x", 2)])
        rows = stored(dsn, "Doc|1")
        assert rows[0][0] == TRANSCODED_SER_ID and len(rows[0][2]) < 200  # 1,200 bytes of JSON, compressed
        assert rows[1][0] == 31 and rows[1][2] == b'{"small":1}'  # too small to compress: stored as it was
        assert [e.event for e in journal.query.current_events_by_persistence_id("Doc|1")] == [
            BIG, {"small": 1}, Item("x", 2)]
    # No configuration is needed to read compressed (not encrypted) payloads.
    with Journal.open(dsn, **FAST) as plain:
        assert next(e.event for e in plain.query.current_events_by_persistence_id("Doc|1")) == BIG


def test_encryption_round_trip_through_every_reader(secret_journal: Journal, dsn: str) -> None:
    journal = secret_journal
    journal.append("Cart|1", [BIG, Item("apple", 3)], tags=["t"], metadata={"who": "alice"})
    journal.append("Cart|2", ["secret-string", 42])
    journal.save_snapshot("Cart|1", 2, {"items": ["apple"]})
    journal.durable_state.upsert("Cart|1", 1, {"state": "secret"})
    for ser_id, _manifest, payload, meta_id in stored(dsn, "Cart|1") + stored(dsn, "Cart|2"):
        assert ser_id == TRANSCODED_SER_ID and b"apple" not in payload and b"lorem" not in payload
        assert b"secret" not in payload and meta_id in (TRANSCODED_SER_ID, None)
    assert stored(dsn, "Cart|1")[0][3] == TRANSCODED_SER_ID  # metadata too
    assert stored(dsn, "Cart|1")[1][1] == "com.example.Item"  # the manifest stays readable
    by_pid = list(journal.query.current_events_by_persistence_id("Cart|1"))
    assert [e.event for e in by_pid] == [BIG, Item("apple", 3)] and by_pid[0].metadata == {"who": "alice"}
    assert not by_pid[0].redacted
    time.sleep(0.1)
    assert sorted(str(e.event) for e in journal.query.current_events_by_slices("Cart", 0, 1023)) == sorted(
        str(v) for v in [BIG, Item("apple", 3), "secret-string", 42])
    tags_written(journal)  # another journal reads the tag rows once this one's batched writer wrote them
    with Journal.open(dsn, serializers=journal.serializers, tag_eventual_consistency_delay=0.0, **FAST) as tagged:
        assert [e.event for e in tagged.query.current_events_by_tag("t")] == [BIG, Item("apple", 3)]
    assert journal.load_snapshot("Cart|1").snapshot == {"items": ["apple"]}  # type: ignore[union-attr]
    assert journal.durable_state.get("Cart|1").value == {"state": "secret"}  # type: ignore[union-attr]
    assert journal.query.load_envelope("Cart|2", 2).event == 42


def test_a_shredded_persistence_id_reads_as_redacted_everywhere(secret_journal: Journal, dsn: str,
                                                                keys: InMemoryKeyStore) -> None:
    journal = secret_journal
    journal.append("Cart|gone", [Item("a", 1), Item("b", 2)], tags=["t"])
    journal.append("Cart|kept", [Item("c", 3)], tags=["t"])
    journal.save_snapshot("Cart|gone", 2, {"items": 2})
    journal.durable_state.upsert("Cart|gone", 1, {"s": 1})
    assert keys.delete_key("Cart|gone") and not keys.delete_key("Cart|gone")
    by_pid = list(journal.query.current_events_by_persistence_id("Cart|gone"))
    assert [e.seq_nr for e in by_pid] == [1, 2] and all(e.redacted for e in by_pid)
    marker = by_pid[0].event
    assert isinstance(marker, Redacted) and is_redacted(marker)
    assert (marker.persistence_id, marker.seq_nr, marker.ser_id, marker.manifest) == ("Cart|gone", 1, 31,
                                                                                       "com.example.Item")
    time.sleep(0.1)
    sliced = {(e.persistence_id, e.seq_nr): e for e in journal.query.current_events_by_slices("Cart", 0, 1023)}
    assert set(sliced) == {("Cart|gone", 1), ("Cart|gone", 2), ("Cart|kept", 1)}
    assert sliced[("Cart|gone", 2)].redacted and sliced[("Cart|kept", 1)].event == Item("c", 3)
    tags_written(journal)
    with Journal.open(dsn, serializers=journal.serializers, tag_eventual_consistency_delay=0.0, **FAST) as tagged:
        tag_events = {e.persistence_id: e.event for e in tagged.query.current_events_by_tag("t")}
    assert is_redacted(tag_events["Cart|gone"]) and tag_events["Cart|kept"] == Item("c", 3)
    assert is_redacted(journal.load_snapshot("Cart|gone").snapshot)  # type: ignore[union-attr]
    assert is_redacted(journal.durable_state.get("Cart|gone").value)  # type: ignore[union-attr]
    assert journal.query.load_envelope("Cart|gone", 1).redacted
    # A projection gets the redacted envelopes, in order, and keeps going.
    seen: list[tuple[str, int, bool]] = []
    projection = Projection("shred", "Cart", AtLeastOnce(lambda env: seen.append(
        (env.persistence_id, env.seq_nr, env.redacted))), FAST_PROJECTION)
    runner = run_range(journal, projection, 0, 1023)
    try:
        eventually(lambda: len(seen) == 3, "the projection handled all three events")
    finally:
        runner.stop()
        runner.join(timeout=30)
    assert sorted(seen) == [("Cart|gone", 1, True), ("Cart|gone", 2, True), ("Cart|kept", 1, False)]
    # Writing again after shredding makes a new key: new events read, the old stay redacted.
    journal.append("Cart|gone", [Item("new", 9)])
    assert [e.redacted for e in journal.query.current_events_by_persistence_id("Cart|gone")] == [True, True, False]


def test_tampered_or_moved_ciphertext_is_a_decryption_error(secret_journal: Journal, dsn: str) -> None:
    journal = secret_journal
    journal.append("Cart|t", [Item("a", 1)])
    journal.append("Cart|u", [Item("b", 2)])
    with psycopg.connect(dsn, autocommit=True) as conn:  # flip one bit of the ciphertext
        conn.execute("UPDATE event_journal SET event_payload = set_byte(event_payload, 20, get_byte(event_payload, "
                     "20) # 1) WHERE persistence_id = 'Cart|t'")
    with pytest.raises(DecryptionError, match="Cart\\|t") as caught:
        list(journal.query.current_events_by_persistence_id("Cart|t"))
    assert caught.value.persistence_id == "Cart|t" and caught.value.seq_nr == 1
    with psycopg.connect(dsn, autocommit=True) as conn:  # the tag at the end
        conn.execute("UPDATE event_journal SET event_payload = set_byte(event_payload, length(event_payload) - 1, "
                     "get_byte(event_payload, length(event_payload) - 1) # 1) WHERE persistence_id = 'Cart|t'")
    with pytest.raises(DecryptionError, match="does not open it"):
        journal.query.load_envelope("Cart|t", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:  # Cart|u's ciphertext copied to Cart|t
        conn.execute("UPDATE event_journal SET event_payload = (SELECT event_payload FROM event_journal WHERE "
                     "persistence_id = 'Cart|u') WHERE persistence_id = 'Cart|t'")
    # Sealed with a key that is not Cart|t's: as unreadable as a shredded one, never Cart|u's data.
    assert journal.query.load_envelope("Cart|t", 1).redacted
    with psycopg.connect(dsn, autocommit=True) as conn:  # a header of a newer format
        conn.execute("UPDATE event_journal SET event_payload = set_byte(event_payload, 0, 9) "
                     "WHERE persistence_id = 'Cart|u'")
    with pytest.raises(SerializationError, match="unknown header"):
        journal.query.load_envelope("Cart|u", 1)


def test_encrypted_rows_without_a_key_store_fail_clearly(secret_journal: Journal, dsn: str) -> None:
    secret_journal.append("Cart|k", [Item("a", 1)])
    with Journal.open(dsn, **FAST) as plain, pytest.raises(SerializationError, match="payload of persistence id "
                                                                                      "'Cart\\|k' seq_nr 1 is "
                                                                                      "encrypted"):
        list(plain.query.current_events_by_persistence_id("Cart|k"))


def test_the_postgres_key_store_wraps_keys_shares_them_and_shreds(dsn: str) -> None:
    master = os.urandom(32)
    with PostgresKeyStore(dsn, master_key=master, cache_ttl=0) as one, \
            PostgresKeyStore(dsn, master_key=master, cache_ttl=0) as two:
        results: list[bytes] = []
        threads = [threading.Thread(target=lambda s=s: results.append(s.create_key("Cart|race")))
                   for s in (one, two, one, two)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 4 and len(set(results)) == 1 and two.key("Cart|race") == results[0]
        with psycopg.connect(dsn) as conn:
            wrapped = conn.execute("SELECT wrapped_key FROM pgjournal_payload_keys").fetchone()[0]  # type: ignore
        assert results[0] not in bytes(wrapped)  # never stored in the clear
        with Journal.open(dsn, serializers=registry(key_store=one), **FAST) as writer, \
                Journal.open(dsn, serializers=registry(key_store=two), **FAST) as reader:
            writer.append("Cart|pg", [Item("a", 1)])
            assert reader.query.load_envelope("Cart|pg", 1).event == Item("a", 1)
            assert two.delete_key("Cart|pg")
            assert writer.query.load_envelope("Cart|pg", 1).redacted  # the other store sees it gone (no cache)
    with PostgresKeyStore(dsn, master_key=os.urandom(32)) as wrong, pytest.raises(DecryptionError, match="master key"):
        wrong.key("Cart|race")


def test_the_key_cache_forgets_deleted_keys_at_once_in_its_own_process(dsn: str) -> None:
    with PostgresKeyStore(dsn, wrapper=AesGcmKeyWrapper(os.urandom(32)), cache_ttl=60) as store:
        key = store.create_key("Cart|c")
        assert store.key("Cart|c") == key
        assert store.delete_key("Cart|c")
        assert store.key("Cart|c") is None


@pytest.mark.parametrize(("make", "fragment"), [
    (lambda dsn: Transcoder(compression="lz4"), "compression must be one of zlib, zstd or None, got 'lz4'"),
    (lambda dsn: Transcoder(compress_min_size=-1), "compress_min_size must be an integer >= 0, got -1"),
    (lambda dsn: Transcoder(compression_level="max"), "compression_level must be an integer"),
    (lambda dsn: Transcoder(key_store=object()), "key_store must be a KeyStore"),
    (lambda dsn: SerializerRegistry(transcoder="zstd"), "transcoder must be a pgjournal.codec.transcoding.Transcoder"),
    (lambda dsn: PostgresKeyStore(dsn, master_key=b"short"), "master_key must be 32 bytes (AES-256), got 5 bytes"),
    (lambda dsn: PostgresKeyStore(dsn, master_key="x" * 32), "master_key must be 32 bytes (AES-256), got str"),
    (lambda dsn: PostgresKeyStore(dsn), "needs exactly one of master_key"),
    (lambda dsn: PostgresKeyStore(dsn, master_key=os.urandom(32), wrapper=AesGcmKeyWrapper(os.urandom(32))),
     "needs exactly one of master_key"),
    (lambda dsn: PostgresKeyStore(dsn, master_key=os.urandom(32), cache_ttl=-1), "cache_ttl must be"),
])
def test_bad_transcoding_settings(dsn: str, make: object, fragment: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make(dsn)  # type: ignore[operator]
    assert fragment in str(caught.value)


def test_encryption_needs_the_persistence_id(keys: InMemoryKeyStore) -> None:
    with pytest.raises(SerializationError, match="needs its persistence id"):
        registry(key_store=keys).serialize({"a": 1})
