"""Checks of user input before anything reaches the database; each error names the value and the rule."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable
from typing import Any

from pgjournal.errors import ConfigurationError, InvalidArgument, InvalidPersistenceId, JournalError

MAX_NAME_LENGTH = 255


def check_persistence_id(persistence_id: Any) -> str:
    if not isinstance(persistence_id, str):
        raise InvalidPersistenceId(f"persistence id must be a string, got {type(persistence_id).__name__} "
                                   f"{persistence_id!r}")
    if not persistence_id:
        raise InvalidPersistenceId("persistence id must not be empty")
    if len(persistence_id) > MAX_NAME_LENGTH:
        raise InvalidPersistenceId(
            f"persistence id must be at most {MAX_NAME_LENGTH} characters, got {len(persistence_id)}: "
            f"{persistence_id[:40]!r}..."
        )
    if "\x00" in persistence_id:
        raise InvalidPersistenceId(f"persistence id must not contain NUL characters, got {persistence_id!r}")
    try:
        persistence_id.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPersistenceId(f"persistence id must be valid Unicode (no lone surrogates), got "
                                   f"{persistence_id!r}") from None
    return persistence_id


def check_name(value: Any, what: str, *, error: type[JournalError] = InvalidArgument,
               max_length: int = MAX_NAME_LENGTH) -> str:
    """A tag, entity type, projection name, manifest or writer id: a non-empty string that fits its column
    (``max_length`` characters) without NUL and encodable as UTF-8; else ``error`` naming the value."""
    if not isinstance(value, str) or not value or len(value) > max_length or "\x00" in value:
        shown = f"{value[:40]!r}... ({len(value)} characters)" if isinstance(value, str) and len(value) > 60 \
            else repr(value)
        raise error(f"{what} must be a non-empty string of at most {max_length} characters without NUL, "
                    f"got {shown}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise error(f"{what} must be valid Unicode (no lone surrogates), got {value!r}") from None
    return value


def load_json(text: str) -> Any:
    """``json.loads`` whose every failure is a ``ValueError``: nesting too deep for the parser (a
    ``RecursionError``) is refused like malformed JSON (an integer of too many digits already is a ValueError)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested too deeply ({len(text):,} characters)") from None


def check_seconds(value: Any, what: str, *, error: type[JournalError] = InvalidArgument) -> float:
    """A duration in seconds: a finite number > 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise error(f"{what} must be a number of seconds > 0, got {value!r}")
    return float(value)


def check_tags(tags: Iterable[str] | str) -> tuple[str, ...]:
    if isinstance(tags, str):
        raise InvalidArgument(f"tags must be a collection of strings, not a single string {tags!r}")
    try:
        items = tuple(tags)
    except TypeError:
        raise InvalidArgument(f"tags must be a collection of strings, got {tags!r}") from None
    return tuple(dict.fromkeys(check_name(tag, "tag") for tag in items))


def check_tag_filter(tags: Iterable[str] | str | None) -> tuple[str, ...] | None:
    """A query's tag filter: ``None`` (every event) or a non-empty collection of tags (events carrying any of them)."""
    if tags is None:
        return None
    checked = check_tags(tags)
    if not checked:
        raise InvalidArgument(f"tags must name at least one tag (or be None for every event), got {tags!r}")
    return checked


#: Tag tuples that passed :func:`check_tags`, as it returned them (appends tag their events with a few fixed
#: tuples: checking one again is client CPU on every tagged append).
_CHECKED_TAGS: dict[tuple[str, ...], tuple[str, ...]] = {}
_CHECKED_TAGS_KEPT = 1024


def checked_tags(tags: Iterable[str] | str) -> tuple[str, ...]:
    """:func:`check_tags`, remembered for tuples of strings."""
    if tags.__class__ is not tuple:
        return check_tags(tags)
    try:
        return _CHECKED_TAGS[tags]
    except KeyError:
        pass
    except TypeError:  # an unhashable element: check_tags names it
        return check_tags(tags)
    checked = check_tags(tags)
    if len(_CHECKED_TAGS) >= _CHECKED_TAGS_KEPT:
        _CHECKED_TAGS.clear()
    _CHECKED_TAGS[tags] = checked
    return checked


def check_seq_nr(value: Any, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or value >= 2**63:
        raise InvalidArgument(f"{what} must be an integer from {minimum} to 2**63-1, got {value!r}")
    return value


def check_positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{what} must be a positive integer, got {value!r}")
    return value


def load_attribute(spec: str, what: str, shape: str = "package.module:attribute") -> Callable[..., Any]:
    """The callable ``module:attribute`` names (a handler factory, a replication filter), imported now; a
    :class:`~pgjournal.errors.ConfigurationError` naming ``what`` and ``spec`` when it cannot be."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"{what} must look like {shape}, got {spec!r}")
    try:
        found = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"cannot load {what} {spec!r}: {exc}") from None
    if not callable(found):
        raise ConfigurationError(f"{what} {spec!r} is not callable")
    loaded: Callable[..., Any] = found
    return loaded
