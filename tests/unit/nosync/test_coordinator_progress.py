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
