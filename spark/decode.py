"""Payloads decoded in Spark's tasks as the journal decodes them: by the journal's serializer registry.

The registry travels with the read (pickled to the Python workers, see :mod:`spark.shipping`), so upcasters,
registered types and serializers, the database's reading of id 33 (:mod:`pgjournal.admin.stored_format`) and
transcoded payloads (compressed, or encrypted with a key store the workers can open) give in Spark what a
``Journal`` read gives. A decoded payload becomes a struct of the read's schema: the data the registry's
``to_dict`` writes for a registered type, the JSON object as it is for the rest.

Two ways through a batch. Rows whose payload is a one-line JSON object that the registry reads as it is stored
(serializer id 31, or 33 in a database that carries the legacy marker; a manifest with no registered type and no
upcaster) are decoded together by Arrow's JSON reader (C++, no Python object per row): the common case. The
other rows go one at a time through the registry. A batch that mixes both is split, and the two parts are put
back in row order.

Per row: a payload whose key is gone (crypto-shredded) gives a null struct and ``redacted`` true; one that does
not decode to a JSON object, or does not fit the struct, a null struct (as ``from_json`` would). An encrypted
payload read without any key store, or one the key store's key does not open (tampering, a wrong master key),
fails the task with the pgjournal error: that is a configuration to fix, not data to pass over.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pgjournal.codec import transcoding
from pgjournal.codec.serialization import CBOR_SER_ID, JSON_SER_ID, SerializerRegistry
from pgjournal.errors import ConfigurationError, DecryptionError, SerializationError

if TYPE_CHECKING:
    import pyarrow as pa

#: The column beside the decoded payload that says a payload's key is gone.
REDACTED = "redacted"
NO_KEY_STORE = (
    "is encrypted and this Spark read has no key store: register the journal's serializer registry, whose "
    "Transcoder holds the key store (spark.register(session, serializers=registry)), or give option "
    "masterKeyEnv (or masterKey) to read the keys from the database's PostgresKeyStore")

#: Arrow types whose JSON form Arrow's reader and ``pa.array`` of the decoded values agree on.
_PLAIN_JSON = ("is_string", "is_boolean", "is_integer", "is_floating")


def plain_type(arrow_type: pa.DataType) -> bool:
    """Whether Arrow's JSON reader gives for ``arrow_type`` what the registry's values give: strings, numbers,
    booleans, and lists and structs of them (Arrow reads ISO text into a timestamp, the registry does not)."""
    import pyarrow as pa

    if pa.types.is_struct(arrow_type):
        return all(plain_type(f.type) for f in arrow_type)
    if pa.types.is_list(arrow_type):
        return plain_type(arrow_type.value_type)
    return any(getattr(pa.types, check)(arrow_type) for check in _PLAIN_JSON)


class PayloadDecoder:
    """Decodes the payload columns of Arrow batches with ``registry`` (already derived for the database's stored
    format). Picklable: built where Spark plans a read, used in every task. :attr:`decoded_rows` counts the
    payloads it decoded, :attr:`fast_rows` those of them Arrow's JSON reader decoded."""

    def __init__(self, registry: SerializerRegistry) -> None:
        self.registry = registry
        self.decoded_rows = 0
        self.fast_rows = 0
        self._as_stored: dict[str, bool] = {}

    @property
    def has_key_store(self) -> bool:
        transcoder = self.registry.transcoder
        return transcoder is not None and transcoder.key_store is not None

    # -- whole batches -------------------------------------------------------------------------------------

    def decode(self, ser_ids: pa.Array, manifests: pa.Array, payloads: pa.Array, pids: pa.Array,
               struct: pa.DataType) -> tuple[pa.Array, pa.Array]:
        """The payloads as a struct array of type ``struct``, and the ``redacted`` flags (booleans)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        self.decoded_rows += len(payloads)
        mask = self.arrow_rows(ser_ids, manifests, payloads) if plain_type(struct) else None
        fast = None
        if mask is not None:
            fast = arrow_json(payloads if mask is True else payloads.filter(mask), struct)
        if fast is None:  # none to Arrow, or Arrow's reader refused the batch: one payload at a time
            return self._one_by_one(ser_ids.to_pylist(), manifests.to_pylist(), payloads.to_pylist(),
                                    pids.to_pylist(), struct)
        self.fast_rows += len(fast)
        unflagged = pa.repeat(pa.scalar(False), len(fast))
        if mask is True:
            return fast, unflagged
        rest = pc.invert(mask)
        ids, names, bodies, owners = (a.filter(rest).to_pylist() for a in (ser_ids, manifests, payloads, pids))
        slow, flags = self._one_by_one(ids, names, bodies, owners, struct)
        return merge(mask, fast, slow), merge(mask, unflagged, flags)

    def arrow_rows(self, ser_ids: pa.Array, manifests: pa.Array, payloads: pa.Array) -> pa.Array | bool | None:
        """Which rows Arrow's JSON reader may decode: ``True`` all, ``None`` none, else a boolean mask."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if len(payloads) == 0:
            return None
        json_id = pc.equal(ser_ids, JSON_SER_ID)
        if self.registry.legacy_json_33:
            json_id = pc.or_(json_id, pc.equal(ser_ids, CBOR_SER_ID))  # a CBOR map never starts with '{'
        # one line per payload, an object: else rows could shift (a payload of two lines), or Arrow refuse it
        mask = pc.and_(json_id, pc.starts_with(payloads, "{"))
        if not newline_free(payloads):  # rare: which ones (matching per payload costs far more than the one search)
            mask = pc.and_(mask, pc.invert(pc.match_substring(payloads, "\n")))
        distinct = pc.unique(manifests).to_pylist()
        stored = [m for m in distinct if self._reads_as_stored(m)]
        if len(stored) < len(distinct):
            mask = pc.and_(mask, pc.is_in(manifests, value_set=pa.array(stored, manifests.type)))
        mask = pc.fill_null(mask, False)
        if pc.all(mask).as_py():
            return True
        return mask if pc.any(mask).as_py() else None

    def json_texts(self, ser_ids: pa.Array, manifests: pa.Array, payloads: pa.Array, pids: pa.Array) -> pa.Array:
        """Each payload as the JSON text of its decoded object (null: not an object, or redacted); the JSON rows
        Arrow could decode are their own text. For inferring a schema with Spark's JSON reader."""
        import pyarrow as pa
        import pyarrow.compute as pc

        mask = self.arrow_rows(ser_ids, manifests, payloads)
        fast = None
        if mask is not None:
            try:
                fast = pc.cast(payloads if mask is True else payloads.filter(mask), pa.string())  # checks UTF-8
            except pa.ArrowInvalid:
                fast = None
        if fast is None:
            return pa.array(self._texts(ser_ids.to_pylist(), manifests.to_pylist(), payloads.to_pylist(),
                                        pids.to_pylist()), pa.string())
        if mask is True:
            return fast
        rest = pc.invert(mask)
        slow = pa.array(self._texts(*(a.filter(rest).to_pylist() for a in (ser_ids, manifests, payloads, pids))),
                        pa.string())
        return merge(mask, fast, slow)

    # -- one payload at a time -------------------------------------------------------------------------------

    def _one_by_one(self, ser_ids: Sequence[int], manifests: Sequence[str], payloads: Sequence[bytes | None],
                    pids: Sequence[str | None], struct: pa.DataType) -> tuple[pa.Array, pa.Array]:
        import pyarrow as pa

        values, flags = [], []
        for ser_id, manifest, payload, pid in zip(ser_ids, manifests, payloads, pids, strict=True):
            value, redacted = self.data(ser_id, manifest, payload, pid)
            values.append(value if isinstance(value, dict) else None)
            flags.append(redacted)
        try:
            array = pa.array(values, type=struct)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            array = pa.array([fitting(v, struct) for v in values], type=struct)
        return array, pa.array(flags, pa.bool_())

    def _texts(self, ser_ids: Sequence[int], manifests: Sequence[str], payloads: Sequence[bytes | None],
               pids: Sequence[str | None]) -> list[str | None]:
        texts = []
        for row in zip(ser_ids, manifests, payloads, pids, strict=True):
            value = self.data(*row)[0]
            texts.append(json.dumps(value, default=str) if isinstance(value, dict) else None)
        return texts

    def data(self, ser_id: int, manifest: str | None, payload: bytes | None, pid: str | None) -> tuple[Any, bool]:
        """``(data, redacted)``: the payload decoded by the registry and turned into data (``None`` when it
        does not decode), and whether its key is gone."""
        if payload is None:
            return None, False
        if ser_id == transcoding.TRANSCODED_SER_ID and not self.has_key_store and transcoding.encrypted(payload):
            raise ConfigurationError(f"the payload of persistence id {pid!r} {NO_KEY_STORE}")
        try:
            value = self.registry.deserialize(ser_id, manifest or "", payload, persistence_id=pid)
        except DecryptionError:
            raise
        except SerializationError:
            return None, False
        if isinstance(value, transcoding.Redacted):
            return None, True
        try:
            return self.registry.as_data(value), False
        except (TypeError, ValueError):
            return None, False

    def _reads_as_stored(self, manifest: str | None) -> bool:
        known = self._as_stored.get(manifest or "")
        if known is None:
            known = self._as_stored[manifest or ""] = self.registry.reads_as_stored(manifest or "")
        return known

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_as_stored": {}}  # registrations may differ where it is unpickled


