"""Test pipeline whose function keeps its worker's loop busy, in pure Python (holding the
interpreter, as a heavy user function does), for `busy_s` seconds on one record (record "777"
of the generator, whose keys are all distinct), then passes it on. Parameters: records, busy_s,
output."""

import time

import nosync as ns


def build(args):
    busy_s = float(args.get("busy_s", 3.0))
    records = int(args.get("records", 10_000))

    def spin(record):
        if record == "777":
            end = time.monotonic() + busy_s
            n = 0
            while time.monotonic() < end:
                n += 1
        return record

    p = ns.Pipeline("busy_record")
    src = p.source(ns.sources.Generator(records=records, keys=records))
    counts = src.map(spin).key_by(lambda k: k).aggregate(int, lambda n, _: n + 1)
    counts.sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
