"""The recovery times a run derives from its progress samples (nosync.metrics)."""

import os
import random

import pyarrow.parquet as pq
import pytest

from nosync.driver import metrics
from nosync.driver.rows import RowLog, to_parquet


def _row(t, worker, read, attempt=0, positioned=True):
    return {"t": t, "worker": worker, "attempt": attempt, "positioned": positioned, "read": read, "committed": 0}


def _caught_up(rows, **rec):
    recs = [{"worker": 1, "attempt": 0, "lost_at": 10.05, **rec}]
    metrics.add_recovery_times(recs, [], 0.0, rows)
    return recs[0]["caught_up_s"]


def test_stale_count_of_the_lost_attempt_does_not_count_as_caught_up():
    rows = [_row(10.0, 0, 500), _row(10.0, 1, 400)]
    # after the loss the samples keep worker 1's last count (its lost attempt's)
    rows += [_row(10.1, 0, 520), _row(10.1, 1, 400)]
    # its retry registers, not yet restored
    rows += [_row(10.2, 0, 540), _row(10.2, 1, 400, attempt=1, positioned=False)]
    # restored at 300, reads on
    rows += [_row(10.3, 0, 560), _row(10.3, 1, 300, attempt=1)]
    rows += [_row(10.4, 0, 580), _row(10.4, 1, 399, attempt=1)]
    rows += [_row(10.5, 0, 600), _row(10.5, 1, 400, attempt=1)]
    assert abs(_caught_up(rows) - 0.45) < 1e-9


def test_a_rollback_waits_for_every_worker_and_for_the_restore():
    rows = [_row(10.0, 0, 500), _row(10.0, 1, 400)]
    rows += [_row(10.1, 0, 500), _row(10.1, 1, 300, attempt=1)]
    # worker 0 has not yet reported its rolled-back position: restored_at says when it had
    rows += [_row(10.2, 0, 501), _row(10.2, 1, 450, attempt=1)]
    rows += [_row(10.3, 0, 200), _row(10.3, 1, 460, attempt=1)]
    rows += [_row(10.4, 0, 500), _row(10.4, 1, 470, attempt=1)]
    assert abs(_caught_up(rows, restored_at=10.25) - 0.35) < 1e-9


def test_a_run_that_ends_before_catching_up_has_none():
    rows = [_row(10.0, 0, 500), _row(10.0, 1, 400), _row(10.1, 0, 600), _row(10.1, 1, 100, attempt=1)]
    assert _caught_up(rows) is None


# -- streamed series: the same times from a file read once, in bounded memory ------------------


def _model(recoveries, samples, launched, rows):
    """The recovery times as computed with every sample and row in memory (the list-based
    computation the streaming one replaced), for comparison."""
    for rec in recoveries:
        by_t: dict[float, dict[int, dict]] = {}
        for r in rows:
            by_t.setdefault(r["t"], {})[r["worker"]] = r
        times = sorted(by_t)
        lost = rec["lost_at"]
        rec["caught_up_s"] = None
        need = {w: r["read"] for t in times if t < lost for w, r in by_t[t].items()}
        if need:
            start = max(lost, rec.get("restored_at", lost))
            for t in times:
                if t <= start:
                    continue
                now = by_t[t]
                again = now.get(rec["worker"], {})
                if again.get("attempt", 0) <= rec.get("attempt", 0) or not again.get("positioned", True):
                    continue
                if all(now.get(w, {}).get("read", 0) >= n for w, n in need.items()):
                    rec["caught_up_s"] = t - lost
                    break
    pts = [(s["t"], s["read"]) for s in samples]
    for rec in recoveries:
        lost = rec["lost_at"] - launched
        before = metrics.read_rate(pts, lost - 3.0, lost)
        rec["back_to_90_s"] = None
        if not before or "restored_at" not in rec:
            continue
        for t, _ in pts:
            if t >= rec["restored_at"] - launched:
                now = metrics.read_rate(pts, t, t + 1.0)
                if now is not None and now >= 0.9 * before:
                    rec["back_to_90_s"] = t - lost
                    break


def _a_run(rng: random.Random, launched: float):
    """Random samples, per-worker rows and recoveries of a run of two workers with losses."""
    losses = sorted(rng.uniform(2.0, 40.0) for _ in range(rng.randint(1, 4)))
    recoveries = []
    for lost in losses:
        rec = {"worker": rng.randint(0, 1), "attempt": 0, "lost_at": launched + lost}
        if rng.random() < 0.8:
            rec["restored_at"] = launched + lost + rng.uniform(-0.3, 3.0)
        recoveries.append(rec)
    samples, rows = [], []
    read = {0: 0, 1: 0}
    attempt = {0: 0, 1: 0}
    t = 0.0
    while t < 50.0:
        t += rng.choice((0.1, 0.1, 0.1, 0.05))
        for lost, rec in zip(losses, recoveries, strict=True):
            if t - 0.1 < lost <= t:
                w = rec["worker"]
                read[w] = max(0, read[w] - rng.randint(0, 3000))
                attempt[w] += 1
        for w in (0, 1):
            read[w] += rng.choice((0, 50, 100, 100, 150))
            rows.append(
                {
                    "t": launched + t,
                    "worker": w,
                    "attempt": attempt[w],
                    "positioned": rng.random() < 0.9,
                    "read": read[w],
                    "committed": 0,
                }
            )
        if rng.random() < 0.4:
            samples.append({"t": round(t, 6), "read": read[0] + read[1], "committed": 0})
    for rec in recoveries:
        if "restored_at" in rec and rng.random() < 0.5:
            # restored at the very time of a row: that row is not yet after the restore
            rec["restored_at"] = next(r["t"] for r in rows if r["t"] > rec["restored_at"])
    return recoveries, samples, rows


@pytest.mark.parametrize("seed", range(40))
def test_streamed_recovery_times_are_the_model_s(seed, tmp_path):
    rng = random.Random(seed)
    launched = 1_000.0
    recoveries, samples, rows = _a_run(rng, launched)
    want = [dict(r) for r in recoveries]
    _model(want, samples, launched, rows)
    got = [dict(r) for r in recoveries]
    # as the runner gives them: series streamed to files, read back a row at a time
    sample_log, row_log = RowLog(str(tmp_path / "throughput.jsonl"), keep=3), RowLog(str(tmp_path / "p.jsonl"), keep=3)
    sample_log.extend(samples)
    for r in rows:
        row_log.append(r)
    sample_log.close()
    metrics.add_recovery_times(got, sample_log, launched, row_log)
    assert got == want, f"seed {seed}"
    assert len(sample_log.tail) == 3


def test_a_series_becomes_its_parquet_table_a_row_group_at_a_time(tmp_path):
    log = RowLog(str(tmp_path / "progress.jsonl"), keep=5)
    made = [{"t": i / 10, "worker": i % 2, "read": i * 7, "late": None if i < 30 else i / 2} for i in range(100)]
    log.extend(made[:50])
    log.close()
    log.extend(made[50:])  # appended after a close: the file takes it
    path = str(tmp_path / "progress.parquet")
    assert to_parquet(log, path, batch_rows=16) == 100
    f = pq.ParquetFile(path)
    assert f.metadata.num_row_groups == 7
    assert f.read().to_pylist() == made
    log.remove()
    assert not os.path.exists(tmp_path / "progress.jsonl")
    assert to_parquet([], str(tmp_path / "empty.parquet")) == 0
    assert not os.path.exists(tmp_path / "empty.parquet")
