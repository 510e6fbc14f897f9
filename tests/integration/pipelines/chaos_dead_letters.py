"""Chaos pipeline with malformed input: JSONL files (one partition each) in which some lines
are not JSON go to the dead-letter files, the rest are summed per key into a LevelDB sink, and
the records with v == 0 are kept in a Files sink. Parameters: input (a directory of *.jsonl),
output."""

import os

import nosync as ns


def build(args):
    p = ns.Pipeline("chaos_dead_letters")
    lines = p.source(ns.sources.Files(os.path.join(args["input"], "*.jsonl"), format="jsonl"), name="lines")
    sums = lines.key_by(lambda r: r["k"], name="by_k").aggregate(int, lambda a, r: a + r["v"], name="sums")
    sums.sink(ns.sinks.LevelDB(os.path.join(args["output"], "kv")), name="kv")
    lines.filter(lambda r: r["v"] == 0, name="zeros").sink(
        ns.sinks.Files(os.path.join(args["output"], "zeros"), format="jsonl"), name="zeros_out"
    )
    return p
