"""Serializer registry: every payload is stored as ``(ser_id, manifest, bytes)``. Nothing is pickled.

Ids and byte layouts are Akka's (see :mod:`pgjournal.codec.akka_formats`), so either side reads what the other
wrote. Writing picks the serializer Akka's default bindings pick for the same kind of value:

* ``bool`` -> primitive-boolean 35, ``int`` within 64 bits -> primitive-long 18, ``str`` -> primitive-string
  20, ``bytes`` -> byte array 4 (no manifest);
* a type registered with :meth:`SerializerRegistry.register` -> Jackson JSON 31 (or CBOR 33/32 when
  registered so) with its manifest (the class name Akka would write, ``#N`` when it has a version);
* a type registered with :meth:`SerializerRegistry.register_serializer` -> that serializer's id;
* any other JSON value (dict, list, float, ``None``, larger int) -> Jackson JSON 31 with an empty manifest.

Reading goes by ``ser_id``: Jackson JSON and CBOR payloads of registered manifests become their types, of
unknown manifests plain dicts and lists. Databases that pgjournal wrote before it used Akka's ids keep JSON
under 33: see :mod:`pgjournal.admin.stored_format` for how those rows still read.

Transcoding: a registry made with a :class:`~pgjournal.codec.transcoding.Transcoder` compresses and/or encrypts
what it serializes for a persistence id (``serialize(obj, persistence_id=...)``); every registry reads
transcoded rows (``ser_id`` :data:`~pgjournal.codec.transcoding.TRANSCODED_SER_ID`), and an encrypted payload whose key
is gone reads as a :class:`~pgjournal.codec.transcoding.Redacted` value.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pgjournal.codec import akka_formats as akka
from pgjournal.codec import transcoding
from pgjournal.errors import ConfigurationError, SerializationError
from pgjournal.validation import MAX_NAME_LENGTH, check_name


class StoredFormatFlags(Protocol):
    """What a registry reads of a database's stored format (:class:`pgjournal.admin.stored_format.StoredFormat`,
    read from the database above this layer)."""

    @property
    def legacy_json_33(self) -> bool: ...

JSON_SER_ID = akka.JACKSON_JSON
CBOR_SER_ID = akka.JACKSON_CBOR
BYTES_SER_ID = akka.BYTES
#: Ids with a built-in meaning; :meth:`SerializerRegistry.register_serializer` refuses them.
BUILT_IN_IDS = frozenset({*akka.NAMES, transcoding.TRANSCODED_SER_ID})

_PRIMITIVE_DECODERS: dict[int, Callable[[bytes], Any]] = {
    akka.LONG: akka.decode_long, akka.INT: akka.decode_int, akka.STRING: akka.decode_string,
    akka.BOOLEAN: akka.decode_boolean, akka.BYTES: bytes, akka.BYTESTRING: bytes,
}


@dataclass(frozen=True, slots=True)
class Serialized:
    ser_id: int
    manifest: str
    payload: bytes


class Serializer(Protocol):
    """A custom binary format. ``manifest`` tells ``from_binary`` what to build."""

    def to_binary(self, obj: Any) -> tuple[str, bytes]: ...

    def from_binary(self, payload: bytes, manifest: str) -> Any: ...


@dataclass(frozen=True)
class _JacksonType:
    cls: type
    name: str
    ser_id: int
    version: int | None
    to_dict: Callable[[Any], Any]
    from_dict: Callable[[Any], Any]
    upcast: Callable[[Any, int], Any] | None

    @property
    def manifest(self) -> str:
        return self.name if self.version is None else f"{self.name}#{self.version}"


class _Registrations:
    """What a registry knows; shared by the registries :meth:`SerializerRegistry.for_stored_format` derives."""

    def __init__(self) -> None:
        self.jackson_by_type: dict[type, _JacksonType] = {}
        self.jackson_by_name: dict[str, _JacksonType] = {}
        self.custom_by_type: dict[type, tuple[int, Serializer]] = {}
        self.custom_by_id: dict[int, Serializer] = {}
        #: Per manifest (without ``#N``): version -> the function that turns that version into the next.
        self.upcasters: dict[str, dict[int, Callable[[Any], Any]]] = {}


class SerializerRegistry:
    """Maps Python types to stored formats and back."""

    def __init__(self, *, transcoder: transcoding.Transcoder | None = None) -> None:
        if transcoder is not None and not isinstance(transcoder, transcoding.Transcoder):
            raise ConfigurationError(f"transcoder must be a pgjournal.codec.transcoding.Transcoder, got "
                                     f"{type(transcoder).__name__}")
        self._known = _Registrations()
        #: Read ``ser_id`` 33 as JSON where the payload is JSON (a database written by pgjournal before it
        #: used Akka's ids), else as CBOR. Set by :meth:`for_stored_format`, never by hand.
        self.legacy_json_33 = False
        #: Compression and encryption of what this registry serializes (see :mod:`pgjournal.codec.transcoding`).
        self.transcoder = transcoder

    def for_stored_format(self, stored: StoredFormatFlags) -> SerializerRegistry:
        """This registry as it must read one database (``Journal.open`` calls it): the same registrations,
        later ones included, with that database's reading of id 33. ``self`` when nothing differs."""
        if stored.legacy_json_33 == self.legacy_json_33:
            return self
        return self._derived(stored.legacy_json_33, self.transcoder)

    def with_transcoder(self, transcoder: transcoding.Transcoder | None) -> SerializerRegistry:
        """This registry with another transcoder (say, one whose key store a Spark task can open): the same
        registrations, later ones included, and the same reading of id 33."""
        if transcoder is not None and not isinstance(transcoder, transcoding.Transcoder):
            raise ConfigurationError(f"transcoder must be a pgjournal.codec.transcoding.Transcoder, got "
                                     f"{type(transcoder).__name__}")
        return self._derived(self.legacy_json_33, transcoder)

    def _derived(self, legacy_json_33: bool, transcoder: transcoding.Transcoder | None) -> SerializerRegistry:
        derived = SerializerRegistry.__new__(SerializerRegistry)
        derived._known = self._known
        derived.legacy_json_33 = legacy_json_33
        derived.transcoder = transcoder
        return derived

    def register(
        self,
        cls: type,
        manifest: str | None = None,
        *,
        to_dict: Callable[[Any], Any] | None = None,
        from_dict: Callable[[Any], Any] | None = None,
        ser_id: int = JSON_SER_ID,
        version: int | None = None,
        upcast: Callable[[Any, int], Any] | None = None,
    ) -> type:
        """Store ``cls`` with Jackson JSON (``ser_id`` 31) or CBOR (33, or 32) under ``manifest``.

        ``manifest`` is what Akka writes: the JVM class name, like ``com.example.CartItemAdded`` (default: the
        Python class name). Dataclasses and pydantic models need no functions; other classes pass
        ``to_dict`` and ``from_dict``. ``version`` is the Jackson migration's current version: writes then
        carry ``manifest#version``, and a row of an older version goes through ``upcast(data, from_version)``
        before ``from_dict``. Usable as a decorator: ``@registry.register``.
        """
        if not isinstance(cls, type):
            raise SerializationError(f"register takes a class (a dataclass, a pydantic model, or any class with "
                                     f"to_dict and from_dict), got {type(cls).__name__} {cls!r}")
        manifest = cls.__name__ if manifest is None else manifest
        if not isinstance(manifest, str) or not manifest or "#" in manifest:
            raise SerializationError(f"manifest must be a non-empty class name without '#' (pass version= for "
                                     f"'#N'), got {manifest!r}")
        if ser_id not in akka.JACKSON_IDS:
            raise SerializationError(f"register stores types with Jackson JSON ({akka.JACKSON_JSON}) or CBOR "
                                     f"({akka.JACKSON_CBOR}, {akka.JACKSON_CBOR_264}), got ser_id {ser_id!r}; use "
                                     "register_serializer for other formats")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 1):
            raise SerializationError(f"version must be a positive int or None, got {version!r}")
        if upcast is not None and version is None:
            raise SerializationError(f"upcast for {manifest!r} needs the current version (version=)")
        # Written as `manifest` or `manifest#version`: it must fit the manifest columns, checked here rather
        # than by the database at the first append.
        suffix = 0 if version is None else len(f"#{version}")
        check_name(manifest, "manifest" + (f" (with '#{version}' appended)" if suffix else ""),
                   error=SerializationError, max_length=MAX_NAME_LENGTH - suffix)
        steps = self._known.upcasters.get(manifest)
        if steps:
            if upcast is not None:
                raise SerializationError(f"{manifest!r} has upcasters from register_upcaster (versions "
                                         f"{_id_list(set(steps))}); pass either those or upcast=, not both")
            if version is None or max(steps) >= version:
                raise SerializationError(
                    f"{manifest!r} has upcasters up to version {max(steps) + 1}, so it needs version= of at least "
                    f"{max(steps) + 1} (got {version!r}): a write without that version would read as version 1")
        to_dict, from_dict = _conversions(cls, to_dict, from_dict, json=ser_id == akka.JACKSON_JSON)
        known = self._known.jackson_by_name.get(manifest)
        if known is not None and known.cls is not cls:
            raise SerializationError(f"manifest {manifest!r} is already registered for {known.cls.__qualname__}")
        entry = _JacksonType(cls, manifest, ser_id, version, to_dict, from_dict, upcast)
        self._known.jackson_by_type[cls] = entry
        self._known.jackson_by_name[manifest] = entry
        return cls

    def register_upcaster(self, manifest: str, from_version: int, upcaster: Callable[[Any], Any]) -> None:
        """On read, turn the JSON (or CBOR) form of version ``from_version`` of ``manifest`` (the class name,
        without ``#``) into that of version ``from_version + 1``: ``upcaster(data) -> data``.

        A row written as ``manifest#k`` (no ``#``: version 1) passes through the upcasters from ``k`` up to
        the current version: the version of the type registered under ``manifest``, or, for a manifest read
        as plain data, the version after the highest upcaster. Every step must be registered; a version with
        no way to the current one, or newer than it, fails the read with a :class:`SerializationError` that
        names it. Works for every read: by persistence id, by slices, by tag, snapshots and durable state.
        """
        if not isinstance(manifest, str) or not manifest or "#" in manifest:
            raise SerializationError(f"manifest must be a non-empty class name without '#', got {manifest!r}")
        if isinstance(from_version, bool) or not isinstance(from_version, int) or not 1 <= from_version < 10**9:
            raise SerializationError(f"from_version must be a positive int, got {from_version!r}")
        if not callable(upcaster):
            raise SerializationError(f"upcaster for {manifest!r} version {from_version} must be callable, got "
                                     f"{type(upcaster).__name__}")
        steps = self._known.upcasters.setdefault(manifest, {})
        if from_version in steps:
            raise SerializationError(f"{manifest!r} already has an upcaster from version {from_version}")
        entry = self._known.jackson_by_name.get(manifest)
        if entry is not None:
            if entry.upcast is not None:
                raise SerializationError(f"{entry.cls.__qualname__} was registered under {manifest!r} with upcast=; "
                                         "pass either that or register_upcaster, not both")
            if entry.version is None or from_version >= entry.version:
                raise SerializationError(
                    f"an upcaster from version {from_version} of {manifest!r} goes past the version "
                    f"{entry.cls.__qualname__} is registered with ({entry.version}); register it with version= "
                    f"above {from_version}")
        steps[from_version] = upcaster

    def register_serializer(self, ser_id: int, serializer: Serializer, *types: type) -> None:
        """Use ``serializer`` under ``ser_id`` for ``types`` (and for every stored row with that id)."""
        if isinstance(ser_id, bool) or not isinstance(ser_id, int) or ser_id in BUILT_IN_IDS or not (
            0 < ser_id < 2**31
        ):
            raise SerializationError(f"ser_id must be a positive int32 other than the built-in ids "
                                     f"{_id_list(BUILT_IN_IDS)}, got {ser_id!r}")
        self._known.custom_by_id[ser_id] = serializer
        for cls in types:
            self._known.custom_by_type[cls] = (ser_id, serializer)

    # -- writing -------------------------------------------------------------------------------------

    def serialize(self, obj: Any, *, persistence_id: str | None = None) -> Serialized:
        """``obj`` as stored; with a transcoder, compressed and/or encrypted with ``persistence_id``'s key
        (encryption needs it)."""
        plain = self._serialize(obj)
        if self.transcoder is None:
            return plain
        ser_id, payload = self.transcoder.encode(plain.ser_id, plain.payload, persistence_id)
        return plain if ser_id == plain.ser_id else Serialized(ser_id, plain.manifest, payload)

    def _serialize(self, obj: Any) -> Serialized:
        kind = type(obj)
        custom = self._known.custom_by_type.get(kind)
        if custom is not None:
            return _custom(obj, *custom)
        if kind is str:
            try:
                return Serialized(akka.STRING, "", akka.encode_string(obj))
            except UnicodeEncodeError as exc:
                raise SerializationError(f"cannot serialize str value {_short(obj)}: {exc.reason} at index "
                                         f"{exc.start} (a lone surrogate has no UTF-8 form)") from None
        if kind is int and akka.LONG_MIN <= obj <= akka.LONG_MAX:
            return Serialized(akka.LONG, "", akka.encode_long(obj))
        if kind is bool:
            return Serialized(akka.BOOLEAN, "", akka.encode_boolean(obj))
        if isinstance(obj, bytes | bytearray | memoryview):
            return Serialized(akka.BYTES, "", bytes(obj))
        entry = self._known.jackson_by_type.get(kind)
        try:
            if entry is None:
                return Serialized(JSON_SER_ID, "", akka.encode_json(obj))
            data = entry.to_dict(obj)
            payload = akka.encode_json(data) if entry.ser_id == JSON_SER_ID else akka.encode_cbor(data)
            return Serialized(entry.ser_id, entry.manifest, payload)
        except (TypeError, ValueError, RecursionError) as exc:
            raise SerializationError(
                f"cannot serialize {kind.__qualname__} value {_short(obj)}: {exc}; expected a JSON value "
                "(dict, list, str, int, finite float, bool, None), bytes, or a registered type"
            ) from None

    # -- reading -------------------------------------------------------------------------------------

    def deserialize(
        self,
        ser_id: int,
        manifest: str,
        payload: bytes,
        *,
        where: str = "",
        persistence_id: str | None = None,
        seq_nr: int | None = None,
    ) -> Any:
        """The value stored as ``(ser_id, manifest, payload)``.

        A payload its serializer cannot read raises :class:`SerializationError` naming ``ser_id``,
        ``manifest`` and the row: ``persistence_id`` and ``seq_nr`` where given, and ``where`` (a phrase like
        ``" of snapshot 'Cart|1'"``) otherwise. A transcoded payload is unwrapped first; an encrypted one whose
        persistence id has no key any more reads as a :class:`~pgjournal.codec.transcoding.Redacted` value.
        """
        if ser_id == transcoding.TRANSCODED_SER_ID:
            inner = transcoding.decode(
                payload, manifest, self.transcoder.key_store if self.transcoder is not None else None,
                persistence_id=persistence_id, seq_nr=seq_nr, where=where or _row(persistence_id, seq_nr))
            if isinstance(inner, transcoding.Redacted):
                return inner
            ser_id, payload = inner
        try:
            if ser_id == akka.JACKSON_JSON:
                return self._from_jackson(manifest, akka.decode_json(payload))
            if ser_id in akka.CBOR_IDS:
                if ser_id == akka.JACKSON_CBOR and self.legacy_json_33:
                    return self._from_jackson(manifest, _legacy_33(payload))
                return self._from_jackson(manifest, akka.decode_cbor(payload))
            primitive = _PRIMITIVE_DECODERS.get(ser_id)
            if primitive is not None:
                return primitive(bytes(payload))
            serializer = self._known.custom_by_id.get(ser_id)
        except SerializationError:
            raise
        except Exception as exc:
            where = where or _row(persistence_id, seq_nr)
            raise SerializationError(
                f"cannot decode payload{where} (ser_id {ser_id} {akka.NAMES.get(ser_id, '')}, manifest "
                f"{manifest!r}, {len(payload)} bytes): {exc}",
                persistence_id=persistence_id, seq_nr=seq_nr, ser_id=ser_id, manifest=manifest,
            ) from exc
        if serializer is None:
            where = where or _row(persistence_id, seq_nr)
            raise SerializationError(
                f"unknown serializer id {ser_id} (manifest {manifest!r}){where}; known ids: "
                f"{_id_list({*BUILT_IN_IDS, *self._known.custom_by_id})}; register it with register_serializer",
                persistence_id=persistence_id, seq_nr=seq_nr, ser_id=ser_id, manifest=manifest,
            )
        try:
            return serializer.from_binary(bytes(payload), manifest)
        except Exception as exc:
            where = where or _row(persistence_id, seq_nr)
            raise SerializationError(
                f"serializer {ser_id} could not decode manifest {manifest!r}{where}: {exc}",
                persistence_id=persistence_id, seq_nr=seq_nr, ser_id=ser_id, manifest=manifest,
            ) from exc

    def bulk_reader(self, fallback: Callable[[int, str, bytes, str, int], Any] | None = None
                    ) -> Callable[[int, str, bytes, str, int], Any]:
        """A reader of many rows' payloads, ``read(ser_id, manifest, payload, persistence_id, seq_nr)``: plain
        JSON (:meth:`plain_json`, asked once per run of rows of one kind) read by
        :data:`~pgjournal.codec.akka_formats.read_json`, the common case of a catch-up at less per row; anything
        else, and what ``read_json`` refuses, by ``fallback`` (default: :meth:`deserialize`), for its value or its
        error. The rule of every bulk reader (by slices, by tag), so they read what :meth:`deserialize` reads."""
        deserialize, plain_json, read_fast, refused = self.deserialize, self.plain_json, akka.read_json, akka.REFUSED
        slow = fallback or (lambda ser_id, manifest, payload, pid, seq_nr: deserialize(
            ser_id, manifest, payload, persistence_id=pid, seq_nr=seq_nr))
        last_id: int | None = None
        last_manifest: str | None = None
        plain = False

        def read(ser_id: int, manifest: str, payload: bytes, pid: str, seq_nr: int) -> Any:
            nonlocal last_id, last_manifest, plain
            if ser_id != last_id or manifest != last_manifest:
                last_id, last_manifest, plain = ser_id, manifest, plain_json(ser_id, manifest)
            if plain:
                try:
                    return read_fast(payload)
                except refused:
                    pass  # the fallback decides (or raises the error)
            return slow(ser_id, manifest, payload, pid, seq_nr)

        return read

    def plain_json(self, ser_id: int, manifest: str) -> bool:
        """Whether a payload of ``(ser_id, manifest)`` deserializes to its JSON document as it is (Jackson
        JSON of a manifest with no registered type or upcaster; :meth:`deserialize` not overridden): a bulk
        reader may then decode the common case itself (:data:`pgjournal.codec.akka_formats.read_json`) and leave
        anything else (compressed, not UTF-8, not one JSON document) to :meth:`deserialize`, for its value or
        its error."""
        return (ser_id == akka.JACKSON_JSON and type(self).deserialize is SerializerRegistry.deserialize
                and self.reads_as_stored(manifest))

    def reads_as_stored(self, manifest: str) -> bool:
        """Whether a Jackson JSON or CBOR payload of ``manifest`` reads as its data as stored: no type and no
        upcaster is registered for it (with or without its ``#N``). Lets a bulk reader decode such payloads
        its own way (Spark decodes whole batches of JSON in Arrow) and still give what :meth:`deserialize`
        gives."""
        name = manifest
        if manifest not in self._known.jackson_by_name and "#" in manifest:
            try:
                name = akka.split_manifest(manifest)[0]
            except ValueError:
                return True  # not a Jackson version suffix: read as it is
        return name not in self._known.jackson_by_name and name not in self._known.upcasters

    def as_data(self, value: Any) -> Any:
        """``value`` as the JSON-like data this registry writes for it: a registered type through its
        ``to_dict``, a dataclass or pydantic model as its fields; anything else as it is."""
        entry = self._known.jackson_by_type.get(type(value))
        if entry is not None:
            return _dataclass_data(value) if entry.to_dict is dataclasses.asdict else entry.to_dict(value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return _dataclass_data(value)
        dump = getattr(value, "model_dump", None)
        return dump(mode="json") if callable(dump) and not isinstance(value, type) else value

    def _from_jackson(self, manifest: str, data: Any) -> Any:
        """``data`` as the registered type of ``manifest`` (upcast from an older version first), or as it is
        when no type is registered for it."""
        by_name = self._known.jackson_by_name
        entry = by_name.get(manifest)
        name, from_version = manifest, 1
        if entry is None and "#" in manifest:
            try:
                name, from_version = akka.split_manifest(manifest)
            except ValueError:
                return data  # not a Jackson version suffix: not a manifest of a registered type
            entry = by_name.get(name)
        steps = self._known.upcasters.get(name)
        if steps:
            current = entry.version if entry is not None and entry.version is not None else max(steps) + 1
            data = _upcast(name, steps, data, from_version, current)
            return data if entry is None else entry.from_dict(data)
        if entry is None:
            return data
        if entry.version is not None:
            if from_version > entry.version:
                raise ValueError(f"written by version {from_version} of {entry.name!r}, but {entry.cls.__qualname__} "
                                 f"is registered with version {entry.version}")
            if from_version < entry.version and entry.upcast is not None:
                data = entry.upcast(data, from_version)
        return entry.from_dict(data)


_SCALARS = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _dataclass_data(obj: Any) -> dict[str, Any]:
    """``dataclasses.asdict(obj)``, without its deep copy when every field holds a JSON scalar (that copy was a
    large part of a bulk read's per-row decoding)."""
    data = {name: getattr(obj, name) for name in _field_names(type(obj))}  # type: ignore[arg-type]  # a type is hashable
    if all(type(v) in _SCALARS for v in data.values()):
        return data
    return dataclasses.asdict(obj)


def _upcast(name: str, steps: dict[int, Callable[[Any], Any]], data: Any, from_version: int, current: int) -> Any:
    """``data`` of version ``from_version`` of ``name`` through the upcasters up to version ``current``."""
    if from_version > current:
        raise ValueError(f"written by version {from_version} of {name!r}, but the current version is {current} "
                         f"(upcasters from versions {_id_list(set(steps))}): unknown version {from_version}")
    for version in range(from_version, current):
        step = steps.get(version)
        if step is None:
            raise ValueError(f"unknown version {from_version} of {name!r}: no upcaster from version {version} "
                             f"(upcasters from versions {_id_list(set(steps))}, current version {current})")
        try:
            data = step(data)
        except Exception as exc:
            raise ValueError(f"the upcaster from version {version} of {name!r} failed on version {from_version} "
                             f"data: {type(exc).__name__}: {exc}") from exc
    return data


def _legacy_33(payload: bytes) -> Any:
    """Id 33 in a database pgjournal wrote before it used Akka's ids: JSON where the payload is JSON, else
    CBOR. No payload Akka's CBOR serializer writes for an object (a CBOR map, first byte 0xa0-0xbf) or array
    is valid UTF-8, let alone JSON; only bare CBOR scalars could be mistaken, and Akka writes those with its
    primitive serializers."""
    try:
        return akka.decode_json(payload)
    except ValueError:
        pass
    try:
        return akka.decode_cbor(payload)
    except ValueError as exc:
        reason = str(exc).removeprefix("not CBOR: ")
        raise ValueError(f"neither JSON (as pgjournal wrote id 33 before revision 0004) nor CBOR: {reason}") from None


def _conversions(cls: type, to_dict: Callable[[Any], Any] | None, from_dict: Callable[[Any], Any] | None,
                 *, json: bool) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    """Dataclasses and pydantic models (found by their methods: no import of pydantic) convert themselves."""
    if to_dict is None:
        if dataclasses.is_dataclass(cls):
            to_dict = dataclasses.asdict
        elif callable(getattr(cls, "model_dump", None)) and callable(getattr(cls, "model_validate", None)):
            mode = "json" if json else "python"
            to_dict = lambda obj: obj.model_dump(mode=mode)  # noqa: E731
            from_dict = from_dict or cls.model_validate  # type: ignore[attr-defined]
        else:
            raise SerializationError(f"{cls.__qualname__} is neither a dataclass nor a pydantic model: pass "
                                     "to_dict and from_dict")
    if from_dict is None:
        def from_dict(data: Any, _cls: type = cls) -> Any:
            if not isinstance(data, dict):
                raise TypeError(f"expected an object for {_cls.__qualname__}, got {type(data).__name__}")
            return _cls(**data)
    return to_dict, from_dict


def _custom(obj: Any, ser_id: int, serializer: Serializer) -> Serialized:
    kind = type(obj)
    try:
        manifest, payload = serializer.to_binary(obj)
    except Exception as exc:
        raise SerializationError(f"serializer {ser_id} could not encode {kind.__qualname__}: {exc}") from exc
    if not isinstance(manifest, str) or not isinstance(payload, bytes | bytearray | memoryview):
        raise SerializationError(
            f"serializer {ser_id} returned ({type(manifest).__name__}, {type(payload).__name__}) for "
            f"{kind.__qualname__}; expected to_binary to return (str manifest, bytes payload)"
        )
    return Serialized(ser_id, manifest, bytes(payload))


def _id_list(ids: set[int] | frozenset[int]) -> str:
    return ", ".join(map(str, sorted(ids)))


def _short(obj: Any) -> str:
    try:
        text = repr(obj)
    except RecursionError:
        return f"<{type(obj).__qualname__} nested too deeply to show>"
    return text if len(text) <= 80 else text[:77] + "..."


def _row(persistence_id: str | None, seq_nr: int | None) -> str:
    """The row named in a decoding error (built only when there is one: readers decode every row)."""
    return f" of persistence id {persistence_id!r} seq_nr {seq_nr}" if persistence_id is not None else ""
