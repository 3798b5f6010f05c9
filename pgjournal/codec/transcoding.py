"""Payload transcoding: optional compression (zstd, zlib) and AES-256-GCM encryption with a key per persistence id.

A :class:`Transcoder` given to the :class:`~pgjournal.codec.serialization.SerializerRegistry` wraps what a serializer
wrote (event, metadata, snapshot and durable state payloads) before it is stored, and unwraps it on every
read. Keys come from a :class:`~pgjournal.state.keystore.KeyStore`, one per persistence id: deleting a persistence id's
key makes its payloads unreadable for good (*crypto-shredding*), and readers then deliver them as
:class:`Redacted` values instead of failing.

How a row says it was transcoded
--------------------------------
A transcoded row has ``ser_id`` :data:`TRANSCODED_SER_ID` (1347048515, the ASCII bytes ``PJTC``) and keeps its
serializer's manifest as it was (upcasting by manifest version, Spark's manifest filters and operators reading
the table still see the type). The payload starts with a header that records the rest::

    byte 0       format version (1)
    byte 1       flags: bits 0-1 compression (0 none, 1 zlib, 2 zstd), bit 2 AES-256-GCM
    bytes 2-5    the serializer's own ser_id (big-endian int32)
    bytes 6-9    encrypted payloads only: the key's check value (4 bytes of SHA-256 over the key)
    bytes 10-21  encrypted payloads only: the AES-GCM nonce
    the rest     the body: compressed and/or encrypted (ciphertext followed by the 16-byte tag)

The check value tells "this is not the key the payload was sealed with" (the persistence id's key was
shredded, then a new one made by a later write) from "this key does not open the payload" (tampering).

Why a ser_id of our own and not a manifest suffix: a reader that does not know it (Akka, an older pgjournal)
fails with "unknown serializer id" instead of handing compressed or encrypted bytes to its JSON reader, and
manifests (which may already be 255 characters) stay untouched. Akka cannot read these payloads in any case.

The encryption binds each ciphertext to its persistence id and header (AES-GCM associated data), so a payload
copied to another persistence id, or a changed header, fails authentication. It does not bind the sequence
number (the database assigns it after the payload is sealed): payloads swapped between events of the same
persistence id are not detected.

What readers get
----------------
* no key for the persistence id (deleted: shredded; or never created), or another key than the one the payload
  was sealed with (shredded, then written again) -> a :class:`Redacted` value where the event (snapshot,
  state) would be; ``EventEnvelope.redacted`` is then true. Never an error.
* a key that does not open the payload (tampered bytes, a replaced key, a wrong master key) ->
  :class:`~pgjournal.errors.DecryptionError` (a ``SerializationError``): corruption must not pass as redaction.
* compressed but not encrypted payloads need no configuration: every registry reads them (zstd needs the
  ``zstandard`` package, ``pip install "pgjournal[crypto]"``).
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import Any, Protocol

from pgjournal.errors import ConfigurationError, DecryptionError, SerializationError


class KeyStore(Protocol):
    """Per-persistence-id data keys, the contract in :mod:`pgjournal.state.keystore` (which holds the implementations);
    defined here, where the keys are used."""

    def key(self, persistence_id: str) -> bytes | None: ...

    def create_key(self, persistence_id: str) -> bytes: ...

    def delete_key(self, persistence_id: str) -> bool: ...

#: The ``ser_id`` of every transcoded row: ``b"PJTC"`` as a big-endian int32. Outside Akka's reserved 0-40.
TRANSCODED_SER_ID = 0x504A5443
FORMAT_VERSION = 1
COMPRESSIONS = {"zlib": 1, "zstd": 2}
_COMPRESSION_NAMES = {v: k for k, v in COMPRESSIONS.items()}
_ENCRYPTED = 0b100
_HEAD = struct.Struct(">BBi")
CHECK_BYTES = 4
NONCE_BYTES = 12
TAG_BYTES = 16
KEY_BYTES = 32


@dataclass(frozen=True, slots=True)
class Redacted:
    """Stands in for a payload whose key is gone (crypto-shredded): readers deliver it instead of the value.

    ``ser_id`` and ``manifest`` are the serializer's (what the value was); ``reason`` says why it is unreadable.
    Test for it with ``isinstance(value, Redacted)`` or :func:`is_redacted` (``EventEnvelope.redacted``).
    """

    persistence_id: str
    seq_nr: int | None
    ser_id: int
    manifest: str
    reason: str = "no key for this persistence id (crypto-shredded)"

    def __str__(self) -> str:
        return f"<redacted: {self.reason}>"


def is_redacted(value: Any) -> bool:
    """Whether a decoded value is a :class:`Redacted` marker."""
    return isinstance(value, Redacted)


_local = threading.local()


def _zstd_decompressor() -> Any:
    """This thread's zstd decompressor (making one per payload cost more than decompressing it; they are not
    thread-safe, so one per thread)."""
    decompressor = getattr(_local, "zstd_decompressor", None)
    if decompressor is None:
        decompressor = _local.zstd_decompressor = _zstd().ZstdDecompressor()
    return decompressor


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError:
        raise ConfigurationError('zstd compression needs the zstandard package: pip install "pgjournal[crypto]"'
                                 ) from None
    return zstandard


_CIPHERS: dict[bytes, tuple[Any, bytes]] = {}
_CIPHERS_MAX = 10_000


def _cipher(key: bytes) -> tuple[Any, bytes]:
    """The AES-GCM cipher of ``key`` and its check value, kept for the keys in use (both cost more to make
    than a payload costs to decrypt; the ciphers are stateless, so threads share them)."""
    found = _CIPHERS.get(key)
    if found is None:
        if len(_CIPHERS) >= _CIPHERS_MAX:
            _CIPHERS.clear()
        found = _CIPHERS[key] = (_aesgcm(key), key_check(key))
    return found


def _aesgcm(key: bytes) -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise ConfigurationError('encryption needs the cryptography package: pip install "pgjournal[crypto]"'
                                 ) from None
    return AESGCM(key)


def check_key(key: Any, what: str) -> bytes:
    """``key`` if it is 32 bytes (AES-256), else :class:`ConfigurationError` naming ``what``."""
    if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
        shown = f"{len(key)} bytes" if isinstance(key, bytes | bytearray) else type(key).__name__
        raise ConfigurationError(f"{what} must be {KEY_BYTES} bytes (AES-256), got {shown}")
    return bytes(key)


def new_key() -> bytes:
    """A fresh random AES-256 key."""
    return os.urandom(KEY_BYTES)


def seal(key: bytes, plaintext: bytes, associated: bytes) -> bytes:
    """``nonce + ciphertext + tag`` of ``plaintext`` under ``key`` (AES-256-GCM, random 96-bit nonce)."""
    nonce = os.urandom(NONCE_BYTES)
    sealed: bytes = _cipher(key)[0].encrypt(nonce, plaintext, associated)
    return nonce + sealed


def open_sealed(key: bytes, sealed: bytes, associated: bytes) -> bytes:
    """The plaintext of :func:`seal`'s output; ``ValueError`` when it does not authenticate."""
    if len(sealed) < NONCE_BYTES + TAG_BYTES:
        raise ValueError(f"sealed data of {len(sealed)} bytes is shorter than nonce and tag")
    try:
        plaintext: bytes = _cipher(key)[0].decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], associated)
        return plaintext
    except Exception as exc:  # cryptography's InvalidTag
        if type(exc).__name__ != "InvalidTag":
            raise
        raise ValueError("authentication failed (tampered data, or not this key)") from None


