"""Test pipeline whose output depends on the order in which records arrive from two inputs.

Two generated inputs of the same keys, tagged "a" and "b", meet at one keyed `stateful_map`
that numbers the records of each key as they come: (key, n, tag). Which tag gets which n
depends on how the two inputs interleave; every valid run numbers each key's records 1..N
exactly once, with as many "a" as that key has in input a. With an even number of keys at
W = 2, both inputs of a key are read by one worker (record i is key str(i % keys), worker w
reads the records with i % 2 == w), so the interleaving is the order in which that worker
alternates between its two sources: two failure-free runs that read in chunks of the same
size can agree, and chunks of another size change it.
Parameters: records (per input), keys, output.
"""

import nosync as ns


def number(n, rec):
    n = (n or 0) + 1
    return n, [[rec[0], n, rec[1]]]


def build(args):
    records = int(args.get("records", 1_000_000))
    keys = int(args.get("keys", 1000))
    p = ns.Pipeline("arrival_order")
    a = p.source(ns.sources.Generator(records=records, keys=keys), name="input_a").map(lambda k: (k, "a"))
    b = p.source(ns.sources.Generator(records=records, keys=keys), name="input_b").map(lambda k: (k, "b"))
    a.union(b).key_by(lambda r: r[0]).stateful_map(number).sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
