"""The experiment harness and report without Spark: grids, overrides, aggregation, readings,
and the figures of every experiment drawn from hand-made rows."""

from __future__ import annotations

import os
import re

import pytest

from cli.experiment import NAMES
from experiments import catalog, harness, overhead, report
from experiments.catalog import EXPERIMENTS
from experiments.common import agg
from nosync.errors import NosyncError


def test_agg_is_mean_and_sample_deviation_per_group():
    rows = [{"m": "a", "y": 1.0}, {"m": "a", "y": 3.0}, {"m": "b", "y": 5.0}, {"m": "b", "y": None}]
    got = agg(rows, ("m",), "y")
    assert got[("a",)] == (2.0, pytest.approx(2**0.5), 2)
    assert got[("b",)] == (5.0, 0.0, 1)


def test_overrides_set_typed_values_and_collapse_duplicates():
    exp = EXPERIMENTS["stall-vs-state"]
    full = harness.points(exp, quick=True)
    pts = harness.points(exp, quick=True, overrides={"keys": "5000", "skew": "0.5"})
    assert {p["keys"] for p in pts} == {5000} and {p["skew"] for p in pts} == {0.5}
    assert isinstance(pts[0]["keys"], int) and isinstance(pts[0]["skew"], float)
    # the quick grid has 2 sizes x 2 skews x 2 slow x 2 modes; fixing keys and skew leaves 4
    assert len(full) == 16 and len(pts) == 4
    with pytest.raises(NosyncError, match="no parameter 'nope'"):
        harness.points(exp, quick=True, overrides={"nope": "1"})
    with pytest.raises(NosyncError, match="keys=lots"):
        harness.points(exp, quick=True, overrides={"keys": "lots"})


def test_plan_runs_repetition_by_repetition_with_their_seeds():
    exp = EXPERIMENTS["overhead-vs-interval"]
    plan = harness.plan(exp, quick=True, seed=7)
    n = len(exp.points(True))
    assert len(plan) == n * exp.reps[1]
    assert [rep for _, rep, _ in plan] == [0] * n + [1] * n
    assert all(seed == 7 + rep for _, rep, seed in plan)
    assert len({harness.point_id(p) for p, _, _ in plan}) == n


def test_overhead_reading_gives_ratios_to_none():
    rows = [
        {"mode": "none", "interval_ms": 0, "records_per_s": 100.0, "latency_p99_ms": 10.0},
        {"mode": "none", "interval_ms": 0, "records_per_s": 300.0, "latency_p99_ms": 30.0},
        {"mode": "abs", "interval_ms": 100, "records_per_s": 100.0, "latency_p99_ms": 40.0},
        {"mode": "abs", "interval_ms": 1000, "records_per_s": 180.0, "latency_p99_ms": 20.0},
        {"mode": "nosync", "interval_ms": 100, "records_per_s": 150.0, "latency_p99_ms": 60.0},
    ]
    text = " ".join(overhead.reading(rows))
    # none's mean is 200 records/s and 20 ms
    assert "Throughput of abs: 0.50x none at 100 ms, 0.90x none at 1000 ms." in text
    assert "Latency p99 of abs is 2.0x none's at 100 ms and 1.0x at 1000 ms." in text
    assert "At 100 ms, nosync has the higher throughput (1.50x the other)." in text


def _fake_rows(name: str) -> list[dict]:
    """Rows shaped as the experiment's measurements are, with made-up figures (some missing)."""
    rows = []
    for i, p in enumerate(harness.points(EXPERIMENTS[name], quick=True)):
        for rep in (0, 1):
            x = 1.0 + i + rep * 0.1
            rows.append(
                {
                    **p,
                    "rep": rep,
                    "grid": "quick",
                    "cpus": 2,
                    "master": "embedded",
                    "records_per_s": 1000 * x,
                    "latency_p50_ms": 5 * x,
                    "latency_p99_ms": 9 * x,
                    "stall_ms_max": 0.0 if p["mode"] == "none" else x,
                    "checkpoint_bytes": 0 if p["mode"] == "none" else int(1000 * x),
                    "recovery_s": None if rep else x,
                    "kill_missed": rep == 1 and i == 0,
                    "restore_s": x / 2,
                    "records_reprocessed": int(100 * x),
                    "bytes_per_s": 10 * x,
                    "bytes_per_snapshot": 100 * x,
                    "snapshots_taken": 3,
                    "full_snapshot_bytes": 1000.0 * p.get("keys", 1),
                    "held_disk_bytes": 5 * x,
                    "held_log_bytes": 0,
                    "held_remote_bytes": 7 * x if p.get("tier") == "remote" else 0,
                    "persist_share": 0.01 * x,
                    "interval_ms_mean": 200 * x,
                    "recovery_span_ms_max": 300 * x,
                    "recovery_span_records_max": int(1000 * x),
                    "hang_detection_s": 0.1 * x,
                    "hang_to_90_s": None if rep else 2 * x,
                    "false_suspicions": i % 3,
                    "pause_records_reprocessed": 10 * (i % 3),
                    "pause_records_per_s": 900 * x,
                }
            )
    return rows


def test_report_draws_every_experiment(tmp_path):
    out = str(tmp_path)
    for name in EXPERIMENTS:
        os.makedirs(harness.table_dir(out, name))
        for r in _fake_rows(name):
            point = {k: r[k] for k in ("mode", "workers", "records", "keys") if k in r}
            pid = harness.point_id({**point, "i": r["records_per_s"]})
            harness._write_row(os.path.join(harness.table_dir(out, name), f"{pid}.parquet"), r)
        assert len(harness.read_rows(out, name)) == len(_fake_rows(name))
    figures = report.write(out)
    assert sorted(figures) == sorted(EXPERIMENTS)
    for path in figures.values():
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        assert os.path.getsize(path) > 20_000
    text = open(os.path.join(out, "REPORT.md"), encoding="utf-8").read()
    for name, exp in EXPERIMENTS.items():
        assert f"## {exp.title} (`{name}`)" in text and f"![{name}]({name}.png)" in text
    # a recovery that never got back to 90%, or a kill the run ended before, is said so
    assert "had not got back to 90%" in text and "the input ended before the kill" in text


def test_catalog_and_cli_agree_on_the_experiments_and_their_count():
    # `all` runs NAMES and `--help` counts them; the catalog is what they name
    assert NAMES == tuple(EXPERIMENTS)
    # the docstring's count, in words ("one" left out: it is seldom a count there)
    words = "two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()
    counts = [words.index(w) + 2 for w in re.findall(rf"\b({'|'.join(words)})\b", catalog.__doc__)]
    assert counts and all(n == len(EXPERIMENTS) for n in counts), counts