def key_check(key: bytes) -> bytes:
    """The 4-byte check value of a key stored in each header it sealed (tells a replaced key from tampering)."""
    return hashlib.sha256(b"pgjournal key check\x00" + key).digest()[:CHECK_BYTES]


def _associated(header: bytes, persistence_id: str) -> bytes:
    return header + b"\x00" + persistence_id.encode("utf-8")


class Transcoder:
    """Compresses and/or encrypts payloads on write; every read unwraps them.

    ``compression``: ``"zstd"``, ``"zlib"`` or ``None``; only payloads of at least ``compress_min_size`` bytes
    that shrink are stored compressed. ``key_store``: encrypt every payload with its persistence id's key
    (created on the first write) from this store; ``None``: no encryption. A transcoder with neither writes
    payloads as they are (it still reads transcoded rows).
    """

    def __init__(self, *, compression: str | None = None, compress_min_size: int = 256,
                 compression_level: int | None = None, key_store: KeyStore | None = None) -> None:
        if compression is not None and compression not in COMPRESSIONS:
            raise ConfigurationError(f"compression must be one of {', '.join(COMPRESSIONS)} or None, got "
                                     f"{compression!r}")
        if isinstance(compress_min_size, bool) or not isinstance(compress_min_size, int) or compress_min_size < 0:
            raise ConfigurationError(f"compress_min_size must be an integer >= 0, got {compress_min_size!r}")
        if compression_level is not None and (isinstance(compression_level, bool)
                                              or not isinstance(compression_level, int)):
            raise ConfigurationError(f"compression_level must be an integer or None, got {compression_level!r}")
        if key_store is not None and not all(callable(getattr(key_store, m, None))
                                             for m in ("key", "create_key", "delete_key")):
            raise ConfigurationError(f"key_store must be a KeyStore (key, create_key, delete_key), got "
                                     f"{type(key_store).__name__}")
        self.compression = compression
        self.compress_min_size = compress_min_size
        self.compression_level = compression_level
        self.key_store = key_store
        self._compress = self._compressor(compression, compression_level)
        if key_store is not None:
            _aesgcm(new_key())  # fail at configuration, not at the first write, when cryptography is missing

    def __getstate__(self) -> dict[str, Any]:
        # pickled (to Spark's workers, say) without its compressor, which holds per-thread state: remade on load
        return {k: v for k, v in self.__dict__.items() if k != "_compress"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._compress = self._compressor(self.compression, self.compression_level)

    @staticmethod
    def _compressor(name: str | None, level: int | None) -> Any:
        if name == "zlib":
            return lambda data: zlib.compress(data, -1 if level is None else level)
        if name == "zstd":
            zstandard, level = _zstd(), 3 if level is None else level
            local = threading.local()

            def compress(data: bytes) -> bytes:
                compressor = getattr(local, "compressor", None)
                if compressor is None:  # not thread-safe: one per thread
                    compressor = local.compressor = zstandard.ZstdCompressor(level=level)
                compressed: bytes = compressor.compress(data)
                return compressed

            return compress
        return None

    @property
    def encrypts(self) -> bool:
        return self.key_store is not None

    def encode(self, ser_id: int, payload: bytes, persistence_id: str | None) -> tuple[int, bytes]:
        """``(ser_id, payload)`` as stored: unchanged when nothing applies, else :data:`TRANSCODED_SER_ID` and
        the header followed by the body."""
        flags = 0
        body = payload
        if self._compress is not None and len(payload) >= self.compress_min_size:
            packed = self._compress(payload)
            if len(packed) < len(payload):
                flags, body = COMPRESSIONS[self.compression], packed  # type: ignore[index]
        if self.key_store is None:
            return (ser_id, payload) if flags == 0 else (TRANSCODED_SER_ID, _HEAD.pack(FORMAT_VERSION, flags, ser_id)
                                                         + body)
        if persistence_id is None:
            raise SerializationError("encrypting a payload needs its persistence id (its key is per persistence "
                                     "id); pass persistence_id= to serialize")
        key = self.key_store.create_key(persistence_id)
        header = _HEAD.pack(FORMAT_VERSION, flags | _ENCRYPTED, ser_id) + _cipher(key)[1]
        return TRANSCODED_SER_ID, header + seal(key, body, _associated(header, persistence_id))


def encrypted(payload: bytes) -> bool:
    """Whether a transcoded payload's header says it is encrypted (reading it needs a key store)."""
    return len(payload) >= _HEAD.size and payload[0] == FORMAT_VERSION and bool(payload[1] & _ENCRYPTED)


#: How text sealed by :func:`seal_text` starts (a character no exception's type name has, so no plain error text).
SEALED_TEXT = "~pgjournal-sealed:"
_TEXT_SER_ID = 20  # Akka's primitive-string: the body is UTF-8 text


def seal_text(key_store: KeyStore, persistence_id: str, text: str) -> str | None:
    """``text`` encrypted with the persistence id's key, as text (:data:`SEALED_TEXT`, then base64 of a
    transcoded payload): for text written beside a payload that may quote it, such as a projection's error in its
    dead letters. Readable with the key (:func:`open_text`), unreadable once the key is shredded, like the
    payload. ``None`` when the persistence id has no key (shredded, or its events are not encrypted)."""
    key = key_store.key(persistence_id)
    if key is None:
        return None
    header = _HEAD.pack(FORMAT_VERSION, _ENCRYPTED, _TEXT_SER_ID) + _cipher(key)[1]
    sealed = header + seal(key, text.encode("utf-8", "replace"), _associated(header, persistence_id))
    return SEALED_TEXT + base64.b64encode(sealed).decode("ascii")


def open_text(key_store: KeyStore | None, persistence_id: str, stored: str) -> str:
    """The text :func:`seal_text` sealed (text it did not seal as it is); ``"<redacted: ...>"`` when the key is
    gone. Raises :class:`DecryptionError` when the key does not open it."""
    if not stored.startswith(SEALED_TEXT):
        return stored
    if key_store is None:
        return "<sealed with the persistence id's key: give the SerializerRegistry its key store to read it>"
    try:
        payload = base64.b64decode(stored[len(SEALED_TEXT):], validate=True)
    except ValueError:
        raise DecryptionError(f"sealed text of persistence id {persistence_id!r} is not base64",
                              persistence_id=persistence_id) from None
    inner = decode(payload, "", key_store, persistence_id=persistence_id, seq_nr=None,
                   where=f" (sealed text of {persistence_id!r})")
    return str(inner) if isinstance(inner, Redacted) else inner[1].decode("utf-8", "replace")


def decode(payload: bytes, manifest: str, key_store: KeyStore | None, *, persistence_id: str | None,
           seq_nr: int | None, where: str) -> tuple[int, bytes] | Redacted:
    """The serializer's ``(ser_id, payload)`` inside a transcoded payload, or :class:`Redacted` when its
    persistence id's key is gone. Raises :class:`SerializationError` (:class:`DecryptionError` for a payload
    the key does not open) naming the row."""
    payload = bytes(payload)
    if len(payload) < _HEAD.size:
        raise SerializationError(f"transcoded payload{where} is {len(payload)} bytes, shorter than its header",
                                 persistence_id=persistence_id, seq_nr=seq_nr, ser_id=TRANSCODED_SER_ID,
                                 manifest=manifest)
    version, flags, ser_id = _HEAD.unpack_from(payload)
    if version != FORMAT_VERSION or flags & ~(_ENCRYPTED | 0b11) or (flags & 0b11) == 3:
        raise SerializationError(f"transcoded payload{where} has an unknown header (format version {version}, "
                                 f"flags {flags:#04x}); written by a newer pgjournal?",
                                 persistence_id=persistence_id, seq_nr=seq_nr, ser_id=TRANSCODED_SER_ID,
                                 manifest=manifest)
    body = payload[_HEAD.size:]
    if flags & _ENCRYPTED:
        if persistence_id is None:
            raise SerializationError(f"payload{where} is encrypted with its persistence id's key, but the reader "
                                     "did not say which persistence id it belongs to",
                                     ser_id=TRANSCODED_SER_ID, manifest=manifest)
        if key_store is None:
            raise SerializationError(
                f"payload{where} is encrypted; give the SerializerRegistry a Transcoder with the key store it was "
                "written with", persistence_id=persistence_id, seq_nr=seq_nr, ser_id=TRANSCODED_SER_ID,
                manifest=manifest)
        key = key_store.key(persistence_id)
        if key is None:
            return Redacted(persistence_id, seq_nr, ser_id, manifest)
        if body[:CHECK_BYTES] != _cipher(key)[1]:
            return Redacted(persistence_id, seq_nr, ser_id, manifest, "sealed with a key of this persistence id "
                                                                      "that was deleted (crypto-shredded)")
        header_size = _HEAD.size + CHECK_BYTES
        try:
            body = open_sealed(key, payload[header_size:], _associated(payload[:header_size], persistence_id))
        except ValueError as exc:
            raise DecryptionError(
                f"cannot decrypt payload{where} (manifest {manifest!r}): {exc}; the key store holds a key for "
                f"{persistence_id!r} that does not open it", persistence_id=persistence_id, seq_nr=seq_nr,
                ser_id=TRANSCODED_SER_ID, manifest=manifest) from None
    compression = flags & 0b11
    if compression:
        try:
            if _COMPRESSION_NAMES[compression] == "zlib":
                body = zlib.decompress(body)
            else:
                body = _zstd_decompressor().decompress(body, max_output_size=1 << 30)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise SerializationError(
                f"cannot decompress {_COMPRESSION_NAMES[compression]} payload{where} (manifest {manifest!r}): {exc}",
                persistence_id=persistence_id, seq_nr=seq_nr, ser_id=TRANSCODED_SER_ID, manifest=manifest) from None
    if ser_id == TRANSCODED_SER_ID:
        raise SerializationError(f"transcoded payload{where} wraps another transcoded payload",
                                 persistence_id=persistence_id, seq_nr=seq_nr, ser_id=ser_id, manifest=manifest)
    return ser_id, body
