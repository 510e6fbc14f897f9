"""Test pipeline whose function raises on one record (key "777" of the generator), after
an exchange, so the error happens in a later batch stage. Parameters: records, output."""

import nosync as ns


def check(kv):
    if kv[0] == "777":
        raise ValueError("key 777 is refused by this test pipeline")
    return kv


def build(args):
    p = ns.Pipeline("fails_on_a_record")
    src = p.source(ns.sources.Generator(records=int(args.get("records", 10_000)), keys=1000))
    counts = src.key_by(lambda k: k).aggregate(int, lambda n, _: n + 1)
    counts.map(check).sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