def values(payloads: pa.Array) -> pa.Buffer:
    """The bytes of a binary array's values, end to end (what its offsets span)."""
    import pyarrow as pa

    offsets = pa.Array.from_buffers(pa.int32(), len(payloads) + 1, [None, payloads.buffers()[1]],
                                    offset=payloads.offset)
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    return payloads.buffers()[2].slice(start, end - start)


def newline_free(payloads: pa.Array) -> bool:
    """Whether no payload holds a newline: one search over all their bytes."""
    return len(payloads) == 0 or values(payloads).to_pybytes().find(b"\n") < 0


def arrow_json(payloads: pa.Array, struct: pa.DataType) -> pa.Array | None:
    """One-line JSON object payloads decoded by Arrow's JSON reader into ``struct`` (fields it does not name
    are ignored), or ``None`` when the reader refuses them (a value that does not fit, malformed JSON)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pjson

    if len(payloads) == 0:
        return None
    lines = pc.binary_join_element_wise(payloads, pa.scalar(b"\n", pa.binary()), pa.scalar(b"", pa.binary()))
    data = values(lines)
    try:
        table = pjson.read_json(pa.BufferReader(data), read_options=pjson.ReadOptions(
            use_threads=False, block_size=max(len(data) + 1, 1 << 20)), parse_options=pjson.ParseOptions(
            explicit_schema=pa.schema(list(struct)), unexpected_field_behavior="ignore", newlines_in_values=False))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(payloads):
        return None
    fields = [table.column(f.name).combine_chunks() for f in struct]
    array = pa.StructArray.from_arrays(fields, fields=list(struct))
    return array if array.type == struct else array.cast(struct)


def merge(mask: pa.Array, chosen: pa.Array, rest: pa.Array) -> pa.Array:
    """The rows where ``mask`` is true from ``chosen``, the others from ``rest``, in row order."""
    import pyarrow as pa
    import pyarrow.compute as pc

    order = pa.concat_arrays([pc.indices_nonzero(mask), pc.indices_nonzero(pc.invert(mask))])
    return pa.concat_arrays([chosen, rest]).take(pc.sort_indices(order))


def fitting(value: dict[str, Any] | None, struct: pa.DataType) -> dict[str, Any] | None:
    """``value`` when it fits ``struct``, else ``None``."""
    import pyarrow as pa

    try:
        pa.array([value], type=struct)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return None
    return value


def decoding_function(decoder: PayloadDecoder, struct: pa.DataType, name: str) -> Callable[..., pa.Array]:
    """The function of an Arrow UDF over ``(ser_id, manifest, payload, persistence_id)`` giving
    ``struct<name: struct, redacted: boolean>`` (the JDBC reader's decoding, :mod:`spark.read`)."""

    def decode(ser_ids, manifests, payloads, pids):  # type: ignore[no-untyped-def]  # Spark reads hints as the UDF's kind
        import pyarrow as pa

        events, flags = decoder.decode(ser_ids, manifests, payloads, pids, struct)
        return pa.StructArray.from_arrays([events, flags], names=[name, REDACTED])

    return decode


def texts_function(decoder: PayloadDecoder) -> Callable[..., pa.Array]:
    """The function of an Arrow UDF over ``(ser_id, manifest, payload, persistence_id)`` giving each payload's
    JSON text (:meth:`PayloadDecoder.json_texts`)."""

    def texts(ser_ids, manifests, payloads, pids):  # type: ignore[no-untyped-def]  # Spark reads hints as the UDF's kind
        return decoder.json_texts(ser_ids, manifests, payloads, pids)

    return texts
