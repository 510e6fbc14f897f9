"""`nosync bench recovery`: one of W workers killed mid-run; how long until the run is back.

`keyed_count` over K keys (records = `records_per_key` x K, at least 2M) runs under each mode
on one embedded Spark session. Once half the records are read and the mode has something to
recover from (a completed checkpoint or a safe point), worker W-1's process gets SIGKILL. From
the run's summary: `recovery_s` (failure to throughput back at 90% of its level before it, from
the progress samples), `restore_s` (failure to every worker processing again), `detection_s`
(how long the lost worker had been silent when its loss was seen: an upper bound of the
detection delay), and `records_reprocessed` (records read again because of the failure).
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
    progress: Any = lambda m: None,
) -> dict:
    from experiments.measure import recovery
    from nosync.spark_host import get_spark

    records = records or max(2_000_000, 4 * keys)
    # mode replay recomputes with batch jobs beside the W streaming tasks: 2W slots
    spark = get_spark(master, 2 * workers if "replay" in modes else workers)
    out: dict[str, Any] = {
        "workload": "keyed_count",
        "workers": workers,
        "keys": keys,
        "records": records,
        "interval_ms": interval_ms,
        "modes": {},
    }
    work = tempfile.mkdtemp(prefix="nosync-bench-recovery-")
    try:
        for mode in modes:
            progress(f"mode {mode}: keyed_count, {keys:,} keys, {records:,} records")
            out["modes"][mode] = recovery(
                spark, os.path.join(work, mode), mode, workers, keys, records, interval_ms, progress=progress
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def render(r: dict) -> str:
    fields = [
        "recovery_s",
        "restore_s",
        "detection_s",
        "records_reprocessed",
        "frames_replayed",
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
            vals.append("-" if v is None else f"{v:,.2f}" if isinstance(v, float) else f"{v:,}")
        lines.append(f"{f:<{w}}  " + "  ".join(f"{v:>14}" for v in vals))
    return "\n".join(lines)
