"""`nosync bench sustain`: the highest input rate each mode sustains, and its latency at
fixed shares of mode none's.

keyed_count reads a paced generator (`Generator(rate=R)`, open loop: record j of a partition
is due j / R after the source clock started, keys drawn at random) with no end, and each run is
stopped after `warmup_s + window_s` (`--duration`). A rate is sustained when the backlog (the
records due minus the records read, sampled every 0.25 s) does not grow over the window after
the warm-up: its least-squares slope is under `GROWTH` of the input rate, and it holds less than
one second of input at the window's end (Karimov et al., "Benchmarking distributed stream data
processing systems", ICDE 2018). The highest sustained rate is found by bisection between 0 and
an upper bound (`--max-rate`, else 1.25 times what mode none reads unpaced in a probe run),
`steps` halvings per mode, each a run of its own on one warm embedded Spark session.

Then every mode runs at 50% and at 80% of mode none's sustainable rate, and reports event-time
latency (when a record was due to when its output was committed: the queueing a slower mode
causes counts) over the window only (`latency_from_s`), as p50, p99 and p99.9, with its longest
stall and the share of the workers' time persistence took. All modes get the same interval
(abs's checkpoint interval, nosync's snapshot interval, not stretched by its budget), the same
keys and the same windows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from nosync.errors import NosyncError

GROWTH = 0.02
"""A sustained rate's backlog grows by less than this share of the input over the window."""
SHARES = (0.5, 0.8)
"""The shares of mode none's sustainable rate the latency is measured at."""
MIN_WINDOW_INTERVALS = 30
"""A window holds at least this many intervals (checkpoints or snapshots)."""


def check_window(window_s: float, interval_ms: int) -> None:
    """Refuses a window too short for a steady state: fewer than MIN_WINDOW_INTERVALS intervals."""
    need = MIN_WINDOW_INTERVALS * interval_ms / 1000
    if window_s < need:
        raise NosyncError(
            f"--window-s {window_s:g} holds {window_s * 1000 / interval_ms:.0f} intervals of {interval_ms} ms; "
            f"a steady window needs at least {MIN_WINDOW_INTERVALS}: --window-s {need:g} or more"
        )


