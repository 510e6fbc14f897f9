"""Test pipeline that fails in a process started after the run's first ones.

Every process that applies its `map` leaves a file named by its pid in `starts/`, beside the
output directory (in the run directory, under `nosync chaos`); a process that finds more such
files than there are workers raises. A failure-free run passes; once a worker is killed, the
process that takes its place fails the run. Parameters: records, keys, workers, output.
"""

import os

import nosync as ns


def build(args):
    workers = int(args["workers"])
    starts = os.path.join(os.path.dirname(os.path.abspath(args["output"])), "starts")

    def check(key):
        mark = os.path.join(starts, str(os.getpid()))
        if not os.path.exists(mark):
            os.makedirs(starts, exist_ok=True)
            open(mark, "w").close()
            if len(os.listdir(starts)) > workers:
                raise RuntimeError(f"process {os.getpid()} took the place of a killed worker: this pipeline stops")
        return key

    p = ns.Pipeline("fails_after_a_restart")
    src = p.source(ns.sources.Generator(records=int(args.get("records", 1_000_000)), keys=int(args.get("keys", 1000))))
    counts = src.map(check).key_by(lambda k: k).aggregate(int, lambda n, _: n + 1)
    counts.sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
