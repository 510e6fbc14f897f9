"""nosync.runtime.heap: state restored in bulk is kept out of the cyclic collector's full
passes, and the collector is left as it was found."""

from __future__ import annotations

import gc

import pytest

from nosync.runtime.heap import build_long_lived


@pytest.fixture(autouse=True)
def thawed():
    gc.collect()
    gc.unfreeze()
    was = gc.isenabled()
    yield
    gc.unfreeze()
    if was:
        gc.enable()
    else:
        gc.disable()


def settled() -> None:
    """Everything alive frozen, and a full pass over what is left (nothing): the next full pass
    comes as soon as anything is promoted, whatever the size of the test process."""
    gc.collect()
    gc.freeze()
    gc.collect()


def test_state_built_long_lived_is_frozen_with_no_full_pass_meanwhile():
    """300,000 containers made at once after a freeze (what a worker's loop does first): with
    the collector on, full passes walk them as they grow; inside `build_long_lived`, none runs, and
    they end frozen, out of every later pass."""
    gc.enable()
    settled()
    full = gc.get_stats()[2]["collections"]
    plain = {i: [i] for i in range(300_000)}
    assert gc.get_stats()[2]["collections"] > full, "the collector made no full pass (nothing to compare with)"
    del plain
    settled()
    frozen = gc.get_freeze_count()
    full = gc.get_stats()[2]["collections"]
    with build_long_lived():
        state = {i: [i] for i in range(300_000)}
    assert gc.get_stats()[2]["collections"] == full
    assert gc.get_freeze_count() >= frozen + 300_000
    assert gc.isenabled()
    assert len(state) == 300_000


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_left_as_it_was_found_even_when_the_build_fails(enabled):
    if enabled:
        gc.enable()
    else:
        gc.disable()
    with pytest.raises(ValueError, match="bad state"), build_long_lived():
        assert not gc.isenabled()
        raise ValueError("bad state")
    assert gc.isenabled() is enabled
