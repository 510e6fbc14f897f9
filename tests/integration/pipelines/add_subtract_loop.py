"""Test pipeline: the invariant of an iteration checkpointing test, ported. Source record i is
ADD(2) for key i % keys; the loop adds it to the key's sum and feeds back SUBTRACT(1), which
takes 1 off the sum and leaves. Every change to a sum is emitted as [key, i, delta], so the
committed deltas of a key add up to its sum: after any kills, the sums over all keys must be
exactly the number of source records, each record's +2 and -1 present once.

The loop's body is keyed, so ADD and SUBTRACT go round through the worker that owns the key,
and a SUBTRACT is in flight on the back edge whenever a barrier or a snapshot is taken.
Parameters: records (default 300,000), keys (default 1,000), output.
"""

import nosync as ns

ADD, SUB, OUT = 0, 1, 2


def apply(total, rec):
    kind, key, i = rec
    total = total or 0
    if kind == ADD:
        return total + 2, [(OUT, key, i, 2), (SUB, key, i)]
    return total - 1, [(OUT, key, i, -1)]


def build(args):
    records = int(args.get("records", 300_000))
    keys = int(args.get("keys", 1_000))
    p = ns.Pipeline("add_subtract_loop")
    adds = p.source(ns.sources.Generator(records=records, fn=lambda i: (ADD, i % keys, i)), name="adds")
    out = adds.iterate(
        lambda s: s.key_by(lambda r: r[1], name="by_key").stateful_map(apply, name="sums"),
        keep=lambda r: r[0] == SUB,
        name="add_subtract",
    )
    out.map(lambda r: [r[1], r[2], r[3]], name="delta").sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
