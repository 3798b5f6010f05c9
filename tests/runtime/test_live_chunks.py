"""A live query's items taken in chunks (``ready``): what one poll read and is there without another, an item
that fails to be made staying first, as it does for ``next``."""

from __future__ import annotations

from typing import Any

import pytest

from pgjournal.runtime.live import LiveQuery, Made, Schedule


class Poison(Exception):
    pass


def make(datum: Any) -> Any:
    if datum == "poison":
        raise Poison(datum)
    return datum


def live_of(pages: list[list[Any]]) -> tuple[LiveQuery[Any], list[int]]:
    polls: list[int] = []

    def poll(_notified: bool) -> tuple[Made[Any, Any], int]:
        polls.append(1)
        page = pages.pop(0) if pages else []
        return Made(page, make), len(page)

    return LiveQuery(poll, Schedule(buffer_size=4, refresh_interval=0.01)), polls


def test_ready_takes_what_the_page_holds_and_never_polls() -> None:
    live, polls = live_of([[1, 2, 3, 4], [5]])
    assert next(live) == 1
    assert live.ready(2) == [2, 3]
    assert live.ready(10) == [4]
    assert live.ready(10) == [] and len(polls) == 1  # the page is out: the next poll is next()'s to make
    assert next(live) == 5 and len(polls) == 2
    live.close()


def test_an_item_that_fails_to_be_made_ends_the_chunk_and_is_raised_by_the_next_take() -> None:
    live, _ = live_of([[1, 2, "poison", 4]])
    assert next(live) == 1
    assert live.ready(10) == [2]
    assert live.ready(10) == []  # the failing item is first: a chunk ends before it
    with pytest.raises(Poison):
        next(live)
    with pytest.raises(Poison):  # still first: nothing after it was skipped
        next(live)
    live.close()
