"""`nosync batch`: a pipeline as Spark batch jobs, stage by stage, with the streaming
operators' own code.

- for every shipped workload, the batch job commits what a streaming run commits (every sink,
  compared as the chaos judge compares them);
- keyed_count's batch output is also checked against the input's definition (record i is the
  key str(i % keys)), and so is the output and state of a pipeline with a loop and tuple keys;
- records holding lists reach an operator alike at W = 1 and 2, whether they crossed to another
  worker or stayed, and in a batch job (lists as tuples after an exchange, kept across a
  forward edge); a record no exchange can encode fails the run naming its key_by;
- a pipeline with a loop (iterate) and a TCP source is refused by batch (the source cannot
  restart), and the CLI names it;
- `state`: the keyed state of keyed_count at the end of an epoch, recomputed by batch jobs,
  equals the counts computed from the input's definition; bad queries are named;
- a function that raises in a batch task fails the job at once, naming the error and where it
  was raised (Spark would otherwise retry the task as often as it retries streaming workers).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest
from support.paths import PIPELINES, ROOT, WORKLOADS
from support.runs import committed_pairs
from support.workloads import big_text, keyed_count_expected, write_dead_letters_input

import nosync as ns
from experiments.chaos import committed_outputs
from nosync.api.loader import load_pipeline
from nosync.api.plan import plan
from nosync.errors import PipelineError
from nosync.spark.batch import keyed_state, run_batch, stages


def small_params(name: str, tmp_path) -> dict:
    if name == "wordcount":
        big_text(tmp_path / "a.txt", 30_000)
        big_text(tmp_path / "b.txt", 20_000)
        return {"input": str(tmp_path / "*.txt")}
    if name == "keyed_count":
        return {"records": "400000", "keys": "5000"}
    return {"bids": "300000"}


@pytest.mark.parametrize("workload", ["wordcount", "keyed_count", "nexmark"])
def test_batch_commits_what_streaming_commits(spark, tmp_path, workload):
    path = os.path.join(WORKLOADS, f"{workload}.py")
    params = small_params(workload, tmp_path)
    streamed = {**params, "output": str(tmp_path / "streamed")}
    batched = {**params, "output": str(tmp_path / "batched")}
    ns.run(path, workers=2, spark=spark, run_dir=str(tmp_path / "run"), epoch_records=5000, params=streamed)
    r = run_batch(path, batched, workers=2, spark=spark, epoch_records=5000, run_dir=str(tmp_path / "batch"))
    assert r["stages"] >= 2, "every shipped workload has an exchange"
    want = committed_outputs(path, streamed)
    got = committed_outputs(path, batched)
    assert set(got) == set(want)
    for sink, (kind, records) in want.items():
        assert kind == "multiset"
        assert sum(records.values()) > 0
        assert got[sink] == (kind, records), f"sink {sink}: batch and streaming differ"
    assert r["read"] > 0 and r["committed"] == sum(sum(v.values()) for _, v in want.values())


def test_batch_keyed_count_against_its_definition(spark, tmp_path):
    records, keys = 300_000, 7_000
    out = tmp_path / "out"
    path = os.path.join(WORKLOADS, "keyed_count.py")
    r = run_batch(path, {"records": str(records), "keys": str(keys), "output": str(out)}, workers=3, spark=spark)
    assert r["read"] == records
    assert committed_pairs(str(out)) == keyed_count_expected(records, keys)


def test_batch_with_a_loop_and_tuple_keys_against_its_definition(spark, tmp_path):
    """halving_loop keys a count by a tuple. Records cross a batch stage as a frame carries
    them, arrays as tuples: a tuple key stays a tuple, hashable (it came back a list, and
    every batch job, rewind, state query and replay recovery of such a pipeline raised)."""
    records = 100_000
    path = os.path.join(PIPELINES, "halving_loop.py")
    params = {"records": str(records), "output": str(tmp_path / "out")}
    # v = i + 1 goes round once, then while above 1: max(1, v.bit_length() - 1) rounds
    per_key = collections.Counter((max(1, v.bit_length() - 1), v % 50) for v in range(1, records + 1))
    r = run_batch(path, params, workers=2, spark=spark)
    assert r["read"] == records
    got = collections.Counter((tuple(k), n) for k, n in ns.sinks.Files(str(tmp_path / "out")).read_committed())
    assert got == collections.Counter((k, n) for k, total in per_key.items() for n in range(1, total + 1))
    state = keyed_state(path, params, "aggregate_1", workers=2, spark=spark, run_dir=str(tmp_path / "q"))
    assert dict(state) == dict(per_key)


def record_types_expected(records: int) -> collections.Counter:
    """What record_types commits, from its definition: each key's last count row (its record
    count and how many of its records carry ("x", 0)), and the side rows."""
    want: collections.Counter = collections.Counter()
    for m in range(4):
        mine = [i for i in range(records) if i % 4 == m]
        want[json.dumps(["count", "list", [m, "k"], [len(mine), sum(1 for i in mine if i % 3 == 0)]])] += 1
    for i in range(0, records, 20):
        want[json.dumps(["side", "list", ["x", i % 3]])] += 1
    return want


def record_types_committed(out: str) -> collections.Counter:
    last: dict = {}
    got: collections.Counter = collections.Counter()
    for row in ns.sinks.Files(out).read_committed():
        if row[0] == "count":
            key = tuple(row[2])
            if key not in last or row[3][0] > last[key][3][0]:
                last[key] = row
        else:
            got[json.dumps(row)] += 1
    for row in last.values():
        got[json.dumps(row)] += 1
    return got


def test_records_with_lists_reach_operators_alike_at_any_w_and_in_batch(spark, tmp_path):
    """Before, a record that stayed on its worker kept its lists and one that crossed got
    tuples: the count of values equal to ("x", 0) depended on W and on which worker held a key
    (0 at W = 1), mode replay's recomputation disagreed with the run it recovered, and the
    batch job turned the side rows' lists into tuples on a forward edge."""
    records = 20_000
    path = os.path.join(PIPELINES, "record_types.py")
    want = record_types_expected(records)
    for w in (1, 2):
        out = str(tmp_path / f"w{w}")
        ns.run(
            path,
            workers=w,
            spark=spark,
            run_dir=str(tmp_path / f"run{w}"),
            params={"records": str(records), "output": out},
        )
        assert record_types_committed(out) == want, f"W = {w}"
    out = str(tmp_path / "batch")
    run_batch(path, {"records": str(records), "output": out}, workers=2, spark=spark, run_dir=str(tmp_path / "b"))
    assert record_types_committed(out) == want, "batch"


