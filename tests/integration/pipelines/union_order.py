"""Test pipeline whose output depends on how two sources of one worker interleave.

Two generated inputs of the same keys, tagged "a" and "b", meet at one keyed `stateful_map`
that numbers the records of each key as they come: [key, n, tag]. With an even number of keys
and W = 2, every record of a key, from either input, is read by the same worker (record i is
key str(i % keys), and worker w reads the records i with i % 2 == w), so the order of a key's
records is the order in which that worker alternates between its two sources. Two
failure-free runs with the same chunk size agree; another chunk size shifts the alternation.
Parameters: records (per input), keys, output."""

import nosync as ns


def number(n, rec):
    n = (n or 0) + 1
    return n, [[rec[0], n, rec[1]]]


def build(args):
    records = int(args.get("records", 200_000))
    keys = int(args.get("keys", 1000))
    p = ns.Pipeline("union_order")
    a = p.source(ns.sources.Generator(records=records, keys=keys), name="input_a").map(lambda k: (k, "a"))
    b = p.source(ns.sources.Generator(records=records, keys=keys), name="input_b").map(lambda k: (k, "b"))
    a.union(b).key_by(lambda r: r[0]).stateful_map(number).sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
