"""Test pipeline with a function that is not deterministic: each record gets a random number
before it is exchanged, so a recomputed batch differs from the one first sent.
Parameters: records, keys, output."""

import random

import nosync as ns


def build(args):
    records = int(args.get("records", 1_000_000))
    keys = int(args.get("keys", 1000))
    p = ns.Pipeline("random_tag")
    src = p.source(ns.sources.Generator(records=records, keys=keys))
    tagged = src.map(lambda k: (k, random.random()))
    tagged.key_by(lambda r: r[0]).aggregate(float, lambda acc, r: acc + r[1]).sink(
        ns.sinks.Files(args["output"], format="jsonl")
    )
    return p
