"""The run's starting heap is frozen for the run and thawed after, and nobody else's freeze is undone."""

import gc
import weakref

import pytest

from batch_pipeline.core.run.heap import frozen_heap


class Cycle:
    def __init__(self) -> None:
        self.me = self


def test_the_heap_alive_at_the_start_is_frozen_for_the_block_and_thawed_after():
    assert gc.get_freeze_count() == 0
    with frozen_heap() as froze:
        assert froze and gc.get_freeze_count() > 1000  # the interpreter's and pytest's objects at least
    assert gc.get_freeze_count() == 0


def test_it_thaws_when_the_block_raises():
    with pytest.raises(RuntimeError), frozen_heap():
        raise RuntimeError("the run failed")
    assert gc.get_freeze_count() == 0


def test_garbage_made_inside_the_block_is_still_collected():
    with frozen_heap():
        cycle = Cycle()
        alive = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert alive() is None


def test_garbage_made_before_the_block_is_collected_after_it():
    cycle = Cycle()
    alive = weakref.ref(cycle)
    del cycle
    with frozen_heap():
        gc.collect()  # frozen with the rest (unless collected before the freeze): kept until the thaw
    gc.collect()
    assert alive() is None


def test_a_heap_someone_else_froze_is_left_frozen():
    gc.freeze()
    try:
        with frozen_heap() as froze:
            assert not froze
        assert gc.get_freeze_count() > 0  # not thawed by a block that did not freeze it (the count moves as frozen
        # objects are freed by their reference counts)
    finally:
        gc.unfreeze()


def test_nothing_is_frozen_while_the_collector_is_off():
    gc.disable()
    try:
        with frozen_heap() as froze:
            assert not froze and gc.get_freeze_count() == 0
    finally:
        gc.enable()
