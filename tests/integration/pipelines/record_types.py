"""Lists in records and in a key, through an exchange and across a forward edge into a later
batch stage. Record i is [i % 20, ["x", i % 3]], keyed by the list [i % 4, "k"]; `counts`
counts each key's records and those whose value arrived as the tuple ("x", 0). `side` takes the
records of i % 20 == 0 before the exchange and joins them in a union after it. Every output
row says the type its second item has after the union. Parameters: records, output; bad=1
makes record 7 carry a set, which no exchange can encode."""

import nosync as ns


def pair(i, bad):
    return [i % 20, {"x", 0} if bad and i == 7 else ["x", i % 3]]


def build(args):
    n = int(args.get("records", 20_000))
    bad = args.get("bad") == "1"
    p = ns.Pipeline("record_types")
    pairs = p.source(ns.sources.Generator(records=n, fn=lambda i: i), name="src").map(
        lambda i: pair(i, bad), name="pairs"
    )
    counts = pairs.key_by(lambda t: [t[0] % 4, "k"], name="by_list").aggregate(
        lambda: (0, 0), lambda a, t: (a[0] + 1, a[1] + (t[1] == ("x", 0))), name="counts"
    )
    side = pairs.filter(lambda t: t[0] == 0, name="side")
    shown = counts.map(lambda kv: ["count", list(kv[0]), list(kv[1])], name="show")
    both = shown.union(side.map(lambda t: ["side", t[1]], name="tag"), name="both")
    both.map(lambda r: [r[0], type(r[1]).__name__, r[1], *r[2:]], name="typed").sink(
        ns.sinks.Files(args["output"], format="jsonl"), name="out"
    )
    return p