def backlog_growth(samples: list[tuple[float, int]], t0: float, rate: float, start: float, end: float) -> dict:
    """The backlog over [start, end] (wall times) of a run whose `rate` records/s in all were
    due from `t0`, from (wall time, records read) samples: its least-squares slope in records/s
    and its value at the end."""
    from experiments.measure import backlog

    pts = [(t, b) for t, b in backlog(samples, t0, rate) if start <= t <= end]
    if len(pts) < 3:
        return {"slope": None, "end": None, "samples": len(pts)}
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mb = sum(b for _, b in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    slope = sum((t - mt) * (b - mb) for t, b in pts) / var if var else 0.0
    return {"slope": slope, "end": pts[-1][1], "samples": n}


def sustained(growth: dict, rate: float) -> bool:
    """Whether a backlog (`backlog_growth`) did not grow: slope under GROWTH of the rate, and
    less than a second of input left at the end."""
    return growth["slope"] is not None and growth["slope"] < GROWTH * rate and growth["end"] < rate


def _paced_run(spark: Any, d: str, mode: str, workers: int, rate: float | None, args: dict) -> dict:
    """One run of keyed_count at `rate` records/s per partition (None: unpaced), stopped after
    its warm-up and window; its summary with the (wall time, records read) samples."""
    from experiments.measure import KEYED_COUNT, _interval_options
    from nosync.driver.runner import run as run_pipeline

    samples: list[tuple[float, int]] = []
    params = {
        "records": "none",
        "keys": args["keys"],
        "draw": "random",
        "value_bytes": args["value_bytes"],
        "output": "none",
    }
    if rate is not None:
        params["rate"] = rate
    result = run_pipeline(
        KEYED_COUNT,
        mode=mode,
        workers=workers,
        spark=spark,
        run_dir=d,
        params=params,
        duration=args["warmup_s"] + args["window_s"],
        latency_from_s=args["warmup_s"],
        progress=lambda p: samples.append((time.time(), p["read"])),
        **_interval_options(mode, args["interval_ms"], "disk"),
    )
    s = dict(result.summary)
    s["samples"] = samples
    return s


def _judge(s: dict, rate: float, workers: int, args: dict) -> dict:
    t0 = s["source_t0"]
    start = t0 + args["warmup_s"]
    g = backlog_growth(s["samples"], t0, rate * workers, start, start + args["window_s"])
    return {
        "rate_per_partition": rate,
        "sustained": sustained(g, rate * workers),
        "backlog_slope": g["slope"],
        "backlog_end": g["end"],
        "records_read": s["records_read"],
    }


def run(
    modes: list[str],
    workers: int = 2,
    keys: int = 1_000_000,
    value_bytes: int = 0,
    interval_ms: int = 1000,
    warmup_s: float = 20.0,
    window_s: float = 60.0,
    steps: int = 5,
    max_rate: float | None = None,
    master: str | None = None,
    progress: Any = lambda m: None,
) -> dict:
    from nosync.spark.session import get_spark

    check_window(window_s, interval_ms)
    args = {
        "keys": keys,
        "value_bytes": value_bytes,
        "interval_ms": interval_ms,
        "warmup_s": warmup_s,
        "window_s": window_s,
    }
    spark = get_spark(master, workers)
    work = tempfile.mkdtemp(prefix="nosync-bench-sustain-")
    out: dict[str, Any] = {
        "workload": "keyed_count, keys drawn at random, paced, stopped after warm-up and window",
        "workers": workers,
        "keys": keys,
        "value_bytes": value_bytes,
        "interval_ms": interval_ms,
        "warmup_s": warmup_s,
        "window_s": window_s,
        "growth_bar": GROWTH,
        "modes": {},
    }
    try:
        n = 0

        def fresh() -> str:
            nonlocal n
            n += 1
            return os.path.join(work, f"run-{n}")

        if max_rate is None:
            progress("probe: mode none unpaced")
            probe = _paced_run(spark, fresh(), "none", workers, None, {**args, "warmup_s": 5.0, "window_s": 10.0})
            max_rate = 1.25 * probe["records_per_s"] / workers
            out["probe_records_per_s"] = probe["records_per_s"]
        out["max_rate_per_partition"] = max_rate
        for mode in modes:
            lo, hi, tried = 0.0, max_rate, []
            for step in range(steps):
                rate = round((lo + hi) / 2)
                progress(f"mode {mode}: step {step + 1}/{steps}, {rate:,} records/s per partition")
                row = _judge(_paced_run(spark, fresh(), mode, workers, rate, args), rate, workers, args)
                tried.append(row)
                lo, hi = (rate, hi) if row["sustained"] else (lo, rate)
            out["modes"][mode] = {"sustainable_per_partition": lo, "sustainable": lo * workers, "tried": tried}
        base = out["modes"].get("none", {}).get("sustainable_per_partition")
        if base:
            for share in SHARES:
                rate = round(base * share)
                for mode in modes:
                    progress(f"mode {mode}: latency at {share:.0%} of none's rate ({rate:,} per partition)")
                    s = _paced_run(spark, fresh(), mode, workers, rate, args)
                    row = _judge(s, rate, workers, args)
                    row.update(
                        {
                            "latency_p50_ms": s.get("latency_p50_ms"),
                            "latency_p99_ms": s.get("latency_p99_ms"),
                            "latency_p999_ms": s.get("latency_p999_ms"),
                            "stall_ms_max": 0.0 if mode == "none" else s.get("stall_ms_max"),
                            "bytes_persisted": s.get("bytes_persisted"),
                            "persist_share": s.get("persist_share"),
                        }
                    )
                    out["modes"][mode][f"at_{int(share * 100)}"] = row
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def render(r: dict) -> str:
    def fmt(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, float):
            return f"{v:,.1f}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    modes = list(r["modes"])
    rows = [("sustainable records/s", lambda m: r["modes"][m]["sustainable"])]
    for share in SHARES:
        key = f"at_{int(share * 100)}"
        for f in ("latency_p50_ms", "latency_p99_ms", "latency_p999_ms", "stall_ms_max", "persist_share", "sustained"):
            rows.append((f"{key} {f}", lambda m, k=key, f=f: (r["modes"][m].get(k) or {}).get(f)))
    w = max(len(name) for name, _ in rows)
    lines = [f"{'':<{w}}  " + "  ".join(f"{m:>12}" for m in modes)]
    for name, get in rows:
        lines.append(f"{name:<{w}}  " + "  ".join(f"{fmt(get(m)):>12}" for m in modes))
    return "\n".join(lines)
