"""The shopping cart: an event-sourced entity with domain rules, and a threaded workload for the demo.

Rules: a quantity is 1..99; an item is added once (then its quantity is adjusted); only items in the cart
can be removed or adjusted; an empty cart cannot be checked out; a checked-out cart accepts no changes.

    carts = EntityRepository(journal, ShoppingCart)
    carts.handle("cart-1", AddItem("socks", 2))
    carts.handle("cart-1", CheckOut()).state.checked_out  # True
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from pgjournal.entity import CommandResult, DomainError, Entity, EntityRepository, persist
from pgjournal.journal import Journal

MAX_QUANTITY = 99


# -- commands --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AddItem:
    item_id: str
    quantity: int


@dataclass(frozen=True)
class RemoveItem:
    item_id: str


@dataclass(frozen=True)
class AdjustQuantity:
    item_id: str
    quantity: int


@dataclass(frozen=True)
class CheckOut:
    pass


@dataclass(frozen=True)
class GetCart:
    pass


# -- events (stored as JSON under the manifests "cart.ItemAdded", ...) ---------------------------------

@dataclass(frozen=True)
class ItemAdded:
    item_id: str
    quantity: int


@dataclass(frozen=True)
class ItemRemoved:
    item_id: str


@dataclass(frozen=True)
class QuantityAdjusted:
    item_id: str
    quantity: int


@dataclass(frozen=True)
class CheckedOut:
    total_quantity: int


# -- state -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cart:
    items: dict[str, int] = field(default_factory=dict)
    checked_out: bool = False

    @property
    def total_quantity(self) -> int:
        return sum(self.items.values())


class CartRejected(DomainError):
    """A cart command broke a rule; nothing was persisted."""


def _check_quantity(quantity: Any) -> None:
    if isinstance(quantity, bool) or not isinstance(quantity, int) or not 1 <= quantity <= MAX_QUANTITY:
        raise CartRejected(f"quantity must be an integer from 1 to {MAX_QUANTITY}, got {quantity!r}")


class ShoppingCart(Entity[Cart]):
    name = "cart"
    initial_state = Cart()
    types = (ItemAdded, ItemRemoved, QuantityAdjusted, CheckedOut, Cart)

    def handle(self, cart: Cart, command: Any) -> Any:
        if isinstance(command, GetCart):
            return persist(reply=cart)
        if cart.checked_out:
            raise CartRejected(f"the cart is checked out: {type(command).__name__} is not allowed")
        match command:
            case AddItem(item_id, quantity):
                _check_quantity(quantity)
                if item_id in cart.items:
                    raise CartRejected(f"item {item_id!r} is already in the cart; adjust its quantity instead")
                return persist(ItemAdded(item_id, quantity), reply="added")
            case RemoveItem(item_id) | AdjustQuantity(item_id) if item_id not in cart.items:
                raise CartRejected(f"item {item_id!r} is not in the cart")
            case RemoveItem(item_id):
                return persist(ItemRemoved(item_id), reply="removed")
            case AdjustQuantity(item_id, quantity):
                _check_quantity(quantity)
                return persist(QuantityAdjusted(item_id, quantity), reply="adjusted")
            case CheckOut():
                if not cart.items:
                    raise CartRejected("an empty cart cannot be checked out")
                return persist(CheckedOut(cart.total_quantity), reply="checked out")
        raise CartRejected(f"unknown cart command {command!r}")

    def apply(self, cart: Cart, event: Any) -> Cart:
        match event:
            case ItemAdded(item_id, quantity) | QuantityAdjusted(item_id, quantity):
                return replace(cart, items={**cart.items, item_id: quantity})
            case ItemRemoved(item_id):
                return replace(cart, items={k: v for k, v in cart.items.items() if k != item_id})
            case CheckedOut():
                return replace(cart, checked_out=True)
        raise ValueError(f"unknown cart event {event!r}")


# -- the demo workload -----------------------------------------------------------------------------

CATALOGUE = ("socks", "t-shirt", "mug", "poster", "hoodie", "cap", "sticker", "notebook")


@dataclass
class WorkloadCounts:
    commands: int = 0
    accepted: int = 0
    #: Commands the cart's rules refused (nothing persisted).
    rejected: int = 0
    #: Commands that failed otherwise (database unavailable, ...); nothing of them was written.
    failed: int = 0
    events: int = 0
    checkouts: int = 0

    def add(self, other: WorkloadCounts) -> None:
        for name in ("commands", "accepted", "rejected", "failed", "events", "checkouts"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def random_command(rng: random.Random, in_cart: frozenset[str] = frozenset()) -> Any:
    """A plausible next command for a cart believed to hold ``in_cart``; about one in ten breaks a rule."""
    roll = rng.random()
    wrong = rng.random() < 0.07  # pick an item that makes the command fail
    absent = [item for item in CATALOGUE if item not in in_cart]
    present = sorted(in_cart)
    if roll < 0.02:
        return AddItem(rng.choice(CATALOGUE), 0)  # breaks the quantity rule
    if roll < 0.55 or not present:
        pool = present if wrong and present else absent or list(CATALOGUE)
        return AddItem(rng.choice(pool), rng.randint(1, 3))
    item = rng.choice(absent if wrong and absent else present)
    if roll < 0.72:
        return AdjustQuantity(item, rng.randint(1, 5))
    if roll < 0.85:
        return RemoveItem(item)
    return CheckOut()


OnCommand = Callable[[str, Any, "CommandResult[Cart] | Exception"], None]


def run_workload(
    journal: Journal,
    *,
    carts: int = 100,
    threads: int = 4,
    commands: int = 1000,
    on_command: OnCommand | None = None,
    seed: int | None = None,
    stop: threading.Event | None = None,
    repository: EntityRepository[Cart] | None = None,
) -> WorkloadCounts:
    """Send ``commands`` random cart commands from ``threads`` threads to ``carts`` open carts at a time
    (entity ids ``cart-<slot>-<n>``: a checked-out cart is replaced by a fresh one). Some commands break
    the rules on purpose. ``on_command(cart_id, command, result_or_exception)`` sees each one; ``stop``
    ends the run early. Returns the counts."""
    repo = repository or EntityRepository(journal, ShoppingCart)
    base = random.Random(seed)
    seeds = [base.random() for _ in range(threads)]
    shares = [commands // threads + (1 if i < commands % threads else 0) for i in range(threads)]
    generations = [0] * carts
    contents: list[frozenset[str]] = [frozenset()] * carts  # what each slot's cart last held, as far as we saw
    slots_lock = threading.Lock()

    def worker(index: int) -> WorkloadCounts:
        rng = random.Random(seeds[index])
        counts = WorkloadCounts()
        for _ in range(shares[index]):
            if stop is not None and stop.is_set():
                break
            slot = rng.randrange(carts)
            with slots_lock:
                generation, in_cart = generations[slot], contents[slot]
            cart_id = f"cart-{slot}-{generation}"
            command = random_command(rng, in_cart)
            counts.commands += 1
            outcome: CommandResult[Cart] | Exception
            try:
                outcome = repo.handle(cart_id, command)
            except DomainError as exc:
                counts.rejected += 1
                outcome = exc
            except Exception as exc:
                counts.failed += 1
                outcome = exc
            else:
                counts.accepted += 1
                counts.events += len(outcome.events)
                with slots_lock:
                    if outcome.state.checked_out:
                        counts.checkouts += 1
                        if generations[slot] == generation:  # the next command to this slot: a fresh cart
                            generations[slot], contents[slot] = generation + 1, frozenset()
                    elif generations[slot] == generation:
                        contents[slot] = frozenset(outcome.state.items)
            if on_command is not None:
                on_command(cart_id, command, outcome)
        return counts

    total = WorkloadCounts()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="cart") as pool:
        for counts in pool.map(worker, range(threads)):
            total.add(counts)
    return total
