"""Akka's standard serializers: their ids and bit-exact codecs for the payload bytes.

Ids from Akka's ``reference.conf`` (``akka.actor.serialization-identifiers``):

=====================  ====  ==================================================================
serializer             id    payload
=====================  ====  ==================================================================
ByteArraySerializer    4     the bytes as they are
primitive-long         18    8 bytes, two's complement, little-endian
primitive-int          19    4 bytes, two's complement, little-endian
primitive-string       20    UTF-8
primitive-bytestring   21    the bytes as they are
jackson-json           31    JSON text (gzip-compressed when Akka found it large)
jackson-cbor-264       32    CBOR (the id Akka 2.6.4 and earlier gave jackson-cbor)
jackson-cbor           33    CBOR
primitive-boolean      35    one byte: 1 true, 0 false
=====================  ====  ==================================================================

The primitive serializers have no manifest (Akka's ``includeManifest`` is false). Jackson's manifest is the
class name, ``#N`` appended when a Jackson migration gives the class a version (see :func:`split_manifest`).
Every ``decode_*`` raises ``ValueError`` (or a subclass) on a payload its serializer could not have written:
the registry turns that into a :class:`~pgjournal.errors.SerializationError` naming the row.
"""

from __future__ import annotations

import gzip
import io
import json
import struct
import zlib
from typing import Any

import cbor2
import msgspec

BYTES = 4
LONG = 18
INT = 19
STRING = 20
BYTESTRING = 21
JACKSON_JSON = 31
JACKSON_CBOR_264 = 32
JACKSON_CBOR = 33
BOOLEAN = 35

#: Every id pgjournal reads without help, with Akka's name for it.
NAMES: dict[int, str] = {
    BYTES: "bytes", LONG: "primitive-long", INT: "primitive-int", STRING: "primitive-string",
    BYTESTRING: "primitive-bytestring", JACKSON_JSON: "jackson-json", JACKSON_CBOR_264: "jackson-cbor-264",
    JACKSON_CBOR: "jackson-cbor", BOOLEAN: "primitive-boolean",
}
JACKSON_IDS = frozenset({JACKSON_JSON, JACKSON_CBOR_264, JACKSON_CBOR})
CBOR_IDS = frozenset({JACKSON_CBOR_264, JACKSON_CBOR})

LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
_LONG = struct.Struct("<q")
_INT = struct.Struct("<i")
_GZIP_MAGIC = b"\x1f\x8b"


# -- primitives -----------------------------------------------------------------------------------------


def encode_long(value: int) -> bytes:
    """Akka's ``LongSerializer.toBinary``: the low byte first, all 8 bytes always."""
    return _LONG.pack(value)


def decode_long(payload: bytes) -> int:
    if len(payload) != 8:
        raise ValueError(f"primitive-long needs exactly 8 bytes, got {len(payload)}")
    value: int = _LONG.unpack(payload)[0]
    return value


def encode_int(value: int) -> bytes:
    """Akka's ``IntSerializer.toBinary``: the low byte first, all 4 bytes always."""
    return _INT.pack(value)


def decode_int(payload: bytes) -> int:
    if len(payload) != 4:
        raise ValueError(f"primitive-int needs exactly 4 bytes, got {len(payload)}")
    value: int = _INT.unpack(payload)[0]
    return value


def encode_string(value: str) -> bytes:
    return value.encode("utf-8")


def decode_string(payload: bytes) -> str:
    """Strict UTF-8: Java would put U+FFFD where the bytes are broken; here broken bytes are an error."""
    return payload.decode("utf-8")


def encode_boolean(value: bool) -> bytes:
    return b"\x01" if value else b"\x00"


def decode_boolean(payload: bytes) -> bool:
    if payload == b"\x01":
        return True
    if payload == b"\x00":
        return False
    raise ValueError(f"primitive-boolean needs one byte 0x00 or 0x01, got {payload[:8].hex(' ') or 'no bytes'}")


# -- Jackson --------------------------------------------------------------------------------------------

