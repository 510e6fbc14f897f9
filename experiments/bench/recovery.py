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

With `rate` (records/s per partition), the runs are in the steady-state regime instead:
keyed_count reads a paced generator, open loop and unbounded, each key's state carrying a value
of `value_bytes`, for `duration` seconds (at least MIN_WINDOW_INTERVALS intervals, else refused),
and the kill comes at `kill_at_s` seconds of input (default: once every key has its state, keys
cycling, plus a quarter of what is left, and no sooner than half-way). The result adds
`drained_s` (kill to the backlog of records due back at its level before), the latency of
committed output over the whole run (due to committed, p50/p99/p99.9: a kill's queueing
counts), the longest stall, the share of the workers' time persistence took (`persist_share`:
abs's checkpoints and nosync's snapshots at the same fixed interval), and the run directory's
bytes at the kill (the state on disk).

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
    rate: float | None = None,
    value_bytes: int = 0,
    duration: float = 120.0,
    kill_at_s: float | None = None,
    options: dict | None = None,
) -> dict:
    from experiments.bench.sustain import MIN_WINDOW_INTERVALS
    from experiments.failures import refusal
    from experiments.measure import recovery
    from nosync.errors import NosyncError
    from nosync.spark.session import get_spark

    paced = None
    if rate is not None:
        if records is not None:
            raise NosyncError("give --records (a run of that many records) or --rate (a paced run), not both")
        if duration * 1000 < MIN_WINDOW_INTERVALS * interval_ms:
            raise NosyncError(
                f"--duration {duration:g} holds {duration * 1000 / interval_ms:.0f} intervals of {interval_ms} ms; "
                f"a steady run needs at least {MIN_WINDOW_INTERVALS}: --duration "
                f"{MIN_WINDOW_INTERVALS * interval_ms / 1000:g} or more"
            )
        filled = keys / (rate * workers)
        at = kill_at_s if kill_at_s is not None else max(duration / 2, filled + (duration - filled) / 4)
        if not filled <= at < duration:
            raise NosyncError(
                f"--kill-at-s {at:g}: the kill must come once every key has its state ({filled:.1f} s of input "
                f"at {rate:g} records/s per partition) and before the run ends (--duration {duration:g})"
            )
        kill_at_read = int(at * rate * workers)
        paced = {"rate": rate, "value_bytes": value_bytes, "duration": duration, "kill_at_read": kill_at_read}
        records = paced["kill_at_read"]
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
        "rate_per_partition": rate,
        "value_bytes": value_bytes if rate is not None else 0,
        "duration_s": duration if rate is not None else None,
        "kill_at_read": paced["kill_at_read"] if paced else None,
        "reps": reps,
        "options": options or {},
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
                what = f"{rate:g} records/s per partition for {duration:g} s" if paced else f"{records:,} records"
                progress(f"{col}, run {rep + 1}/{reps}: keyed_count, {keys:,} keys, {what}, {failure}")
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
                        paced=paced,
                        options=options,
                    )
                )
                if paced is None:
                    _check_long_enough(col, runs[col][-1], records, interval_ms)
                shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for mode, got in runs.items():
        out["modes"][mode] = {**_medians(got), "runs": got}
    return out


def _check_long_enough(col: str, r: dict, records: int, interval_ms: int) -> None:
    """Refuses a recovery measured in a run shorter than MIN_WINDOW_INTERVALS intervals."""
    from experiments.bench.sustain import MIN_WINDOW_INTERVALS
    from nosync.errors import NosyncError

    seconds = r.get("processing_s") or 0.0
    if seconds * 1000 < MIN_WINDOW_INTERVALS * interval_ms:
        need = int(records * MIN_WINDOW_INTERVALS * interval_ms / 1000 / max(seconds, 1e-3)) + 1
        raise NosyncError(
            f"{col}: the run lasted {seconds:.1f} s, {seconds * 1000 / interval_ms:.0f} intervals of {interval_ms} ms; "
            f"a recovery needs runs of at least {MIN_WINDOW_INTERVALS}: --records {need:,} or more, or a paced run "
            f"(--rate)"
        )


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
        "restore_s",
        "recovery_s",
        "caught_up_s",
        "drained_s",
        "detection_s",
        "records_reprocessed",
        "frames_replayed",
        "restored_from",
        "killed_at_read",
        "records_per_s",
        "records_read",
        "latency_p99_ms",
        "stall_ms_max",
        "persist_share",
        "run_dir_bytes_at_kill",
        "keys_read_alone",
    ]
    fields = [f for f in fields if any(f in m for m in r["modes"].values())]
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
