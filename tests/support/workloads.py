"""Inputs the tests write for their runs, parameters of the shipped workloads, and expected
outputs computed from a workload's definition, never taken from a run."""

from __future__ import annotations

import collections
import json


def keyed_count_expected(records: int, keys: int) -> collections.Counter:
    """Every (key, n) the running count emits: n = 1..(records of that key), each once
    (record i of the generator is the key str(i % keys))."""
    per_key = collections.Counter(str(i % keys) for i in range(records))
    return collections.Counter((k, n) for k, total in per_key.items() for n in range(1, total + 1))


def big_text(path, lines: int) -> str:
    words = "the quick brown fox jumps over the lazy dog and then some more words follow".split()
    with open(path, "w", encoding="utf-8") as f:
        for i in range(lines):
            f.write(" ".join(words[(i * 7 + j) % len(words)] for j in range(3 + i % 5)) + "\n")
    return str(path)


def workload_params(name: str, tmp_path) -> dict:
    """The parameters of a shipped workload in a chaos run (the soak grid's sizes)."""
    if name == "wordcount":
        # long enough for three kills and their recoveries on a fast day (at 150k + 100k
        # lines a nosync run at W = 2 ended before its third kill)
        big_text(tmp_path / "a.txt", 300_000)
        big_text(tmp_path / "b.txt", 200_000)
        return {"input": str(tmp_path / "*.txt")}
    if name == "keyed_count":
        # long enough for three kills at W = 3 (at 3M records a nosync run ended before its third)
        return {"records": "5000000", "keys": "20000"}
    return {"bids": "1500000"}


def write_dead_letters_input(directory, files: int = 4, lines: int = 250_000) -> list[tuple[str, int, str]]:
    """The input of pipeline chaos_dead_letters: JSONL files, every 9973rd line from the 17th
    not JSON; returns (file, byte offset, line) of each malformed line, counted as the files
    are written."""
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


def loop_options(mode: str) -> dict:
    """The run options of a chaos run of reachability: short epochs, so that a loop's epoch
    ends (and a safe point or a checkpoint comes) often enough for kills to fall inside it."""
    return {"epoch_records": 4000, **({"checkpoint_ms": 300} if mode == "abs" else {})}


def committed_vertices(directory: str) -> collections.Counter:
    """The vertices reachability's Files sink committed in `directory`, with their counts."""
    import nosync as ns

    return collections.Counter(ns.sinks.Files(directory).read_committed())
