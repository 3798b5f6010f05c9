"""Events a custom serializer stores as given (manifest and payload bytes), and a batch of them with every awkward
value the batch statement's array parameters must carry unchanged (``tests/write``, ``tests/aio``)."""

from __future__ import annotations

import psycopg

from pgjournal import SerializerRegistry

RAW_SER_ID = 4242


class Raw:
    """An event that a custom serializer stores as given: its manifest and payload bytes."""

    def __init__(self, manifest: str, payload: bytes) -> None:
        self.manifest, self.payload = manifest, payload


class RawSerializer:
    def to_binary(self, obj: Raw) -> tuple[str, bytes]:
        return obj.manifest, obj.payload

    def from_binary(self, payload: bytes, manifest: str) -> Raw:
        return Raw(manifest, bytes(payload))


#: A batch's events, as ``(ser_id, manifest, payload)`` stored: the batch statement takes them as three array
#: parameters (payloads in binary array form), so every byte value, empty payloads, array-literal characters
#: and non-ASCII manifests must arrive unchanged and in order.
MIXED_BATCH = [Raw('say "hi"', bytes(range(256))), Raw("back\\slash", b""), "text", Raw("{braces,comma}", b"\x00"),
               7, Raw("NULL", b"\\x00\""), Raw("", b"{}"), Raw("ünï 日", b"\xff" * 70_000), b"\x00\x01"]


def stored_batch(dsn: str, pid: str) -> list[tuple[int, str, bytes]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute("SELECT event_ser_id, event_ser_manifest, event_payload FROM event_journal "
                            "WHERE persistence_id = %s ORDER BY seq_nr", (pid,)).fetchall()


def expected_batch(registry: SerializerRegistry, batch: list[object]) -> list[tuple[int, str, bytes]]:
    """The ``(ser_id, manifest, payload)`` rows of ``batch``, in order."""
    return [(s.ser_id, s.manifest, s.payload) for s in map(registry.serialize, batch)]


def raw_registry() -> SerializerRegistry:
    registry = SerializerRegistry()
    registry.register_serializer(RAW_SER_ID, RawSerializer(), Raw)
    return registry
