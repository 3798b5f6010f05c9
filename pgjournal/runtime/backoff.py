"""How long to wait before trying again: one exponential backoff rule for every retry loop of pgjournal.

A :class:`Backoff` is a value (a frozen dataclass) that names its curve: the first delay, the factor it grows by
per attempt, the most it grows to, and how much of it is random. Each loop that waits (a write retried after a
serialization failure, a live query's failed poll, a listener reconnecting, a projection handler retried) holds
one and asks it for the delay of attempt *n*; the loop keeps its own count and decides when to give up.

Jitter spreads the waiters that failed together: ``jitter=0.5`` is "equal jitter" (between half and all of the
delay: it still grows, and writers that collided come back apart), ``jitter=1`` "full jitter" (anything up to
the delay, for conflicts that are best retried soon). The random draw is a parameter, so tests are deterministic.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from pgjournal.errors import InvalidArgument

#: Attempts past this grow no further (``factor ** attempt`` would overflow long before any wait matters).
_MOST_DOUBLINGS = 60


@dataclass(frozen=True, slots=True)
class Backoff:
    """The delay before attempt *n* (1 for the first retry): ``min(maximum, initial * factor ** (n - 1))``, of
    which the fraction ``jitter`` is drawn at random (the delay is then between ``(1 - jitter)`` times it and
    all of it)."""

    #: Seconds before the first retry (before jitter).
    initial: float
    #: What each further attempt multiplies the delay by (1: a constant delay).
    factor: float = 2.0
    #: The most seconds a delay grows to (before jitter).
    maximum: float = math.inf
    #: The random part of each delay, from 0 (none) to 1 (anything from 0 to the delay).
    jitter: float = 0.0

    def __post_init__(self) -> None:
        for name, value, low in (("initial", self.initial, 0.0), ("factor", self.factor, 1.0),
                                 ("maximum", self.maximum, 0.0), ("jitter", self.jitter, 0.0)):
            if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value < low:
                raise InvalidArgument(f"Backoff.{name} must be a number >= {low:g}, got {value!r}")
        if self.jitter > 1:
            raise InvalidArgument(f"Backoff.jitter must be between 0 and 1, got {self.jitter!r}")
        if math.isinf(self.initial):
            raise InvalidArgument(f"Backoff.initial must be a finite number of seconds, got {self.initial!r}")

    def ceiling(self, attempt: int) -> float:
        """The delay of attempt ``attempt`` (1 for the first) before jitter: the most :meth:`delay` returns."""
        if attempt < 1:
            raise InvalidArgument(f"a backoff's attempt is counted from 1, got {attempt!r}")
        try:
            grown = self.initial * self.factor ** min(attempt - 1, _MOST_DOUBLINGS)
        except OverflowError:
            grown = math.inf
        return float(min(self.maximum, grown))

    def delay(self, attempt: int, draw: Callable[[], float] = random.random) -> float:
        """Seconds to wait before attempt ``attempt`` (1 for the first), with its jitter drawn from ``draw``
        (a number in [0, 1), :func:`random.random` unless a test gives its own)."""
        ceiling = self.ceiling(attempt)
        if not self.jitter:
            return ceiling
        return ceiling * (1.0 - self.jitter * draw())

    def total(self, attempts: int) -> float:
        """The longest ``attempts`` retries wait in all (every delay at its ceiling)."""
        return float(sum(self.ceiling(n) for n in range(1, attempts + 1)))
