"""cowstate.collector: automatic collection paused inside a block (P1-P3)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from cowstate.collector import paused_collector


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    """Each test starts with automatic collection on and leaves it so."""
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_a_pause_turns_automatic_collection_off_and_back_on() -> None:
    with paused_collector():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_pause_ends_when_its_block_raises() -> None:
    # P2
    with pytest.raises(ValueError, match="inside"), paused_collector():
        raise ValueError("inside")
    assert gc.isenabled()


def test_a_pause_leaves_a_collector_that_was_off_off() -> None:
    # P1: only what was on is turned on again
    gc.disable()
    with paused_collector():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_an_inner_pause_does_not_turn_the_collector_back_on() -> None:
    # P1: the last pause to end, not the first
    with paused_collector():
        with paused_collector():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_pauses_in_two_threads_end_when_the_last_one_ends() -> None:
    # P1 across threads: the first thread's pause ends while the second's runs
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with paused_collector():
            first_in.set()
            second_in.wait(10)
        first_out.set()

    def second() -> None:
        first_in.wait(10)
        with paused_collector():
            second_in.set()
            first_out.wait(10)
            seen.append(gc.isenabled())  # the first pause ended, this one has not

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == [False]
    assert gc.isenabled()


def test_a_pause_collects_nothing() -> None:
    # P3: no gc.collect() of its own, before or after
    collections: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.collect()  # the allocation count at 0: no automatic collection is due
    gc.callbacks.append(count)
    try:
        with paused_collector():
            pass
    finally:
        gc.callbacks.remove(count)
    assert collections == []
