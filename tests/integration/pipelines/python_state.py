"""State held in Python's own containers: a Counter, a set and a frozenset, which the state
codec saves as themselves (a Counter restored is a Counter, and `update` still works on it).
Record i is {"k": i * 7919 % 3000, "v": i % 23}. `hist` counts each key's values into a
Counter (its last value per key goes to a LevelDB sink); `firsts` keeps the set of values a key
has seen and emits [k, v] the first time it sees v, and [k, "all"] once it has seen all 23
(the set then becomes a frozenset); every output is the same whatever order a key's records
come in. Parameters: records, output."""

import collections
import os

import nosync as ns


def count(c, r):
    c.update([r["v"]])
    return c


def first_seen(seen, r):
    if seen is None:
        seen = set()
    if isinstance(seen, frozenset) or r["v"] in seen:
        return seen, []
    seen.add(r["v"])
    if len(seen) == 23:
        return frozenset(seen), [[r["k"], r["v"]], [r["k"], "all"]]
    return seen, [[r["k"], r["v"]]]


def build(args):
    n = int(args.get("records", 600_000))
    out = args["output"]
    p = ns.Pipeline("python_state")
    src = p.source(ns.sources.Generator(records=n, fn=lambda i: {"k": i * 7919 % 3000, "v": i % 23}), name="src")
    keyed = src.key_by(lambda r: r["k"])
    keyed.aggregate(collections.Counter, count, name="hist").sink(
        ns.sinks.LevelDB(os.path.join(out, "hist")), name="hist_out"
    )
    keyed.stateful_map(first_seen, name="firsts").sink(
        ns.sinks.Files(os.path.join(out, "firsts"), format="jsonl"), name="firsts_out"
    )
    return p
