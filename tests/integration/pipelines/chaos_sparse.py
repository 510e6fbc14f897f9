"""Chaos pipeline of sparse and uneven inputs: a CSV file read as one partition (the other
workers have none of it), a generator of 5 partitions unioned with an empty one, records of
2 to 2.5 KB through an exchange, a window re-keyed by its start into a LevelDB sink, a join
of the CSV's users with the generator's, a Parquet sink, and a sink that never gets a record.

events (a CSV file: id, t, user) is read as event times t into windows of 100 per user; the
generator's record i is the key str(i % 3000). Parameters: records, events, output."""

import os

import nosync as ns


def build(args):
    n = int(args.get("records", 300_000))
    out = args["output"]
    p = ns.Pipeline("chaos_sparse")
    ev = p.source(ns.sources.Files(args["events"], format="csv"), name="events")
    gen = p.source(ns.sources.Generator(records=n, keys=3000, partitions=5), name="gen5")
    empty = p.source(ns.sources.Generator(records=0), name="empty")
    both = gen.union(empty, name="both")
    big = both.flat_map(lambda k: [(k, "x" * (2000 + int(k) % 500))] if int(k) % 3 == 0 else [], name="big")
    sizes = big.key_by(lambda t: t[0], name="by_k").aggregate(int, lambda a, t: a + len(t[1]), name="sizes")
    sizes.sink(ns.sinks.Files(os.path.join(out, "sizes"), format="parquet"), name="sizes_out")
    never = sizes.filter(lambda kv: kv[1] < 0, name="never")
    never.sink(ns.sinks.Files(os.path.join(out, "none"), format="jsonl"), name="none_out")
    per_user = ev.key_by(lambda r: r["user"], name="by_user")
    win = per_user.window(100, lambda r: r["t"], int, lambda c, _: c + 1, name="win")
    starts = win.map(lambda kv: (kv[1][0], kv[1][1]), name="start_count").key_by(lambda t: int(t[0]), name="by_start")
    starts.aggregate(int, lambda a, t: a + t[1], name="per_start").sink(
        ns.sinks.LevelDB(os.path.join(out, "kv")), name="kv"
    )
    some = both.filter(lambda k: int(k) % 50 == 0, name="some").key_by(lambda k: f"u{int(k) % 200}", name="by_user2")
    pairs = per_user.join(some, name="pairs")
    pairs.map(lambda kv: [kv[0], kv[1][0]["id"], kv[1][1]], name="flat_pairs").sink(
        ns.sinks.Files(os.path.join(out, "pairs"), format="jsonl"), name="pairs_out"
    )
    return p