@pytest.mark.parametrize("workers", [1, 2])
def test_a_record_no_exchange_can_encode_fails_naming_its_key_by(spark, tmp_path, workers):
    path = os.path.join(PIPELINES, "record_types.py")
    with pytest.raises(ns.RunFailed) as e:
        ns.run(
            path,
            workers=workers,
            spark=spark,
            run_dir=str(tmp_path / "run"),
            params={"bad": "1", "output": str(tmp_path / "out")},
        )
    msg = str(e.value)
    assert "operator 'by_list' (declared at " in msg and "record_types.py:" in msg, msg
    assert "emitted a record that cannot cross an exchange (TypeError: can not serialize 'set' object)" in msg, msg
    assert "([3, 'k'], [7, {" in msg, msg


def test_stages_are_counted_in_exchanges():
    p = plan(load_pipeline(os.path.join(WORKLOADS, "nexmark.py"), {}), 2)
    stage = stages(p)
    got = {n.name: stage[n.id] for n in p.pipeline.nodes if n.kind != "sink"}
    # bids -> key_by -> window (an exchange); auctions -> key_by -> join (an exchange); the
    # window's output stays on its worker into the join (keyed operators keep partitioning)
    assert got == {
        "bids": 0,
        "auctions": 0,
        "by_auction": 0,
        "auction_by_id": 0,
        "bids_per_window": 1,
        "with_auction": 1,
        "rows": 1,
    }


