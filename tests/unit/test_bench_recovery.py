"""`nosync bench recovery` in the steady-state regime (experiments/bench/recovery.py,
experiments/measure.py): when the backlog of a paced run drained after a kill, from samples
written here (records due at a known rate minus records read), and the refusals of a run too
short for 30 intervals, of --records with --rate, and of a kill before the state is whole."""

from __future__ import annotations

import subprocess

from support.paths import NOSYNC, ROOT

from experiments.measure import drained_after

RATE, T0 = 10_000.0, 100.0


def reading(phases: list[tuple[float, float]], every: float = 0.25) -> list[tuple[float, int]]:
    """(wall time, records read) samples of a run reading at each (until, records/s) in turn,
    from T0."""
    out, t, read = [(T0, 0)], T0, 0.0
    for until, per_s in phases:
        while t + every <= until + 1e-9:
            t += every
            read += per_s * every
            out.append((t, int(read)))
    return out


def test_the_backlog_drains_when_reading_made_up_for_the_time_lost():
    # keeps up until 130, reads nothing for 2 s, then 20,000/s: 20,000 records behind at 132,
    # made up 10,000 a second, so back at 134 (within a tenth of a second of input just after)
    samples = reading([(130, RATE), (132, 0), (140, 2 * RATE)])
    drained = drained_after(samples, T0, RATE, 130.0)
    assert 3.75 <= drained <= 4.0


def test_a_backlog_that_never_drains_has_no_time():
    samples = reading([(130, RATE), (132, 0), (150, RATE)])
    assert drained_after(samples, T0, RATE, 130.0) is None


def test_a_kill_that_left_no_backlog_drained_at_once():
    assert drained_after(reading([(150, RATE)]), T0, RATE, 130.0) == 0.0


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*NOSYNC, "bench", "recovery", "--modes", "nosync", *args], cwd=ROOT, capture_output=True, text=True
    )


def test_a_paced_run_shorter_than_30_intervals_is_refused():
    got = bench("--rate", "1000", "--keys", "1000", "--duration", "20", "--interval-ms", "1000")
    assert got.returncode == 2, got.stderr
    assert "--duration 30 or more" in got.stderr


def test_records_and_rate_together_are_refused():
    got = bench("--rate", "1000", "--records", "5000")
    assert got.returncode == 2, got.stderr
    assert "not both" in got.stderr


def test_a_kill_before_every_key_has_its_state_is_refused():
    # 1M keys at 2 x 1,000 records/s: 500 s of input before the state is whole
    got = bench("--rate", "1000", "--keys", "1000000", "--duration", "60", "--kill-at-s", "30")
    assert got.returncode == 2, got.stderr
    assert "--kill-at-s 30" in got.stderr and "500.0 s of input" in got.stderr
