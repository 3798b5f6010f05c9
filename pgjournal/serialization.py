"""Serializer registry: every payload is stored as ``(ser_id, manifest, bytes)``. Nothing is pickled.

Built in: JSON (``ser_id`` 33, Akka's Jackson JSON id, so Akka-written JSON events decode to dicts) for
plain JSON values and registered types, and raw bytes (``ser_id`` 4, Akka's byte-array serializer).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import SerializationError

JSON_SER_ID = 33
BYTES_SER_ID = 4


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
class _JsonType:
    cls: type
    manifest: str
    to_dict: Callable[[Any], Any]
    from_dict: Callable[[Any], Any]


_scan_once = json.JSONDecoder().scan_once


def _loads(payload: bytes) -> Any:
    """``json.loads`` for the common case at a third of its cost (the C scanner without the wrappers);
    anything unusual (leading or trailing text, invalid JSON) goes through ``json.loads`` for its error."""
    text = bytes(payload).decode()
    try:
        value, end = _scan_once(text, 0)
    except StopIteration:
        return json.loads(text)
    return value if end == len(text) else json.loads(text)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class SerializerRegistry:
    """Maps Python types to stored formats and back."""

    def __init__(self) -> None:
        self._json_by_type: dict[type, _JsonType] = {}
        self._json_by_manifest: dict[str, _JsonType] = {}
        self._custom_by_type: dict[type, tuple[int, Serializer]] = {}
        self._custom_by_id: dict[int, Serializer] = {}

    def register(
        self,
        cls: type,
        manifest: str | None = None,
        *,
        to_dict: Callable[[Any], Any] | None = None,
        from_dict: Callable[[Any], Any] | None = None,
    ) -> type:
        """Store ``cls`` as JSON under ``manifest`` (default: the class name). Dataclasses need no functions.

        Usable as a decorator: ``@registry.register``.
        """
        manifest = manifest or cls.__name__
        if to_dict is None:
            if not dataclasses.is_dataclass(cls):
                raise SerializationError(f"{cls.__qualname__} is not a dataclass: pass to_dict and from_dict")
            to_dict = dataclasses.asdict
        if from_dict is None:
            def from_dict(data: Any, _cls: type = cls) -> Any:
                return _cls(**data)
        known = self._json_by_manifest.get(manifest)
        if known is not None and known.cls is not cls:
            raise SerializationError(f"manifest {manifest!r} is already registered for {known.cls.__qualname__}")
        entry = _JsonType(cls, manifest, to_dict, from_dict)
        self._json_by_type[cls] = entry
        self._json_by_manifest[manifest] = entry
        return cls

    def register_serializer(self, ser_id: int, serializer: Serializer, *types: type) -> None:
        """Use ``serializer`` under ``ser_id`` for ``types`` (and for every stored row with that id)."""
        if ser_id in (JSON_SER_ID, BYTES_SER_ID) or not 0 < ser_id < 2**31:
            raise SerializationError(f"ser_id must be a positive int32 other than {JSON_SER_ID} and "
                                     f"{BYTES_SER_ID} (built in), got {ser_id!r}")
        self._custom_by_id[ser_id] = serializer
        for cls in types:
            self._custom_by_type[cls] = (ser_id, serializer)

    def serialize(self, obj: Any) -> Serialized:
        kind = type(obj)
        custom = self._custom_by_type.get(kind)
        if custom is not None:
            ser_id, serializer = custom
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
        if isinstance(obj, bytes | bytearray | memoryview):
            return Serialized(BYTES_SER_ID, "", bytes(obj))
        entry = self._json_by_type.get(kind)
        try:
            if entry is not None:
                return Serialized(JSON_SER_ID, entry.manifest, _dumps(entry.to_dict(obj)))
            return Serialized(JSON_SER_ID, "", _dumps(obj))
        except (TypeError, ValueError, RecursionError) as exc:
            raise SerializationError(
                f"cannot serialize {kind.__qualname__} value {_short(obj)}: {exc}; expected a JSON value "
                "(dict, list, str, int, finite float, bool, None), bytes, or a registered type"
            ) from None

    def deserialize(self, ser_id: int, manifest: str, payload: bytes, *, where: str = "") -> Any:
        try:
            if ser_id == JSON_SER_ID:
                data = _loads(payload)
                entry = self._json_by_manifest.get(manifest)
                return entry.from_dict(data) if entry is not None else data
            if ser_id == BYTES_SER_ID:
                return bytes(payload)
            serializer = self._custom_by_id.get(ser_id)
        except Exception as exc:
            raise SerializationError(f"cannot decode payload{where} (ser_id {ser_id}, manifest {manifest!r}): "
                                     f"{exc}") from exc
        if serializer is None:
            raise SerializationError(
                f"unknown serializer id {ser_id} (manifest {manifest!r}){where}; known ids: "
                f"{', '.join(map(str, sorted({JSON_SER_ID, BYTES_SER_ID, *self._custom_by_id})))}; "
                "register it with register_serializer"
            )
        try:
            return serializer.from_binary(bytes(payload), manifest)
        except Exception as exc:
            raise SerializationError(f"serializer {ser_id} could not decode manifest {manifest!r}{where}: "
                                     f"{exc}") from exc


def _short(obj: Any) -> str:
    try:
        text = repr(obj)
    except RecursionError:
        return f"<{type(obj).__qualname__} nested too deeply to show>"
    return text if len(text) <= 80 else text[:77] + "..."
