"""Instances of frozen, slotted dataclasses made from values already checked, without ``__init__``: a reader or a
rule that makes one per event fills the slots through their descriptors' setters (a third of what the frozen
``__init__``'s ``object.__setattr__`` per field costs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

_T = TypeVar("_T")
_new = object.__new__

Setters = tuple[Callable[[Any, Any], None], ...]


def setters(cls: type, *names: str) -> Setters:
    """The slots ``names`` of ``cls``, each as its descriptor's setter, in that order (for :func:`filled`)."""
    return tuple(getattr(cls, name).__set__ for name in names)


def filled(cls: type[_T], slots: Setters, *values: Any) -> _T:
    """An instance of ``cls`` with ``slots`` (:func:`setters`) set to ``values``, as they are: no checks."""
    made: _T = _new(cls)
    for set_slot, value in zip(slots, values, strict=False):  # the callers' pairs: one value per setter
        set_slot(made, value)
    return made
