"""`nosync bench batch`: a backfill of keyed_count as Spark batch jobs against the streaming run.

Both run in the same Spark session (started once, before either is timed), over the same
generated input, into Parquet files, alternating, best of `reps` each: the streaming run in
mode none (the fastest streaming mode: nothing persisted) from the call to its return, and
`nosync batch` from the call to its return. Both commit the same records; the command checks
the committed counts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(os.path.dirname(HERE), "workloads", "keyed_count.py")


def run(
    workers: int, records: int, keys: int, reps: int = 2, master: str | None = None, progress=lambda m: None
) -> dict:
    from nosync.driver.runner import run as run_pipeline
    from nosync.spark.batch import run_batch
    from nosync.spark.session import get_spark

    spark = get_spark(master, workers)
    work = tempfile.mkdtemp(prefix="nosync-bench-batch-")
    best = {"streaming": float("inf"), "batch": float("inf")}
    stage_s: list = []
    try:
        for rep in range(reps):
            for kind in ("streaming", "batch"):
                out = os.path.join(work, f"{kind}-{rep}")
                params = {"records": str(records), "keys": str(keys), "output": out}
                progress(f"{kind}, round {rep + 1} of {reps}")
                t = time.perf_counter()
                if kind == "streaming":
                    r = run_pipeline(
                        WORKLOAD, workers=workers, spark=spark, run_dir=os.path.join(work, f"run-{rep}"), params=params
                    )
                    committed = r.summary["records_committed"]
                else:
                    r = run_batch(WORKLOAD, params, workers=workers, spark=spark, run_dir=os.path.join(work, "b"))
                    committed = r["committed"]
                dt = time.perf_counter() - t
                if kind == "batch" and dt < best["batch"]:
                    stage_s = r["stage_s"]
                if committed != records:
                    raise AssertionError(f"{kind}: {committed} of {records} records committed")
                best[kind] = min(best[kind], dt)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {
        "workload": "keyed_count",
        "workers": workers,
        "records": records,
        "keys": keys,
        "reps": reps,
        "streaming_s": best["streaming"],
        "streaming_records_per_s": records / best["streaming"],
        "batch_s": best["batch"],
        "batch_records_per_s": records / best["batch"],
        "batch_stage_s": stage_s,
        "batch_speedup": best["streaming"] / best["batch"],
    }


def render(r: dict) -> str:
    rows = [
        (
            f"streaming (mode none), {r['workers']} workers",
            f"{r['streaming_s']:.1f} s ({r['streaming_records_per_s']:,.0f}/s)",
        ),
        (f"batch jobs, {r['workers']} tasks per stage", f"{r['batch_s']:.1f} s ({r['batch_records_per_s']:,.0f}/s)"),
        ("batch speed-up", f"{r['batch_speedup']:.2f}x"),
    ]
    w = max(len(a) for a, _ in rows)
    return "\n".join(f"{a:<{w}}  {b}" for a, b in rows)
