"""Each bundled workload's committed output equals an independent computation of the expected
result in plain Python over the same input, for W = 1, 2 and 3, on embedded Spark."""

from __future__ import annotations

import collections
import glob
import json
import os
import re

import pytest

import nosync as ns
from experiments.workloads import reachability

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKLOADS = os.path.join(ROOT, "experiments", "workloads")


def committed_jsonl(directory: str) -> list:
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            out.extend(json.loads(line) for line in f if line.strip())
    assert not [n for n in os.listdir(os.path.join(directory, "_staging")) if n.endswith(".tmp")], "staged files left"
    return out


def running_counts(words: list[str]) -> collections.Counter:
    """Every (word, n) a running count emits: n = 1..count(word), each once."""
    expected: collections.Counter = collections.Counter()
    for word, n in collections.Counter(words).items():
        for i in range(1, n + 1):
            expected[(word, i)] += 1
    return expected


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_wordcount(spark, tmp_path, workers):
    text = tmp_path / "in"
    text.mkdir()
    lines_a = ["the cat and the hat", "a cat, a hat!", "", "The end of THE story"] * 50
    lines_b = ["it's the cat's hat", "and so on and so forth"] * 30
    (text / "a.txt").write_text("\n".join(lines_a) + "\n")
    (text / "b.txt").write_text("\n".join(lines_b) + "\n")
    out = tmp_path / "out"
    result = ns.run(
        os.path.join(WORKLOADS, "wordcount.py"),
        workers=workers,
        spark=spark,
        run_dir=str(tmp_path / "run"),
        epoch_records=37,
        params={"input": str(text / "*.txt"), "output": str(out)},
    )
    words = [w for line in lines_a + lines_b for w in re.findall(r"[a-z']+", line.lower())]
    got = collections.Counter((w, n) for w, n in committed_jsonl(str(out)))
    assert got == running_counts(words)
    assert result.summary["records_read"] == len(lines_a) + len(lines_b)
    assert result.summary["records_committed"] == len(words)
    assert os.path.exists(os.path.join(result.run_dir, "summary.json"))


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_keyed_count(spark, tmp_path, workers):
    records, keys = 30_000, 700
    out = tmp_path / "out"
    ns.run(
        os.path.join(WORKLOADS, "keyed_count.py"),
        workers=workers,
        spark=spark,
        run_dir=str(tmp_path / "run"),
        epoch_records=1000,
        params={"records": str(records), "keys": str(keys), "skew": "1.1", "output": str(out)},
    )
    got = collections.Counter(tuple(r) for r in ns.sinks.Files(str(out), format="parquet").read_committed())
    # the generator's documented contract: skew > 0 draws key strings from a Zipf table
    source = ns.sources.Generator(records=records, keys=keys, skew=1.1)
    words = [r for part in source.partitions(1) for recs, _ in source.read(part, 0, 4096) for r in recs]
    assert len(words) == records
    assert got == running_counts(words)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_nexmark_window_join(spark, tmp_path, workers):
    bids, auctions, size = 12_000, 300, 500
    out = tmp_path / "out"
    ns.run(
        os.path.join(WORKLOADS, "nexmark.py"),
        workers=workers,
        spark=spark,
        run_dir=str(tmp_path / "run"),
        epoch_records=400,
        params={"bids": str(bids), "auctions": str(auctions), "window": str(size), "output": str(out)},
    )
    counts: collections.Counter = collections.Counter()
    for i in range(bids):
        a = ((i * 2654435761) >> 7) % auctions
        counts[(a, (i // size) * size)] += 1
    expected = collections.Counter((a, w, n, a % 10, a % 50) for (a, w), n in counts.items())
    got = collections.Counter(
        (r["auction"], r["window"], r["bids"], r["category"], r["seller"]) for r in committed_jsonl(str(out))
    )
    assert got == expected


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_reachability(spark, tmp_path, workers):
    """An iterative workload whose loop body is keyed: reaches go round across workers until
    every reachable vertex is committed, once."""
    params = {"vertices": "3000"}
    out = tmp_path / "out"
    ns.run(
        os.path.join(WORKLOADS, "reachability.py"),
        workers=workers,
        spark=spark,
        run_dir=str(tmp_path / "run"),
        epoch_records=500,
        params={**params, "output": str(out)},
    )
    got = collections.Counter(committed_jsonl(str(out)))
    expected = reachability.reference(params)
    assert set(got.values()) == {1}, [v for v, n in got.items() if n > 1][:10]
    assert set(got) == expected


def test_keyed_count_with_epochs_cut_by_time(spark, tmp_path):
    """--epoch-ms: epochs follow the wall clock; the committed output is the same."""
    records, keys = 40_000, 300
    out = tmp_path / "out"
    result = ns.run(
        os.path.join(WORKLOADS, "keyed_count.py"),
        workers=2,
        spark=spark,
        run_dir=str(tmp_path / "run"),
        epoch_ms=20,
        params={"records": str(records), "keys": str(keys), "output": str(out)},
    )
    got = collections.Counter(tuple(r) for r in ns.sinks.Files(str(out), format="parquet").read_committed())
    words = [str(i % keys) for i in range(records)]  # the uniform generator: record i is str(i % keys)
    assert got == running_counts(words)
    assert result.summary["records_committed"] == records
