"""Test pipeline: keyed_count whose sink, on worker 1 only, holds the commit of any pre-commit
that holds a record of epoch args["hold_epoch"] or later until the file args["gate"] exists. With
that epoch the last one, a test can so kill worker 1 after the run's last safe point, before the
run could finish."""

import os
import time

import nosync as ns
from nosync.api.sinks import PART_NAME


class GatedFiles(ns.sinks.Files):
    def __init__(self, directory: str, gate: str, hold_epoch: int) -> None:
        super().__init__(directory, format="parquet")
        self.gate = gate
        self.hold_epoch = hold_epoch

    def open_part(self, worker: int, run_id: str):
        part = super().open_part(worker, run_id)
        if worker != 1:
            return part
        gate, hold = self.gate, self.hold_epoch
        commit = part.commit_precommit

        def gated(checkpoint, handle):
            if any(int(PART_NAME.match(name).group(1)) >= hold for name in handle["files"]):
                while not os.path.exists(gate):
                    time.sleep(0.01)
            return commit(checkpoint, handle)

        part.commit_precommit = gated
        return part


def build(args: dict) -> ns.Pipeline:
    records, keys = int(args.get("records", 1_000_000)), int(args.get("keys", 100_000))
    p = ns.Pipeline("gated_count")
    src = p.source(ns.sources.Generator(records=records, keys=keys))
    counts = src.key_by(lambda k: k).aggregate(int, lambda n, _: n + 1)
    counts.sink(GatedFiles(args["output"], args["gate"], int(args["hold_epoch"])))
    return p
