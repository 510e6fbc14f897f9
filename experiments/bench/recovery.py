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
import signal
import tempfile
from typing import Any

from experiments.chaos import PROGRESS_EVENTS, Events

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(os.path.dirname(HERE), "workloads", "keyed_count.py")


def run(
    modes: list[str],
    workers: int,
    keys: int,
    records: int | None = None,
    master: str | None = None,
    checkpoint_ms: int = 1000,
    progress: Any = lambda m: None,
) -> dict:
    from nosync.runner import run as run_pipeline
    from nosync.spark_host import get_spark

    records = records or max(2_000_000, 4 * keys)
    # mode replay recomputes with batch jobs beside the W streaming tasks: 2W slots
    spark = get_spark(master, 2 * workers if "replay" in modes else workers)
    out: dict[str, Any] = {"workload": "keyed_count", "workers": workers, "keys": keys, "records": records, "modes": {}}
    work = tempfile.mkdtemp(prefix="nosync-bench-recovery-")
    try:
        for mode in modes:
            d = os.path.join(work, mode)
            killed: dict = {}
            victim = workers - 1
            events = Events(os.path.join(d, "events.jsonl"))

            def watch(
                p: dict, events: Events = events, killed: dict = killed, victim: int = victim, mode: str = mode
            ) -> None:
                if killed or p["read"] < records // 2:
                    return
                events.poll()
                if not any(e["event"] in PROGRESS_EVENTS for e in events.seen):
                    return
                pid = events.pid_of(victim)
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    killed["at_read"] = p["read"]
                    progress(f"mode {mode}: killed worker {victim} at {p['read']:,} records read")

            progress(f"mode {mode}: keyed_count, {keys:,} keys, {records:,} records")
            result = run_pipeline(
                WORKLOAD,
                mode=mode,
                workers=workers,
                spark=spark,
                run_dir=d,
                checkpoint_ms=checkpoint_ms,
                params={"records": str(records), "keys": str(keys), "output": d + "/out"},
                progress=watch,
            )
            s = result.summary
            if s["records_committed"] != records:
                raise AssertionError(f"mode {mode}: {s['records_committed']} of {records} records committed")
            recs = s.get("recoveries") or []
            if not recs:
                raise AssertionError(f"mode {mode}: the run ended before the kill")
            r = recs[0]
            out["modes"][mode] = {
                "recovery_s": r.get("back_to_90_s"),
                "restore_s": r.get("restore_s"),
                "detection_s": r.get("detection_s"),
                "records_reprocessed": r.get("records_reprocessed"),
                "killed_at_read": killed.get("at_read"),
                "checkpoint_restored": r.get("checkpoint"),
                "epoch_restored": r.get("epoch"),
                "batch_s": r.get("batch_s"),
                "records_per_s": s["records_per_s"],
            }
            shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def render(r: dict) -> str:
    fields = ["recovery_s", "restore_s", "detection_s", "records_reprocessed", "killed_at_read", "records_per_s"]
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
