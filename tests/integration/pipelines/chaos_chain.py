"""Chaos pipeline beyond the shipped workloads: Zipf-skewed keys; a stateless branch with no
exchange into its own sink; two keyed stages in a row; state deleted (a stateful_map that
returns None every 10th record of a key); a LevelDB sink and two Files sinks.
Parameters: records, output."""

import os

import nosync as ns


def reset_every_10(n, _):
    n = (n or 0) + 1
    return (None, [["full"]]) if n == 10 else (n, [])


def build(args):
    n = int(args.get("records", 600_000))
    out = args["output"]
    p = ns.Pipeline("chaos_chain")
    src = p.source(ns.sources.Generator(records=n, keys=5000, skew=1.1), name="skewed")
    src.filter(lambda k: int(k) % 7 == 0).map(lambda k: {"k": k, "sq": int(k) ** 2}).sink(
        ns.sinks.Files(os.path.join(out, "side"), format="jsonl"), name="side"
    )
    last5 = src.map(lambda k: (k, len(k))).key_by(lambda t: t[0]).aggregate(list, lambda a, t: (a + [t[1]])[-5:])
    second = last5.map(lambda kv: (int(kv[0]) % 97, sum(kv[1])), name="to_k2")
    totals = second.key_by(lambda t: t[0]).aggregate(int, lambda a, t: a + t[1], name="totals")
    totals.sink(ns.sinks.LevelDB(os.path.join(out, "kv")), name="kv")
    resets = second.key_by(lambda t: t[0]).stateful_map(reset_every_10, name="resets")
    resets.sink(ns.sinks.Files(out, format="jsonl"), name="resets_out")
    return p
