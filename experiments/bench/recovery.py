"""`nosync bench recovery`: one of W workers killed mid-run; how long until the run is back.

`keyed_count` over K keys (8 x K records, at least 8M) runs under each mode
on one embedded Spark session, `--reps` times (the modes taking turns; medians reported, every
run kept under `runs`). Once half the records are read and the mode has something to
recover from (a completed checkpoint or a safe point), worker W-1's process gets SIGKILL. From
the run's summary: `recovery_s` (failure to throughput back at 90% of its level before it, from
the progress samples), `caught_up_s` (failure to every worker having read again what it had read
before it: the work lost, redone), `restore_s` (failure to every worker processing again), `detection_s`
(how long the lost worker had been silent when its loss was seen: an upper bound of the
detection delay), and `records_reprocessed` (records read again because of the failure).

`failure` "machine" loses the victim's local root with its process (`experiments.failures`):
each mode then runs once per level it can recover from (`tiers`; default: the replicated level
and the remote tier), each a column `mode@tier`, and `restored_from` says where the victim's
state came from.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any


def run(
    modes: list[str],
    workers: int,
    keys: int,
    records: int | None = None,
    master: str | None = None,
    interval_ms: int = 1000,
    reps: int = 1,
    progress: Any = lambda m: None,
    failure: str = "process",
    tiers: list[str] | None = None,
) -> dict:
    from experiments.failures import refusal
    from experiments.measure import recovery
    from nosync.errors import NosyncError
    from nosync.spark.session import get_spark

    # the kill comes at half the records: the other half must outlast the recovery, or a
    # survivor that went on ends its input before the throughput could come back
    records = records or max(8_000_000, 8 * keys)
    # mode replay recomputes with batch jobs beside the W streaming tasks: 2W slots
    spark = get_spark(master, 2 * workers if "replay" in modes else workers)
    out: dict[str, Any] = {
        "workload": "keyed_count",
        "workers": workers,
        "keys": keys,
        "records": records,
        "interval_ms": interval_ms,
        "reps": reps,
        "failure": failure,
        "modes": {},
    }
    if tiers is None:
        tiers = ["disk"] if failure == "process" else ["replicated", "remote"]
    # (column, mode, tier) of every run a rep makes; a level a mode cannot recover from is left out
    configs = [
        (m if len(tiers) == 1 else f"{m}@{t}", m, t)
        for m in modes
        for t in tiers
        if refusal(m, failure, t, None, workers) is None and not (t == "replicated" and m != "nosync")
    ]
    if not configs:
        raise NosyncError(f"no mode of {', '.join(modes)} recovers from --failure {failure} on {', '.join(tiers)}")
    out["skipped"] = [f"{m}@{t}" for m in modes for t in tiers if (f"{m}@{t}", m, t) not in configs and len(tiers) > 1]
    runs: dict[str, list[dict]] = {c: [] for c, _, _ in configs}
    work = tempfile.mkdtemp(prefix="nosync-bench-recovery-")
    try:
        for rep in range(reps):
            # the modes take turns, so that a slow spell of the machine falls on each alike
            for col, mode, tier in configs:
                progress(f"{col}, run {rep + 1}/{reps}: keyed_count, {keys:,} keys, {records:,} records, {failure}")
                d = os.path.join(work, f"{mode}-{tier}-{rep}")
                runs[col].append(
                    recovery(
                        spark,
                        d,
                        mode,
                        workers,
                        keys,
                        records,
                        interval_ms,
                        tier=tier,
                        failure=failure,
                        progress=progress,
                    )
                )
                shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for mode, got in runs.items():
        out["modes"][mode] = {**_medians(got), "runs": got}
    return out


def _medians(runs: list[dict]) -> dict:
    """Per field, the median over the runs that have it (a run whose input ended before the
    throughput came back has no recovery_s: `<field>_missing` counts those)."""
    out: dict = {}
    for f in runs[0]:
        vals = [r.get(f) for r in runs]
        nums = sorted(v for v in vals if isinstance(v, int | float) and not isinstance(v, bool))
        if nums:
            mid = len(nums) // 2
            out[f] = nums[mid] if len(nums) % 2 else (nums[mid - 1] + nums[mid]) / 2
            if len(nums) < len(vals):
                out[f"{f}_missing"] = len(vals) - len(nums)
        else:
            out[f] = vals[0] if len(set(map(repr, vals))) == 1 else None
    return out


def render(r: dict) -> str:
    fields = [
        "recovery_s",
        "caught_up_s",
        "restore_s",
        "detection_s",
        "records_reprocessed",
        "frames_replayed",
        "restored_from",
        "killed_at_read",
        "records_per_s",
    ]
    modes = list(r["modes"])
    w = max(len(f) for f in fields)
    lines = [f"{'':<{w}}  " + "  ".join(f"{m:>14}" for m in modes)]
    for f in fields:
        vals = []
        for m in modes:
            v = r["modes"][m].get(f)
            vals.append(
                "-" if v is None else f"{v:,.2f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else v
            )
        lines.append(f"{f:<{w}}  " + "  ".join(f"{v:>14}" for v in vals))
    return "\n".join(lines)
