"""A bounded LRU cache of recent entities."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class LruCache(Generic[V]):
    """At most ``capacity`` entries; the least recently used goes first. ``capacity=0`` caches nothing."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: str, value: V) -> None:
        if self.capacity == 0:
            return
        with self._lock:
            self._put(key, value)

    def _put(self, key: str, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def put_if_newer(self, key: str, value: V, newer: Callable[[V, V], bool]) -> None:
        """Put ``value`` unless the cached one is at least as new (``newer(old, value)`` is false)."""
        if self.capacity == 0:
            return
        with self._lock:
            old = self._items.get(key)
            if old is None or newer(old, value):
                self._put(key, value)

    def drop(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def __len__(self) -> int:
        return len(self._items)
