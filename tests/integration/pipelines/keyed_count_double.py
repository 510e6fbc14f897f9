"""Test pipeline: keyed_count (experiments/workloads/keyed_count.py) with a changed aggregate,
which counts every record twice. The same graph and names, for `nosync rewind --pipeline`."""

import nosync as ns


def build(args: dict) -> ns.Pipeline:
    p = ns.Pipeline("keyed_count")
    src = p.source(
        ns.sources.Generator(records=int(args.get("records", 1_000_000)), keys=int(args.get("keys", 100_000)))
    )
    counts = src.key_by(lambda k: k).aggregate(int, lambda n, _: n + 2)
    counts.sink(ns.sinks.Files(args.get("output", "keyed-count-out"), format="parquet"))
    return p
