"""Test pipeline: keyed_count whose sink, on worker 1 only, holds the commit of what it
pre-committed after its input ended until the file args["gate"] exists. A test can so kill
worker 1 after the run's last safe point, before the run could finish."""

import os
import time

import nosync as ns

EOS = 1 << 62


class GatedFiles(ns.sinks.Files):
    def __init__(self, directory: str, gate: str) -> None:
        super().__init__(directory, format="parquet")
        self.gate = gate

    def open_part(self, worker: int, run_id: str):
        part = super().open_part(worker, run_id)
        if worker != 1:
            return part
        gate = self.gate
        state = {"ended": False, "final": None}
        seal, precommit, commit = part.seal, part.precommit, part.commit_precommit

        def sealed(epoch):
            state["ended"] = state["ended"] or epoch >= EOS
            return seal(epoch)

        def precommitted(checkpoint):
            if state["ended"] and state["final"] is None:
                state["final"] = checkpoint
            return precommit(checkpoint)

        def gated(checkpoint, handle):
            if state["final"] is not None and checkpoint >= state["final"]:
                while not os.path.exists(gate):
                    time.sleep(0.01)
            return commit(checkpoint, handle)

        part.seal, part.precommit, part.commit_precommit = sealed, precommitted, gated
        return part


def build(args: dict) -> ns.Pipeline:
    records, keys = int(args.get("records", 1_000_000)), int(args.get("keys", 100_000))
    p = ns.Pipeline("gated_count")
    src = p.source(ns.sources.Generator(records=records, keys=keys))
    counts = src.key_by(lambda k: k).aggregate(int, lambda n, _: n + 1)
    counts.sink(GatedFiles(args["output"], args["gate"]))
    return p
