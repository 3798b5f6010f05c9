"""Array parameters packed in PostgreSQL's binary array format, for the batch append's payloads.

psycopg's list dumpers inspect and adapt every element in Python on each call, and a ``bytea[]`` in text
format is hex-escaped element by element, then parsed back by the server; a batch's payloads are most of
what its statement sends. :func:`bytea_array` packs them in one join, and the server reads them with
``array_recv`` as they are.
"""

from __future__ import annotations

import struct

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

BYTEA_OID = 17
BYTEA_ARRAY_OID = 1001
# One dimension, no NULL, element type, its length, lower bound 1.
_HEADER = struct.Struct("!iiIii")
_LENGTH = struct.Struct("!i")


class ByteaArray(bytes):
    """A ``bytea[]`` parameter already in PostgreSQL's binary array format: psycopg sends it as it is."""

    __slots__ = ()


class _ByteaArrayDumper(Dumper):
    format = Format.BINARY
    oid = BYTEA_ARRAY_OID

    def dump(self, obj: ByteaArray) -> bytes:
        return obj


# Global, so every connection knows it (pool, asyncio pool, a caller's transaction): the type is private to
# pgjournal, so the registration changes nothing else psycopg dumps.
psycopg.adapters.register_dumper(ByteaArray, _ByteaArrayDumper)


def bytea_array(items: list[bytes]) -> ByteaArray:
    """``items`` (bytes, none NULL) as one ``bytea[]`` parameter."""
    pack = _LENGTH.pack
    parts = [_HEADER.pack(1, 0, BYTEA_OID, len(items), 1)]
    for item in items:
        parts.append(pack(len(item)))
        parts.append(item)
    return ByteaArray(b"".join(parts))
