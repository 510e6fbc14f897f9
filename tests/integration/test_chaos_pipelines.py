"""`nosync chaos` on pipelines beyond the shipped workloads, in every recovering mode (soak).

- chaos_mixed: two sources, a loop, a union, filter and flat_map, a stateful_map, two windows
  joined, a reduce into a LevelDB sink, two Files sinks (one inside the other's directory);
- chaos_chain: Zipf-skewed keys, a stateless branch with no exchange, two keyed stages in a
  row, state deleted by a stateful_map, a LevelDB sink and two Files sinks;
- halving_loop: a loop, and a count keyed by a tuple (mode replay recomputes its state with
  batch jobs, where a tuple key once came back a list);
- python_state: keyed state in a Counter, a set and a frozenset (saved and restored as
  themselves), a LevelDB sink of Counters keyed by ints;
- chaos_dead_letters: JSONL files with malformed lines, which go to the dead-letter files: a
  kill must not write one twice or lose one (the judge compares them as it does a sink's
  records), and they are the malformed lines the input was written with.

Each case asserts what `judge_chaos` asserts of the shipped workloads: deterministic (the
second failure-free run reads in chunks of another size and pauses a worker), every kill
made and recovered, no record lost or duplicated in any sink.
"""

from __future__ import annotations

import collections
import json
import os

import pytest
from support import soak
from support.paths import PIPELINES
from support.runs import judge_chaos
from support.workloads import write_dead_letters_input


@pytest.mark.soak
@pytest.mark.parametrize(("pipeline", "mode", "workers"), soak.pipeline_cases())
def test_chaos_pipeline_soak(tmp_path, pipeline, mode, workers):
    kills = 1 if mode == "abs" else 2  # an abs run of these lasts a few checkpoints
    options = {"checkpoint_ms": 500} if mode == "abs" else None
    path = os.path.join(PIPELINES, f"{pipeline}.py")
    judge_chaos(tmp_path, path, mode, workers, kills, workers, {"records": "600000"}, options)
    with open(tmp_path / "chaos" / "chaos" / "summary.json", encoding="utf-8") as f:
        assert json.load(f)["records_committed"] > 0


@pytest.mark.soak
@pytest.mark.parametrize(("mode", "workers"), soak.mode_cases())
def test_chaos_dead_letters_soak(tmp_path, mode, workers):
    from experiments.chaos import canonical, dead_letters

    bad = write_dead_letters_input(tmp_path / "in")
    options = {"checkpoint_ms": 300} if mode == "abs" else None
    path = os.path.join(PIPELINES, "chaos_dead_letters.py")
    judge_chaos(tmp_path, path, mode, workers, 2, workers, {"input": str(tmp_path / "in")}, options)
    want = collections.Counter(canonical(["lines", f, {"byte": b, "raw": line}]) for f, b, line in bad)
    assert len(want) == 4 * 26  # lines 17, 9990, ..., 249342 of each file
    assert dead_letters(str(tmp_path / "chaos" / "chaos")) == want


@pytest.mark.soak
@pytest.mark.parametrize(("mode", "workers"), soak.mode_cases())
def test_chaos_sparse_inputs_soak(tmp_path, mode, workers):
    """chaos_sparse: idle workers (a one-file CSV), an empty source, a window re-keyed, a
    join; its committed output is also checked against the definitions of its inputs."""
    from nosync.api.sinks import Files, LevelDB

    events, records = tmp_path / "events.csv", 600_000
    with open(events, "w", encoding="utf-8") as f:
        f.write("id,t,user\n")
        f.writelines(f"{i},{i // 4},u{(i * 7) % 200}\n" for i in range(6000))
    kills = 2 if mode == "nosync" else 1
    options = {"checkpoint_ms": 500} if mode == "abs" else None
    path = os.path.join(PIPELINES, "chaos_sparse.py")
    params = {"records": str(records), "events": str(events)}
    judge_chaos(tmp_path, path, mode, workers, kills, workers, params, options)
    out = tmp_path / "chaos" / "chaos" / "output"
    # t = id // 4 runs over 0..1499: 15 windows of 100, each 400 events over all users
    assert LevelDB(str(out / "kv")).read_committed() == {start: 400 for start in range(0, 1500, 100)}
    # the generator's keys that are multiples of 50 go to users u0, u50, u100, u150, records / 50
    # of them in all; each of those users has 30 events (id * 7 % 200 takes each value 30 times)
    assert len(Files(str(out / "pairs")).read_committed()) == 4 * 30 * (records // 50 // 4)
    assert Files(str(out / "none")).read_committed() == []
