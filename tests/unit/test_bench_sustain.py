"""The judgement of `nosync bench sustain` (experiments/bench/sustain.py): a backlog computed
from samples written here (records due at a known rate minus records read), and the refusal
of a window too short for a steady state."""

from __future__ import annotations

import pytest

from experiments.bench.sustain import backlog_growth, check_window, sustained
from nosync.errors import NosyncError


def samples(rate_read: float, t0: float = 100.0, seconds: float = 60.0, every: float = 0.25):
    return [(t0 + i * every, int(rate_read * i * every)) for i in range(int(seconds / every) + 1)]


def test_a_run_that_keeps_up_has_no_growing_backlog():
    g = backlog_growth(samples(10_000), 100.0, 10_000, 110.0, 160.0)
    assert abs(g["slope"]) < 1.0
    assert sustained(g, 10_000)


def test_a_run_that_reads_slower_than_the_input_falls_behind():
    # reads 9,000 of 10,000 due each second: the backlog grows by 1,000/s
    g = backlog_growth(samples(9_000), 100.0, 10_000, 110.0, 160.0)
    assert g["slope"] == pytest.approx(1_000, rel=0.01)
    assert not sustained(g, 10_000)


def test_a_constant_backlog_of_more_than_a_second_of_input_is_not_sustained():
    lagging = [(t, max(0, read - 25_000)) for t, read in samples(10_000)]
    g = backlog_growth(lagging, 100.0, 10_000, 110.0, 160.0)
    assert abs(g["slope"]) < 1.0 and g["end"] == pytest.approx(25_000, abs=1)
    assert not sustained(g, 10_000)


def test_too_few_samples_say_nothing():
    g = backlog_growth(samples(10_000, seconds=1.0), 100.0, 10_000, 110.0, 160.0)
    assert g["slope"] is None and not sustained(g, 10_000)


def test_a_window_of_fewer_than_30_intervals_is_refused_saying_what_it_needs():
    with pytest.raises(NosyncError, match=r"--window-s 60 or more"):
        check_window(20.0, 2000)
    check_window(30.0, 1000)


def test_a_comparison_of_runs_shorter_than_30_intervals_is_refused_with_the_records_it_needs():
    from experiments.bench.compare import _check_long_enough

    # 2,000,000 records at 1,000,000/s: 2 s, 2 intervals of 1 s; 30 s needs 30,000,000
    with pytest.raises(NosyncError, match=r"--records 30,000,001 or more"):
        _check_long_enough("none", 2_000_000, 1_000_000.0, 1000)
    _check_long_enough("none", 40_000_000, 1_000_000.0, 1000)
