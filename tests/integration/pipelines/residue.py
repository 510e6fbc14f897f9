"""Test pipeline: counts per key where worker 1 holds big state and worker 0 small state, so
that with a small --persist-budget worker 1 snapshots once and then hardly again, while worker 0
snapshots every --persist-ms. Worker 0's snapshots then hold a residue of its output log: frames
to worker 1 that worker 1's durable point does not cover.

Record i of the generator is str(i % 100); records r < 50 count under a key worker 0 owns, the
others under a key worker 1 owns (both sets picked by the engine's own partitioning for 2
workers). Worker 1's state of a key carries `big` bytes besides the count. Output: [key, n] for
n = 1, 2, ... per key."""

import nosync as ns
from nosync.runtime.graph import partition_of


def owned_keys(prefix: str, worker: int, n: int = 50) -> list[str]:
    out = []
    i = 0
    while len(out) < n:
        k = f"{prefix}{i}"
        if partition_of(k, 2) == worker:
            out.append(k)
        i += 1
    return out


SMALL = owned_keys("s", 0)
BIG = owned_keys("b", 1)


def key_of(r: str) -> str:
    i = int(r)
    return SMALL[i] if i < 50 else BIG[i - 50]


def build(args: dict) -> ns.Pipeline:
    records, big = int(args.get("records", 1_000_000)), int(args.get("big", 100_000))
    pad = b"x" * big

    def count(state, record):
        n = (state[0] if state else 0) + 1
        key = key_of(record)
        return (n, pad if int(record) >= 50 else b""), [[key, n]]

    p = ns.Pipeline("residue")
    src = p.source(ns.sources.Generator(records=records, keys=100))
    src.key_by(key_of).stateful_map(count).sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
