"""A worker runs a generation with what it was set up with (operators, their state, the
modules) frozen out of the collector's full passes, in every mode."""

from __future__ import annotations

import os

import pytest
from support.paths import PIPELINES

import nosync as ns


@pytest.mark.parametrize("mode", ["none", "nosync"])
def test_a_worker_runs_with_its_heap_frozen(spark, tmp_path, mode):
    out = tmp_path / "out"
    ns.run(
        os.path.join(PIPELINES, "frozen_heap.py"),
        workers=2,
        mode=mode,
        spark=spark,
        run_dir=str(tmp_path / "run"),
        epoch_records=500,
        params={"records": "2000", "keys": "50", "output": str(out)},
    )
    got = ns.sinks.Files(str(out), format="jsonl").read_committed()
    assert len(got) == 2000
    # thousands of objects (the modules alone) are frozen while the worker runs
    assert min(n for _, n in got) > 1000, sorted({n for _, n in got})[:5]
