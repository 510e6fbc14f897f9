"""`nosync bench compare`: the same workload under several modes, measured in one command.

`keyed_count` (generated records over K keys, key_by, a running count per key, committed to
Parquet files) runs under each mode on one embedded Spark session, the modes taken in turn for
`reps` rounds, each mode's best round kept: mode `none` is the limit the others are divided
by, so it gets the same chances (warm Spark, same data, same files) as they do. abs and nosync
run at the same interval (`interval_ms`: abs's checkpoint interval, nosync's persistence
interval, fixed: not stretched by its budget). Per mode: records_per_s (first record read to last
committed), latency p50/p99 (ingest to commit), stall_ms_max (the longest time an operator
could not process available input because of fault tolerance: in abs, alignment; in nosync,
persistence backpressure), checkpoint_ms_p50/p99, bytes_persisted (every byte each mode handed
its stores), and the ratio of records_per_s to mode none's. An entry `mode@level` runs the mode
with its snapshots durable on that level (`nosync@replicated`: one peer's memory), a column
of its own.
`slow_ms` delays worker 0's source after every batch (a straggler): what alignment costs
abs, and what nosync pays instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from experiments.measure import STEADY_FIELDS
from nosync.errors import NosyncError

FIELDS = tuple(f for f in STEADY_FIELDS if f not in ("snapshots", "peak_rss_mb"))
BARS = {"nosync": 0.9, "nosync@replicated": 0.85}
LATENCY_BARS = {"nosync": 1.2}
"""latency_p99_ms at most this many times mode none's."""


def run(
    modes: list[str],
    workers: int,
    records: int,
    keys: int,
    skew: float = 0.0,
    reps: int = 2,
    master: str | None = None,
    interval_ms: int = 1000,
    slow_ms: int = 0,
    progress: Any = lambda m: None,
) -> dict:
    from experiments.measure import steady
    from nosync.spark.session import get_spark

    spark = get_spark(master, workers)
    best: dict[str, dict] = {}
    work = tempfile.mkdtemp(prefix="nosync-bench-compare-")
    try:
        for rep in range(reps):
            for mode in modes:
                progress(f"round {rep + 1}/{reps}: mode {mode}")
                d = os.path.join(work, f"{mode}-{rep}")
                name, _, tier = mode.partition("@")
                row = steady(spark, d, name, workers, records, keys, skew, interval_ms, tier or "disk", slow_ms=slow_ms)
                row = {f: row.get(f) for f in FIELDS}
                _check_long_enough(mode, records, row["records_per_s"], interval_ms)
                if mode not in best or row["records_per_s"] > best[mode]["records_per_s"]:
                    best[mode] = row
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out: dict[str, Any] = {
        "workload": "keyed_count",
        "workers": workers,
        "records": records,
        "keys": keys,
        "skew": skew,
        "reps": reps,
        "interval_ms": interval_ms,
        "slow_worker_ms": slow_ms,
        "modes": best,
    }
    base = best.get("none", {}).get("records_per_s")
    if base:
        for mode, row in best.items():
            row["ratio_to_none"] = row["records_per_s"] / base
            if mode in BARS:
                row["bar"] = f">= {BARS[mode]}"
                row["bar_ok"] = row["ratio_to_none"] >= BARS[mode]
            base_lat = best["none"].get("latency_p99_ms")
            if mode in LATENCY_BARS and base_lat and row.get("latency_p99_ms") is not None:
                row["latency_p99_to_none"] = row["latency_p99_ms"] / base_lat
                row["latency_bar_ok"] = row["latency_p99_to_none"] <= LATENCY_BARS[mode]
    return out


def _check_long_enough(mode: str, records: int, per_s: float, interval_ms: int) -> None:
    """Refuses a comparison whose runs are shorter than MIN_WINDOW_INTERVALS intervals: a run of
    one or two checkpoints is no steady state (`bench sustain` measures one at a fixed rate)."""
    from experiments.bench.sustain import MIN_WINDOW_INTERVALS

    seconds = records / per_s
    if seconds * 1000 < MIN_WINDOW_INTERVALS * interval_ms:
        need = int(records * MIN_WINDOW_INTERVALS * interval_ms / 1000 / seconds) + 1
        raise NosyncError(
            f"mode {mode} read --records {records:,} in {seconds:.1f} s, {seconds * 1000 / interval_ms:.0f} intervals "
            f"of {interval_ms} ms; a comparison needs runs of at least {MIN_WINDOW_INTERVALS}: --records {need:,} "
            f"or more (or a shorter --interval-ms)"
        )


def render(r: dict) -> str:
    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    modes = list(r["modes"])
    fields = ["records_per_s", "ratio_to_none", "latency_p99_to_none", *[f for f in FIELDS if f != "records_per_s"]]
    w = max(len(f) for f in fields)
    lines = [f"{'':<{w}}  " + "  ".join(f"{m:>14}" for m in modes)]
    for f in fields:
        lines.append(f"{f:<{w}}  " + "  ".join(f"{fmt(r['modes'][m].get(f)):>14}" for m in modes))
    return "\n".join(lines)
