"""Test pipeline with a branch that ends early and reaches a later stage than the other:

    small (1,000 records) -> key_by -> aggregate "per_key" -> key_by -> aggregate "twice" -> Null (stage 2)
    big (`records`)        -> key_by -> aggregate "counts" -> sink                          (stage 1)

Record i of either source is the key str(i % 100). "twice" counts, per key, the running
counts "per_key" emitted: 10 per key. Parameters: records, output."""

import nosync as ns


def build(args):
    p = ns.Pipeline("two_branches")
    small = p.source(ns.sources.Generator(records=1000, keys=100), name="small")
    per_key = small.key_by(lambda k: k).aggregate(int, lambda n, _: n + 1, name="per_key")
    twice = per_key.key_by(lambda kv: kv[0]).aggregate(int, lambda n, _: n + 1, name="twice")
    twice.sink(ns.sinks.Null(), name="nowhere")
    big = p.source(ns.sources.Generator(records=int(args.get("records", 1_000_000)), keys=100), name="big")
    counts = big.key_by(lambda k: k).aggregate(int, lambda n, _: n + 1, name="counts")
    counts.sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