def test_batch_refuses_a_source_that_cannot_restart(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "batch",
            os.path.join(PIPELINES, "tcp_collatz.py"),
            "-p",
            "port=9",
            "-p",
            f"output={tmp_path / 'out'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert "TcpLines(127.0.0.1:9)" in proc.stderr and "cannot restart" in proc.stderr


def test_an_error_in_a_batch_task_fails_the_job_at_once(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "batch",
            os.path.join(PIPELINES, "fails_on_a_record.py"),
            "-p",
            f"output={tmp_path / 'out'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    err = proc.stderr
    assert "stage 1 of the batch jobs: operator 'map_1' (declared at " in err, err[-3000:]
    assert "fails_on_a_record.py:17) raised ValueError: key 777 is refused by this test pipeline" in err, err[-3000:]


def test_state_as_of_an_epoch_agrees_with_the_input(spark, tmp_path):
    """keyed_count over W = 2 generator partitions: partition p holds records p, p + 2, ...,
    its j-th record is in epoch j // epoch_records, and record i counts for key str(i % keys);
    so the count of a key at the end of epoch E counts the records i with i // 2 < (E + 1) *
    epoch_records."""
    records, keys, per_epoch = 60_000, 700, 2_000
    path = os.path.join(WORKLOADS, "keyed_count.py")
    params = {"records": str(records), "keys": str(keys), "output": str(tmp_path / "out")}
    for epoch in (0, 6, None):
        got = dict(
            keyed_state(
                path,
                params,
                "aggregate_1",
                workers=2,
                epoch_records=per_epoch,
                until_epoch=epoch,
                spark=spark,
                run_dir=str(tmp_path / "q"),
            )
        )
        upto = records if epoch is None else min(records, 2 * (epoch + 1) * per_epoch)
        want = collections.Counter(str(i % keys) for i in range(upto))
        assert got == dict(want), f"epoch {epoch}"
    one = keyed_state(path, params, "aggregate_1", epoch_records=per_epoch, until_epoch=0, keys=["5", 5], spark=spark)
    assert one == [("5", sum(1 for i in range(2 * per_epoch) if i % keys == 5))]
    assert not os.path.exists(tmp_path / "out"), "a state query wrote to the pipeline's sink"


def test_state_errors_name_what_is_wrong(spark, tmp_path):
    path = os.path.join(WORKLOADS, "keyed_count.py")
    with pytest.raises(PipelineError, match="no operator named 'nope'; operators: source_1, key_by_1"):
        keyed_state(path, {}, "nope", spark=spark)
    with pytest.raises(PipelineError, match="'key_by_1' is a key_by: it keeps no keyed state"):
        keyed_state(path, {}, "key_by_1", spark=spark)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(
        json.dumps({"pipeline_file": path, "params": {}, "workers": 2, "epoch_ms": 100, "mode": "none"})
    )
    cli = [sys.executable, "-m", "cli.main", "state"]
    proc = subprocess.run([*cli, str(run), "--operator", "aggregate_1"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "cut by time (--epoch-ms 100)" in proc.stderr, proc.stderr
    proc = subprocess.run([*cli, str(tmp_path), "--operator", "x"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "has no run.json" in proc.stderr, proc.stderr
    # an operator the pipeline lacks is told on the terminal, though Spark's output goes to a file
    (run / "run.json").write_text(json.dumps({"pipeline_file": path, "params": {}, "workers": 2, "mode": "none"}))
    proc = subprocess.run([*cli, str(run), "--operator", "nope"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "no operator named 'nope'" in proc.stderr, proc.stderr
    assert "aggregate_1" in proc.stderr, proc.stderr


def test_batch_jobs_send_bad_records_to_the_dead_letters_once_each(spark, tmp_path):
    """A source's unparsable lines, in a batch job, go to the run directory's dead-letter files
    as a streaming worker's do: each exactly once, named by file and byte offset."""
    bad = write_dead_letters_input(tmp_path / "in", files=2, lines=20_000)
    params = {"input": str(tmp_path / "in"), "output": str(tmp_path / "out")}
    run_dir = tmp_path / "batch"
    run_batch(os.path.join(PIPELINES, "chaos_dead_letters.py"), params, workers=2, spark=spark, run_dir=str(run_dir))
    got = []
    for name in sorted(os.listdir(run_dir)):
        if name.startswith("dead-letter-w"):
            with open(run_dir / name, encoding="utf-8") as f:
                got += [json.loads(line) for line in f]
    assert sorted((d["file"], d["position"]["byte"], d["position"]["raw"]) for d in got) == sorted(bad)
    assert {d["source"] for d in got} == {"lines"}
