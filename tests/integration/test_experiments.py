"""`nosync experiment`: a grid measured through the CLI lands in its Parquet table, a second
run measures only what is missing, and the report draws a valid PNG.

The grid is the quick one of overhead-vs-interval with tiny runs (`-s records=... -s
keys=...`) at one interval (`-s interval_ms=100`): none's point is set to 100 ms too, so the
override leaves 3 points (none, abs, nosync), 2 repetitions each. The demo (about 90 s) is in
the soak set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOSYNC = [sys.executable, "-m", "cli.main"]
EXP = "overhead-vs-interval"
TINY = ["-s", "records=30000", "-s", "keys=1000", "-s", "interval_ms=100"]


def experiment(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*NOSYNC, "experiment", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def table_files(out) -> dict[str, float]:
    d = os.path.join(out, EXP)
    return {f: os.stat(os.path.join(d, f)).st_mtime_ns for f in os.listdir(d) if f.endswith(".parquet")}


@pytest.mark.soak  # the suite's time: the experiments' harness is covered by its unit tests
def test_quick_grid_table_figure_and_resume(tmp_path):
    out = str(tmp_path / "exp")
    p = experiment(EXP, "--quick", "--out", out, *TINY)
    assert p.returncode == 0, p.stdout + p.stderr
    # Spark's own output went to the log, not to the terminal
    assert "WARN" not in p.stdout + p.stderr, p.stderr
    assert os.path.getsize(os.path.join(out, "spark.log")) > 0

    rows = pq.read_table(os.path.join(out, EXP)).to_pylist()
    want = {(m, 100, r) for m in ("none", "abs", "nosync") for r in (0, 1)}
    assert sorted((r["mode"], r["interval_ms"], r["rep"]) for r in rows) == sorted(want)
    for r in rows:
        assert (r["records"], r["keys"], r["workers"]) == (30000, 1000, 2)
        assert r["records_per_s"] > 0 and r["latency_p99_ms"] >= r["latency_p50_ms"] > 0
        assert r["seed"] == 1 + r["rep"] and r["grid"] == "quick"
        assert r["cpus"] == os.cpu_count() and r["git_commit"] and r["pyspark"].startswith("4.")
    # only the modes that persist wrote bytes; nosync persists its lineage as it goes (a run
    # this short may end before its first snapshot)
    assert all(r["checkpoint_bytes"] == r["bytes_persisted"] == 0 for r in rows if r["mode"] == "none")
    assert all(r["bytes_persisted"] > 0 for r in rows if r["mode"] == "nosync")

    png = os.path.join(out, f"{EXP}.png")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    h, w, _ = matplotlib.image.imread(png).shape
    assert w > 800 and h > 300
    report = open(os.path.join(out, "REPORT.md"), encoding="utf-8").read()
    assert f"]({EXP}.png)" in report and "| abs | 100 |" in report and "| nosync | 100 |" in report
    assert "Throughput of abs: " in report and "x none at 100 ms" in report

    # a second run measures nothing; a run after two rows were lost measures exactly those two
    before = table_files(out)
    p = experiment(EXP, "--quick", "--out", out, *TINY)
    assert p.returncode == 0, p.stderr
    assert "6 of 6 measurements already in" in p.stdout
    assert table_files(out) == before
    gone = sorted(before)[:2]
    for f in gone:
        os.unlink(os.path.join(out, EXP, f))
    p = experiment(EXP, "--quick", "--out", out, *TINY)
    assert p.returncode == 0, p.stderr
    assert "4 of 6 measurements already in" in p.stdout and "2 measured" in p.stdout
    after = table_files(out)
    assert set(after) == set(before)
    assert all(after[f] == before[f] for f in before if f not in gone)
    assert all(after[f] != before[f] for f in gone)


def test_bad_input_is_refused_with_its_name(tmp_path):
    p = experiment(EXP, "--quick", "--out", str(tmp_path / "x"), "-s", "bogus=1")
    assert p.returncode == 2 and "bogus" in p.stderr and "interval_ms" in p.stderr, p.stderr
    p = experiment(EXP, "--quick", "--out", str(tmp_path / "x"), "-s", "records=many")
    assert p.returncode == 2 and "records=many" in p.stderr, p.stderr
    # all of them: a parameter none has is refused naming those they have
    p = experiment("all", "--quick", "--out", str(tmp_path / "x"), "-s", "bogus=1")
    assert p.returncode == 2 and "no experiment has a parameter 'bogus'" in p.stderr, p.stderr
    assert "interval_ms" in p.stderr and "skew" in p.stderr, p.stderr
    p = experiment("no-such-experiment")
    assert p.returncode == 2 and "no-such-experiment" in p.stderr
    p = experiment("report", "--out", str(tmp_path / "missing"))
    assert p.returncode == 2 and "missing" in p.stderr
    assert not os.path.exists(tmp_path / "x")


@pytest.mark.soak
def test_demo_tells_its_story_quietly(tmp_path):
    out = tmp_path / "demo"
    p = subprocess.run(
        [*NOSYNC, "demo", "--out", str(out), "--records", "1000000", "--keys", "50000"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "WARN" not in p.stdout + p.stderr and "Traceback" not in p.stdout + p.stderr
    verdict = next(line for line in p.stdout.splitlines() if line.startswith("output vs reference"))
    assert verdict.split()[-3:] == ["reference", "exactly-once", "exactly-once"], verdict
    results = json.loads((out / "demo.json").read_text())
    for mode in ("abs", "nosync"):
        assert results[mode]["lost"] == results[mode]["duplicated"] == 0
        assert results[mode]["restore_s"] > 0 and results[mode]["killed_at_s"] > 0
    with open(out / "demo.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
