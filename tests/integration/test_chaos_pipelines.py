"""`nosync chaos` on pipelines beyond the shipped workloads, in every recovering mode (soak).

- chaos_mixed: two sources, a loop, a union, filter and flat_map, a stateful_map, two windows
  joined, a reduce into a LevelDB sink, two Files sinks (one inside the other's directory);
- chaos_chain: Zipf-skewed keys, a stateless branch with no exchange, two keyed stages in a
  row, state deleted by a stateful_map, a LevelDB sink and two Files sinks;
- halving_loop: a loop, and a count keyed by a tuple (mode replay recomputes its state with
  batch jobs, where a tuple key once came back a list);
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
from test_abs import judge_chaos

PIPELINES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipelines")

SOAK = [
    (p, mode, w)
    for p in ("chaos_mixed", "chaos_chain", "halving_loop")
    for mode in ("abs", "nosync", "replay")
    for w in (2, 3)
]


@pytest.mark.soak
@pytest.mark.parametrize(("pipeline", "mode", "workers"), SOAK)
def test_chaos_pipeline_soak(tmp_path, pipeline, mode, workers):
    kills = 1 if mode == "abs" else 2  # an abs run of these lasts a few checkpoints
    options = {"checkpoint_ms": 500} if mode == "abs" else None
    path = os.path.join(PIPELINES, f"{pipeline}.py")
    judge_chaos(tmp_path, path, mode, workers, kills, workers, {"records": "600000"}, options)
    with open(tmp_path / "chaos" / "chaos" / "summary.json", encoding="utf-8") as f:
        assert json.load(f)["records_committed"] > 0


def write_input(directory, files: int = 4, lines: int = 250_000) -> list[tuple[str, int, str]]:
    """JSONL files, every 9973rd line from the 17th not JSON; returns (file, byte offset,
    line) of each malformed line, counted as the files are written."""
    directory.mkdir()
    bad = []
    for fi in range(files):
        path = directory / f"part{fi}.jsonl"
        offset = 0
        with open(path, "w", encoding="utf-8") as f:
            for i in range(lines):
                if i % 9973 == 17:
                    line = f"{{not json {i}"
                    bad.append((str(path), offset, line))
                else:
                    line = json.dumps({"k": f"k{(i * 31 + fi) % 777}", "v": i % 13})
                f.write(line + "\n")
                offset += len(line) + 1
    return bad


@pytest.mark.soak
@pytest.mark.parametrize(("mode", "workers"), [(m, w) for m in ("abs", "nosync", "replay") for w in (2, 3)])
def test_chaos_dead_letters_soak(tmp_path, mode, workers):
    from experiments.chaos import canonical, dead_letters

    bad = write_input(tmp_path / "in")
    options = {"checkpoint_ms": 300} if mode == "abs" else None
    path = os.path.join(PIPELINES, "chaos_dead_letters.py")
    judge_chaos(tmp_path, path, mode, workers, 2, workers, {"input": str(tmp_path / "in")}, options)
    want = collections.Counter(canonical(["lines", f, {"byte": b, "raw": line}]) for f, b, line in bad)
    assert len(want) == 4 * 26  # lines 17, 9990, ..., 249342 of each file
    assert dead_letters(str(tmp_path / "chaos" / "chaos")) == want
