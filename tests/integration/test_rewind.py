"""`nosync rewind` of keyed_count, whose run was in mode replay (epochs aligned).

keyed_count over W = 2 generator partitions: partition p holds records p, p + 2, ..., its
j-th record is in epoch j // epoch_records, and record i counts for key str(i % keys). With
an even number of keys, all of a key's records are in one partition, in order, so its
running counts are 1, 2, ..., n, and the count of a record of epoch e is known in advance.

- rewound to epoch E with the same pipeline: the new output equals the run's, epoch by epoch
  (`nosync diff` finds nothing), and the run directory is not changed;
- rewound with a changed aggregate (+2 per record): the diff starts at epoch E and nothing
  before it differs; the new output is exactly what the definition gives (counts up to the
  end of epoch E - 1 as before, then +2 per record);
- errors: an unknown operator, a source, an epoch after the run, another pipeline, an
  operator outside the cone that changed, a run directory that is not one.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest
from test_abs import committed_pairs

import nosync as ns
from nosync.diff import diff_outputs
from nosync.errors import NosyncError, PipelineError
from nosync.rewind import check_compatible, rewind

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKLOADS = os.path.join(ROOT, "experiments", "workloads")
PIPELINES = os.path.join(ROOT, "tests", "integration", "pipelines")
RECORDS, KEYS, PER_EPOCH, E = 200_000, 2_000, 5_000, 10


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    base = tmp_path_factory.mktemp("rewind")
    run_dir, out = base / "run", base / "out"
    cmd = [sys.executable, "-m", "cli.main", "run", os.path.join(WORKLOADS, "keyed_count.py"), "--mode", "replay"]
    cmd += ["--workers", "2", "--epoch-records", str(PER_EPOCH), "--run-dir", str(run_dir)]
    cmd += ["-p", f"records={RECORDS}", "-p", f"keys={KEYS}", "-p", f"output={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir, out


def listing(d) -> dict:
    return {os.path.join(r, f): os.stat(os.path.join(r, f)).st_mtime_ns for r, _, files in os.walk(d) for f in files}


def test_rewind_with_the_same_pipeline_reproduces_the_run(spark, tmp_path, original):
    run_dir, out = original
    before = listing(run_dir)
    r = rewind(str(run_dir), "aggregate_1", E, output=str(tmp_path / "again"), spark=spark)
    assert r["cone"] == ["aggregate_1", "sink_1"] and not r["changed"] and r["by_epoch"]
    assert r["records_read"] == RECORDS
    s = diff_outputs(str(out), str(tmp_path / "again"), str(tmp_path / "d.jsonl"))
    assert (s["records_a"], s["records_b"], s["differences"]) == (RECORDS, RECORDS, 0)
    assert listing(run_dir) == before, "the rewind changed the run directory"


def test_rewind_with_a_changed_aggregate_changes_only_from_its_epoch(spark, tmp_path, original):
    run_dir, out = original
    new = tmp_path / "double"
    rewind(
        str(run_dir),
        "aggregate_1",
        E,
        pipeline_file=os.path.join(PIPELINES, "keyed_count_double.py"),
        output=str(new),
        spark=spark,
    )
    s = diff_outputs(str(out), str(new), str(tmp_path / "d.jsonl"))
    assert s["first_epoch"] == E and all(int(e) >= E for e in s["epochs"]), s["epochs"]
    # record i is in epoch (i // 2) // PER_EPOCH; a key's count goes +1 per record before E, +2 after
    expected: collections.Counter = collections.Counter()
    count: dict[str, int] = {}
    for i in range(RECORDS):
        k = str(i % KEYS)
        count[k] = count.get(k, 0) + (1 if (i // 2) // PER_EPOCH < E else 2)
        expected[(k, count[k])] += 1
    assert committed_pairs(str(new)) == expected


def test_rewind_errors_name_what_is_wrong(spark, tmp_path, original):
    run_dir, _ = original
    with pytest.raises(NosyncError, match="has no operator 'nope'; operators: source_1, key_by_1, aggregate_1"):
        rewind(str(run_dir), "nope", E, output=str(tmp_path / "a"), spark=spark)
    with pytest.raises(NosyncError, match="'source_1' is a source"):
        rewind(str(run_dir), "source_1", E, output=str(tmp_path / "b"), spark=spark)
    last = (RECORDS // 2 - 1) // PER_EPOCH
    with pytest.raises(NosyncError, match=f"epoch {last + 5} is outside the run: its last committed epoch is {last}"):
        rewind(str(run_dir), "aggregate_1", last + 5, output=str(tmp_path / "c"), spark=spark)
    with pytest.raises(PipelineError, match="the new pipeline is 'random_tag', the run's is 'keyed_count'"):
        rewind(
            str(run_dir),
            "aggregate_1",
            E,
            pipeline_file=os.path.join(PIPELINES, "random_tag.py"),
            output=str(tmp_path / "d"),
            spark=spark,
        )
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "rewind", str(tmp_path), "--operator", "x", "--to-epoch", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "has no run.json" in proc.stderr, proc.stderr


def test_a_change_outside_the_cone_is_refused():
    def build(key_fn, add):
        p = ns.Pipeline("p")
        counts = p.source(ns.sources.Generator(records=10)).key_by(key_fn).aggregate(int, add)
        counts.sink(ns.sinks.Null())
        return p

    old = build(lambda k: k, lambda n, _: n + 1)
    inside = build(lambda k: k, lambda n, _: n + 2)
    outside = build(lambda k: k + "x", lambda n, _: n + 1)
    check_compatible(old, inside, {"aggregate_1", "sink_1"})
    with pytest.raises(PipelineError, match="operator 'key_by_1' is outside the rewound cone .* function `fn` changed"):
        check_compatible(old, outside, {"aggregate_1", "sink_1"})
    with pytest.raises(PipelineError, match="function `add` changed"):
        check_compatible(old, inside, {"sink_1"})
