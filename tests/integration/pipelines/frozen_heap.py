"""Test pipeline: each record becomes (key, the number of objects the collector of the worker
that processes it holds frozen), so that a test can see that a worker runs with the heap it
was set up with out of the collector's full passes. Parameters: records, keys, output."""

import gc

import nosync as ns


def build(args):
    p = ns.Pipeline("frozen_heap")
    src = p.source(ns.sources.Generator(records=int(args.get("records", 2000)), keys=int(args.get("keys", 50))))
    src.key_by(lambda k: k).map(lambda k: (k, gc.get_freeze_count())).sink(
        ns.sinks.Files(args["output"], format="jsonl")
    )
    return p
