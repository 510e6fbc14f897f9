"""Test pipeline: keyed_count (experiments/workloads/keyed_count.py) whose sink prints to the
console instead of writing files. The same graph and names, for `nosync rewind --pipeline`:
its output cannot start with a run's files."""

import nosync as ns


def build(args: dict) -> ns.Pipeline:
    p = ns.Pipeline("keyed_count")
    src = p.source(
        ns.sources.Generator(records=int(args.get("records", 1_000_000)), keys=int(args.get("keys", 100_000)))
    )
    counts = src.key_by(lambda k: k).aggregate(int, lambda n, _: n + 1)
    counts.sink(ns.sinks.Console())
    return p
