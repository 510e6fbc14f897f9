"""The coordinator's per-worker series (progress.parquet) shows a restarted worker's drop to
its restored position whole, however its heartbeats fall against the series' samples."""

from __future__ import annotations

import pytest

from nosync.driver.coordinator import Coordinator
from nosync.modes import get_mode
from nosync.runtime import control


@pytest.fixture
def coordinator():
    c = Coordinator(1, b"the run's secret", get_mode("none"), "run-1")
    yield c
    c.close()


def beat(c: Coordinator, read: int | None) -> None:
    c._handle(0, None, control.Heartbeat(0, {"worker": 0, "read": read, "committed": 0}))


def test_a_restored_position_is_in_the_series_though_the_next_heartbeat_reads_on(coordinator):
    # the lost attempt had read 1000; the restarted one reports nothing until its restore,
    # then its restored position, 200, and 0.1 s later 260: the restored position must be in
    # the series even when no sample falls between the two heartbeats
    for read in (1000, None, 200, 260):
        beat(coordinator, read)
    mine = [r["read"] for r in coordinator.progress_rows if r["worker"] == 0]
    assert 200 in mine, mine
    assert coordinator.counters[0]["read"] == 260


def test_a_changed_durable_point_sets_when_the_coordinator_wakes_to_broadcast_it():
    """The coordinator's loop waits for messages at most as long as the mode's tick can wait
    (`Mode.due_in`): nothing while no durable point changed; a changed one no later than
    BROADCAST_GAP_S after the last broadcast; nothing again once the tick broadcast it."""
    from nosync.modes.nosync.driver import BROADCAST_GAP_S
    from nosync.modes.nosync.messages import NosyncOp

    c = Coordinator(1, b"the run's secret", get_mode("nosync"), "run-1")
    try:
        mode = c.mode
        assert mode.due_in(c) is None
        point = {"step": 3, "frontier": 1, "lstep": 3, "consumed": {}, "produced": {}}
        mode.on_message(c, 0, {"op": NosyncOp.DURABLE, "gen": 0, "point": point})
        due = mode.due_in(c)
        assert due is not None and due <= BROADCAST_GAP_S
        mode.tick(c)
        assert mode.safe == 1
        assert mode.due_in(c) is None
    finally:
        c.close()
