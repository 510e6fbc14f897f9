"""The soak grid (`make soak`): the chaos cases of every recovering mode, defined once.

Cases of the shipped workloads are (workload, W, kills, seed), whose test ids read
`workload-W-kills-seed`, e.g. `test_chaos_nosync_soak[keyed_count-3-3-2]`.
"""

from __future__ import annotations

MODES = ("abs", "nosync", "replay")
"""The recovering modes (mode none does not recover: no chaos case)."""

WORKLOADS = ("wordcount", "keyed_count", "nexmark")
"""The shipped workloads (experiments/workloads)."""

WORKERS = (2, 3)

KILLS = {"abs": (1, 2, 3), "nosync": (1, 2, 3), "replay": (1, 2)}
"""Kills in a run, by mode."""

SEEDS = (1, 2)

PIPELINES = ("chaos_mixed", "chaos_chain", "halving_loop", "python_state")
"""Pipelines beyond the shipped workloads (tests/integration/pipelines), judged as they are."""


CLASS_WORKLOADS = (*WORKLOADS, "reachability")
"""The shipped workloads the failure classes are judged on (reachability: a loop across workers)."""

LEVELS = {
    "remote": {"checkpoint_tier": "remote"},
    "replicated": {"checkpoint_tier": "replicated", "replicas": 1},
    "replicated+remote": {"checkpoint_tier": "remote", "replicas": 1},
    "replicated-2": {"checkpoint_tier": "replicated", "replicas": 2},
}
"""The levels that survive a lost machine, as the run options that make them."""


def class_cases() -> list[tuple[str, str, str, str]]:
    """(workload, mode, level, failure) at W = 3: a lost machine for every mode and level that
    survives one, two machines lost at once for nosync with two replicas."""
    out = []
    for w in CLASS_WORKLOADS:
        out.append((w, "abs", "remote", "machine"))
        out += [(w, "nosync", lv, "machine") for lv in ("remote", "replicated", "replicated+remote")]
        out.append((w, "nosync", "replicated-2", "two"))
    return out


def cases(mode: str) -> list[tuple[str, int, int, int]]:
    """Mode `mode`'s cases of the shipped workloads: (workload, W, kills, seed)."""
    return [(w, n, k, seed) for w in WORKLOADS for n in WORKERS for k in KILLS[mode] for seed in SEEDS]


def pipeline_cases() -> list[tuple[str, str, int]]:
    """The cases of PIPELINES: (pipeline, mode, W)."""
    return [(p, mode, n) for p in PIPELINES for mode in MODES for n in WORKERS]


def mode_cases() -> list[tuple[str, int]]:
    """(mode, W) for every recovering mode and worker count: the cases of a pipeline with a
    test of its own."""
    return [(mode, n) for mode in MODES for n in WORKERS]
