"""Test pipeline: JSONL events -> per-user totals in a LevelDB sink (and the raw totals stream
in JSONL files). Parameters: input, output, kv."""

import nosync as ns


def build(args):
    p = ns.Pipeline("jsonl_to_leveldb")
    events = p.source(ns.sources.Files(args["input"], format="jsonl"))
    totals = events.key_by(lambda e: e["user"]).reduce(
        lambda a, b: {"user": a["user"], "amount": a["amount"] + b["amount"]}
    )
    totals.map(lambda kv: (kv[0], kv[1]["amount"])).sink(ns.sinks.LevelDB(args["kv"]))
    totals.map(lambda kv: kv[1]).sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
