"""Records of `size` characters (150,000 by default) through an exchange: a buffer of 1024 of
them is far past the 64 MiB a frame holds, so it goes in several. Record i is
{"k": str(i % 50), "doc": the letter i % 26, size times}; the sink gets (key, characters so
far) for every record. Parameters: records, size, output."""

import os

import nosync as ns


def build(args):
    n = int(args.get("records", 3000))
    size = int(args.get("size", 150_000))
    p = ns.Pipeline("big_records")
    docs = p.source(ns.sources.Generator(records=n, fn=lambda i: {"k": str(i % 50), "doc": chr(97 + i % 26) * size}))
    docs.key_by(lambda r: r["k"]).aggregate(int, lambda a, r: a + len(r["doc"]), name="chars").sink(
        ns.sinks.Files(os.path.join(args["output"], "chars"), format="jsonl"), name="out"
    )
    return p
