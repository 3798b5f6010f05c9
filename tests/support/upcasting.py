"""Three versions of one event type and the registry of each application version, shared by the upcasting tests and
Spark's decoding tests (whose workers get them by value, as a module of no installed distribution)."""

from __future__ import annotations

from dataclasses import dataclass

from pgjournal import SerializerRegistry

NAME = "com.example.ItemAdded"


@dataclass(frozen=True)
class ItemAddedV1:  # version 1: {"name": ...}, manifest without '#'
    name: str


@dataclass(frozen=True)
class ItemAddedV2:  # version 2: the field renamed
    item: str


@dataclass(frozen=True)
class ItemAdded:  # version 3, the current one: a quantity
    item: str
    quantity: int


def registry_v(version: int) -> SerializerRegistry:
    """The registry of the application at ``version`` (as that version of it wrote events)."""
    reg = SerializerRegistry()
    if version == 1:
        reg.register(ItemAddedV1, NAME)
    elif version == 2:
        reg.register(ItemAddedV2, NAME, version=2)
    else:
        reg.register(ItemAdded, NAME, version=3)
        reg.register_upcaster(NAME, 1, lambda d: {"item": d["name"]})
        reg.register_upcaster(NAME, 2, lambda d: {**d, "quantity": 1})
    return reg