#: ``read_json(payload)``: the JSON document that ``payload`` (bytes) is, by msgspec's parser: about three times
#: faster than ``json.loads`` (``python -m bench by-slices``). On what it accepts it gives what ``json.loads``
#: gives, integers of any size exact (tests/codec/test_json_reading.py). It refuses (raises one of
#: :data:`REFUSED`) what is not strict JSON in UTF-8, some of which ``json.loads`` accepts (``NaN``, a number out
#: of float range, a lone surrogate escape) and a gzip payload: :func:`decode_json` leaves those to ``json.loads``.
read_json = msgspec.json.Decoder().decode
REFUSED = (msgspec.DecodeError, ValueError, RecursionError)


def _gunzip(payload: bytes) -> bytes:
    """Akka's Jackson serializers gzip payloads above ``compress-larger-than`` (JSON: 32 KiB by default) and
    recognise them on read by the gzip magic bytes; no JSON or CBOR document can start with them."""
    if payload[:2] != _GZIP_MAGIC:
        return payload
    try:
        return gzip.decompress(payload)
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"gzip-compressed payload is broken: {exc}") from None


def decode_json(payload: bytes) -> Any:
    """The JSON document of a Jackson JSON payload, as ``json.loads`` reads it: the common case by
    :data:`read_json`, anything it refuses (gzip-compressed, not UTF-8, ``NaN``, invalid) through ``json.loads``
    for its value or its error."""
    try:
        return read_json(payload)
    except REFUSED:
        return json.loads(_gunzip(bytes(payload)).decode())


_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _c_encoder() -> Any:
    """The C accelerator of ``_JSON``, made once: ``JSONEncoder.encode`` builds one on every call, a large part
    of the time to encode a small event (``python -m bench append-cpu``). Without cycle detection (a cyclic value
    ends in RecursionError, which the serializer reports). ``None`` (use ``_JSON``) when the accelerator is
    missing or does not give exactly ``_JSON``'s output."""
    make = getattr(json.encoder, "c_make_encoder", None)
    quote = getattr(json.encoder, "c_encode_basestring", None)
    if make is None or quote is None:
        return None
    try:
        encoder = make(None, _JSON.default, quote, None, ":", ",", False, False, False)
        sample: Any = {"a": [1, -2.5, 1e300, "é\n\"\u2028", None, True, False], "b": {"c": -0.0, "": []}}
        if "".join(encoder(sample, 0)) != _JSON.encode(sample) or "".join(encoder("x", 0)) != '"x"':
            return None
        encoder(float("nan"), 0)
    except ValueError:  # NaN refused, as allow_nan=False requires
        return encoder
    except Exception:  # another signature in this Python: stay with the encoder object
        return None
    return None


_C_JSON = _c_encoder()


def encode_json(value: Any) -> bytes:
    """Compact UTF-8 JSON, never compressed (Spark reads the text as it is; Akka reads both)."""
    if _C_JSON is not None:
        return "".join(_C_JSON(value, 0)).encode()
    return _JSON.encode(value).encode()


def decode_cbor(payload: bytes) -> Any:
    """One CBOR data item and nothing after it."""
    data = _gunzip(bytes(payload))
    stream = io.BytesIO(data)
    try:
        value = cbor2.CBORDecoder(stream).decode()
    except cbor2.CBORDecodeError as exc:
        raise ValueError(f"not CBOR: {exc}") from None
    if stream.tell() != len(data):
        raise ValueError(f"not CBOR: {len(data) - stream.tell()} byte(s) after the first data item")
    return value


def encode_cbor(value: Any) -> bytes:
    try:
        return cbor2.dumps(value)
    except cbor2.CBOREncodeError as exc:
        raise TypeError(str(exc)) from None


def split_manifest(manifest: str) -> tuple[str, int]:
    """``"com.example.Added#3"`` -> ``("com.example.Added", 3)``; no ``#``: version 1 (as Jackson's
    ``parseManifest``: the text after the last ``#`` is the version)."""
    name, sep, version = manifest.rpartition("#")
    if not sep:
        return manifest, 1
    if not version.isdigit() or len(version) > 9:
        raise ValueError(f"manifest {manifest!r} ends in '#' plus {version!r}, expected a version number")
    return name, int(version)
