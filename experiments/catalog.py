"""The experiments `nosync experiment NAME` runs, by name; each is declared, with its grid,
measurement, figure, reading and table, in a module of its own.

Every measurement is a run of `keyed_count` (generated records over K keys, a running count per
key, committed to Parquet files), or for `cycles` of `reachability` (a loop across workers),
through `experiments.measure`, the code `nosync bench` uses.
The full grids are the defaults; the `--quick` grids are much smaller (`experiment all --quick`
runs every experiment here, ten of them, on a 2-core machine) and are meant to check the pipeline
of figures, not to be quoted without their repetitions. `cli.experiment.NAMES` lists the same
names in the same order: `all` runs them and `--help` counts them.
"""

from __future__ import annotations

from experiments import budget, cycles, detection, failure_classes, overhead, recovery, scaling, snapshot, stall
from experiments.harness import Experiment

EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        overhead.EXPERIMENT,
        stall.EXPERIMENT,
        recovery.VS_STATE,
        recovery.VS_FAILURE_POINT,
        scaling.EXPERIMENT,
        snapshot.EXPERIMENT,
        budget.EXPERIMENT,
        cycles.EXPERIMENT,
        failure_classes.EXPERIMENT,
        detection.EXPERIMENT,
    )
}
