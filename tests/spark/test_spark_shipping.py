"""What Spark's tasks need to decode as the journal does, without a Spark session: a serializer registry (with
its transcoder and key store) pickled and unpickled as Spark does it, the modules sent by value, and the seams
the batch decoder relies on (``reads_as_stored``, ``as_data``, ``transcoding.encrypted``)."""

from __future__ import annotations

import os
import pickle
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from pgjournal import SerializerRegistry
from pgjournal.codec.transcoding import TRANSCODED_SER_ID, Redacted, Transcoder, encrypted
from pgjournal.errors import ConfigurationError
from pgjournal.state.keystore import InMemoryKeyStore, PostgresKeyStore

cloudpickle = pytest.importorskip("pyspark.cloudpickle")


@dataclass(frozen=True)
class Added:
    item: str
    quantity: int


def registry(transcoder: Transcoder | None = None) -> SerializerRegistry:
    reg = SerializerRegistry(transcoder=transcoder)
    reg.register(Added, "com.example.Added", version=2)
    reg.register_upcaster("com.example.Added", 1, lambda d: {**d, "quantity": 1})
    return reg


def test_a_registry_with_a_transcoder_and_in_memory_keys_pickles_as_a_copy() -> None:
    keys = InMemoryKeyStore()
    reg = registry(Transcoder(compression="zstd", compress_min_size=10, key_store=keys))
    stored = reg.serialize(Added("mug" * 20, 2), persistence_id="Cart|1")
    assert stored.ser_id == TRANSCODED_SER_ID and encrypted(stored.payload)
    copy = cloudpickle.loads(cloudpickle.dumps(reg))
    assert copy.deserialize(stored.ser_id, stored.manifest, stored.payload, persistence_id="Cart|1") == Added(
        "mug" * 20, 2)
    assert copy.deserialize(31, "com.example.Added", b'{"item":"v1"}') == Added("v1", 1)  # the upcaster came along
    # the copy writes too (its compressor is made anew), and it holds the keys of the moment it was pickled
    again = copy.serialize(Added("x" * 30, 3), persistence_id="Cart|2")
    assert reg.deserialize(again.ser_id, again.manifest, again.payload, persistence_id="Cart|2") is not None
    keys.delete_key("Cart|1")
    assert isinstance(reg.deserialize(stored.ser_id, stored.manifest, stored.payload, persistence_id="Cart|1"),
                      Redacted)
    assert copy.deserialize(stored.ser_id, stored.manifest, stored.payload, persistence_id="Cart|1") == Added(
        "mug" * 20, 2)
    # a compressed payload is not encrypted; a short or foreign one is neither
    zipped = SerializerRegistry(transcoder=Transcoder(compression="zlib", compress_min_size=1))
    plain = zipped.serialize({"a": "b" * 50})
    assert plain.ser_id == TRANSCODED_SER_ID and not encrypted(plain.payload)
    assert not encrypted(b"\x01\x04") and not encrypted(b'{"a": 1}')


def test_a_postgres_key_store_pickles_as_what_reopens_it_one_per_process(dsn: str) -> None:
    master = os.urandom(32)
    with PostgresKeyStore(dsn, master_key=master, cache_ttl=0) as keys:
        key = keys.create_key("Cart|1")
        copy = pickle.loads(pickle.dumps(keys))
        assert copy is not keys and copy.key("Cart|1") == key
        assert pickle.loads(pickle.dumps(keys)) is copy  # one store (one pool) per process for the same spec
        assert PostgresKeyStore.shared(dsn, master_key=master, cache_ttl=0) is copy
        assert PostgresKeyStore.shared(dsn, master_key=os.urandom(32), cache_ttl=0) is not copy
        keys.delete_key("Cart|1")
        assert copy.key("Cart|1") is None  # cache_ttl 0 travelled with it: the deletion is seen at once


def test_reads_as_stored_and_as_data() -> None:
    reg = registry()
    reg.register_upcaster("com.example.Plain", 1, lambda d: d)
    assert reg.reads_as_stored("") and reg.reads_as_stored("com.example.Other#4")
    assert reg.reads_as_stored("com.example.Odd#x")  # not a version suffix: read as it is
    for manifest in ("com.example.Added", "com.example.Added#1", "com.example.Plain", "com.example.Plain#2"):
        assert not reg.reads_as_stored(manifest), manifest
    assert reg.as_data(Added("a", 1)) == {"item": "a", "quantity": 1}
    assert reg.as_data({"x": 1}) == {"x": 1} and reg.as_data("text") == "text"

    @dataclass
    class Unregistered:
        n: int

    assert reg.as_data(Unregistered(3)) == {"n": 3}


def test_local_modules_go_by_value_installed_ones_by_name() -> None:
    from pgjournal.spark.shipping import local_modules, shipped

    assert local_modules(registry()) == [__name__]  # this test module; not pgjournal, not the standard library
    with pytest.raises(ConfigurationError, match="serializers must be a pgjournal SerializerRegistry, got dict"), \
            shipped({}, "test"):  # type: ignore[arg-type]
        pass
    unpicklable = SerializerRegistry()
    unpicklable.register_upcaster("com.example.Locked", 1, _Locked())
    with pytest.raises(ConfigurationError, match=r"cannot be sent to Spark's workers: pickling it failed"), \
            shipped(unpicklable, "test"):
        pass
    with shipped(registry(), "test"):
        assert __name__ in cloudpickle.list_registry_pickle_by_value()
        payload = cloudpickle.dumps(registry())
    assert __name__ not in cloudpickle.list_registry_pickle_by_value()
    module = sys.modules.pop(__name__)  # as on a worker that cannot import this module
    try:
        copy = cloudpickle.loads(payload)
    finally:
        sys.modules[__name__] = module
    assert copy.deserialize(31, "com.example.Added", b'{"item":"v1"}').quantity == 1


class _Locked:
    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def __call__(self, data: Any) -> Any:
        return data
