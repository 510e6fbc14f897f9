"""`nosync bench rewind`: rewinding keyed_count by the last 10% of its epochs.

One run of keyed_count (K keys, 4 x K records, at least 2M; W workers; mode abs, a checkpoint
every second, or mode nosync, each worker snapshotting every 200 ms), then `nosync rewind` of
its aggregate to the epoch where the last 10% of its epochs begin, with the same pipeline, in
the same Spark session, in two ways: from the run's own state (abs: its latest checkpoint at
or before that epoch; nosync: the newest consistent cut of its workers' snapshots there; the
default), and recomputing the state from the sources (`restore_from="sources"`). Each way
runs twice, the two ways alternating, and its best time counts: a way's first rewind in a
session took up to 2.2 s longer than its second (measured on this kind of machine; most
often the rewind from the run's state, which ran first), so one run of each measures
first-use costs as much as the rewind. Both times are printed. Reported: each way's best
time, from the call to its return, against the time the run itself took for those last
epochs (from its progress samples, taken every 0.5 s: from the moment its sources had read
every record of the epochs before the rewind's, interpolated, to the first sample with every
record committed, so up to 0.5 s too long). Each rewound output is compared with the run's as
a whole.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(os.path.dirname(HERE), "workloads", "keyed_count.py")


def run(
    workers: int,
    keys: int,
    records: int | None = None,
    master: str | None = None,
    progress: Any = print,
    mode: str = "abs",
) -> dict:
    import pyarrow.parquet as pq

    from nosync.driver.runner import run as run_pipeline
    from nosync.spark.batch import warm_up
    from nosync.spark.session import get_spark
    from nosync.tools.rewind import rewind

    records = records or max(2_000_000, 4 * keys)
    per_epoch = 10_000
    spark = get_spark(master, workers)
    work = tempfile.mkdtemp(prefix="nosync-bench-rewind-")
    try:
        run_dir, out = os.path.join(work, "run"), os.path.join(work, "out")
        progress(f"run: keyed_count, {keys:,} keys, {records:,} records, mode {mode}")
        r = run_pipeline(
            WORKLOAD,
            mode=mode,
            workers=workers,
            spark=spark,
            run_dir=run_dir,
            epoch_records=per_epoch,
            params={"records": str(records), "keys": str(keys), "output": out},
        )
        s = r.summary
        epochs = -(-records // workers // per_epoch)
        at = epochs - max(1, epochs // 10)
        samples = pq.read_table(os.path.join(run_dir, "throughput.parquet")).to_pylist()
        # progress samples, every 0.5 s: from the moment the sources had read the records of
        # the epochs before `at` (interpolated) to the first sample with every record committed
        share = at * per_epoch * workers
        started = None
        for a, b in zip(samples, samples[1:], strict=False):
            if a["read"] < share <= b["read"]:
                started = a["t"] + (b["t"] - a["t"]) * (share - a["read"]) / (b["read"] - a["read"])
                break
        ended = min((x["t"] for x in samples if x["committed"] >= records), default=None)
        total = s["wall_s"] - s["startup_s"]
        tail_s = None if started is None or ended is None else ended - started
        out_r: dict = {
            "workload": "keyed_count",
            "mode": mode,
            "workers": workers,
            "keys": keys,
            "records": records,
            "epochs": epochs,
            "rewind_to_epoch": at,
            "original_run_s": total,
            "original_tail_s": tail_s,
        }
        # Spark's first-use costs of a job; the first rewind still pays its own, so each way
        # runs twice and its best time counts
        warm_up(spark, workers)
        for how in ("checkpoint", "sources", "checkpoint", "sources"):
            source = "the sources" if how == "sources" else "the run's state"
            progress(f"rewind: aggregate_1 to epoch {at} of {epochs}, from {source}")
            again = os.path.join(work, f"again-{how}")
            t = time.perf_counter()
            rw = rewind(run_dir, "aggregate_1", at, output=again, spark=spark, restore_from=how)
            took = time.perf_counter() - t
            out_r.setdefault(f"{how}_rewind_runs_s", []).append(took)
            took = min(out_r[f"{how}_rewind_runs_s"])
            out_r[f"{how}_rewind_s"] = took
            out_r[f"{how}_records_read"] = rw["records_read"]
            out_r[f"{how}_over_tail"] = None if not tail_s else took / tail_s
            same = _records(out) == _records(again)
            out_r[f"{how}_same_records"] = out_r.get(f"{how}_same_records", True) and same
            if how == "checkpoint":
                out_r["checkpoint_start"] = rw["start"]
                out_r["checkpoint"] = rw["checkpoint"]
                out_r["snapshots"] = rw["snapshots"]
                out_r["checkpoint_records_carried"] = rw["records_carried"]
            shutil.rmtree(again, ignore_errors=True)
        return out_r
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _records(directory: str) -> collections.Counter:
    from experiments.chaos import canonical
    from nosync.api import sinks

    return collections.Counter(canonical(r) for r in sinks.Files(directory).read_committed())


def render(r: dict) -> str:
    tail = r["original_tail_s"]

    def vs(how: str) -> str:
        x = r[f"{how}_over_tail"]
        return "" if x is None else f", {x:.1f}x the run's last 10%"

    def runs(how: str) -> str:
        times = r.get(f"{how}_rewind_runs_s") or []
        return f" (best of {' and '.join(f'{t:.1f}' for t in times)})" if len(times) > 1 else ""

    mode = r.get("mode", "abs")
    if r.get("checkpoint_start") == "snapshots":
        own, start = "from its snapshots", "snapshots at steps " + ", ".join(str(v) for v in r["snapshots"].values())
    elif r.get("checkpoint_start") == "sources":
        own, start = "from its state", "none usable, recomputed from the sources"
    else:
        own, start = "from checkpoint", f"checkpoint {r['checkpoint']}"
    rows = [
        ("rewound", f"aggregate_1 to epoch {r['rewind_to_epoch']} of {r['epochs']} (the last 10%)"),
        (
            own,
            f"{r['checkpoint_rewind_s']:.1f} s{vs('checkpoint')}{runs('checkpoint')}: {start}, "
            f"{r['checkpoint_records_read']:,} records read, {r['checkpoint_records_carried']:,} carried",
        ),
        (
            "from the sources",
            f"{r['sources_rewind_s']:.1f} s{vs('sources')}{runs('sources')}: "
            f"{r['sources_records_read']:,} records read",
        ),
        ("the run's last 10% of epochs", "n/a" if tail is None else f"{tail:.1f} s (0.5 s samples)"),
        (f"the whole run (mode {mode})", f"{r['original_run_s']:.1f} s"),
        (
            "outputs hold the run's records",
            f"{own} {r['checkpoint_same_records']}, from the sources {r['sources_same_records']}",
        ),
    ]
    w = max(len(a) for a, _ in rows)
    return "\n".join(f"{a:<{w}}  {b}" for a, b in rows)
