"""Keyed operators fed by several workers must not let an upsert sink end with a stale value.

A keyed operator receives records for one key from every worker's source, and those sources cut
their epochs independently: a worker reading several files (or a bigger share of the data) is
at a lower epoch than one reading a single small file. If the operator stamps each output with
the epoch of the input batch that caused it, two outputs for the same key can leave it in
processing order with *decreasing* epochs; a sink that commits epoch by epoch then applies them
in the wrong order, and a LevelDB (upsert) sink keeps the older value. The contract
(DESIGN.md, "Execution model") is that an operator instance's outputs carry non-decreasing epochs
in its processing order.

The pipeline (`pipelines/top_page.py`) is what a user would write: page views in JSONL files of
very different sizes, a running count per (user, page) into one LevelDB sink, and, keyed by user,
each user's top page into another. Both committed key-value sets must equal an independent
computation in plain Python over the same files, for W = 1, 2 and 3, with small epochs so that
the workers' sources are many epochs apart when their records meet.
"""

from __future__ import annotations

import collections
import json
import os
import random
from typing import Any

import pytest

import nosync as ns

HERE = os.path.dirname(os.path.abspath(__file__))
PIPELINES = os.path.join(HERE, "pipelines")

USERS = 500
PAGES = 8
# Files of very different sizes: with partition i read by worker i % W, each worker gets a
# different number of files and records for W = 2 and 3, so its source runs at its own epoch pace.
FILE_SIZES = [12_000, 4_000, 100, 4_000, 100, 4_000, 100]
EPOCH_RECORDS = 50


def write_views(directory: str) -> list[tuple[str, str]]:
    """Writes the input files; returns every (user, page) view, in no particular order."""
    rng = random.Random(20261122)
    pages = [f"p{j}" for j in range(PAGES)]
    weights = [1.0 / (j + 1) for j in range(PAGES)]  # some pages more popular, so tops vary
    views: list[tuple[str, str]] = []
    os.makedirs(directory)
    for i, size in enumerate(FILE_SIZES):
        with open(os.path.join(directory, f"views-{i}.jsonl"), "w", encoding="utf-8") as f:
            for _ in range(size):
                user = f"u{rng.randrange(USERS)}"
                page = rng.choices(pages, weights)[0]
                views.append((user, page))
                f.write(json.dumps({"user": user, "page": page}) + "\n")
    return views


def expected_counts(views: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    return dict(collections.Counter(views))


def expected_tops(counts: dict[tuple[str, str], int]) -> dict[str, tuple[str, int]]:
    """Per user, the page with the highest final count; ties go to the smallest page name."""
    tops: dict[str, tuple[str, int]] = {}
    for (user, page), n in counts.items():
        best = tops.get(user)
        if best is None or (-n, page) < (-best[1], best[0]):
            tops[user] = (page, n)
    return tops


def normalise(value: Any) -> Any:
    """msgpack gives back tuples or lists for what was a tuple: compare as tuples."""
    return tuple(normalise(v) for v in value) if isinstance(value, (list, tuple)) else value


def differences(got: dict, expected: dict) -> list[tuple[Any, Any, Any]]:
    """(key, committed value, expected value) for every key where they differ, sorted by key."""
    keys = set(got) | set(expected)
    return sorted(
        ((k, got.get(k), expected.get(k)) for k in keys if got.get(k) != expected.get(k)),
        key=lambda d: repr(d[0]),
    )


def describe(name: str, diffs: list, total: int) -> str:
    shown = ", ".join(f"{k!r}: got {g!r}, expected {e!r}" for k, g, e in diffs[:5])
    return f"{name}: {len(diffs)} of {total} keys wrong (e.g. {shown})"


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_upsert_sinks_end_with_the_latest_value(spark, tmp_path, workers: int) -> None:
    views = write_views(str(tmp_path / "in"))
    out = tmp_path / "out"
    result = ns.run(
        os.path.join(PIPELINES, "top_page.py"),
        workers=workers,
        spark=spark,
        run_dir=str(tmp_path / "run"),
        epoch_records=EPOCH_RECORDS,
        params={"input": str(tmp_path / "in" / "*.jsonl"), "output": str(out)},
    )
    assert result.summary["records_read"] == len(views)

    counts = expected_counts(views)
    tops = expected_tops(counts)
    got_counts = {normalise(k): v for k, v in ns.sinks.LevelDB(str(out / "counts")).read_committed().items()}
    got_tops = {k: normalise(v) for k, v in ns.sinks.LevelDB(str(out / "top")).read_committed().items()}

    wrong_counts = differences(got_counts, counts)
    wrong_tops = differences(got_tops, tops)
    problems = []
    if wrong_counts:
        problems.append(describe("counts per (user, page)", wrong_counts, len(counts)))
    if wrong_tops:
        problems.append(describe("top page per user", wrong_tops, len(tops)))
    assert not problems, f"W={workers}: " + "; ".join(problems)
