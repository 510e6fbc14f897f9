"""`nosync demo` (`make demo`): the project's story in one command.

keyed_count runs three times on one embedded Spark session: under mode none (no fault
tolerance: the reference), then under abs and under nosync, each with worker 1 killed by
SIGKILL half-way, abs checkpointing and nosync snapshotting every second alike
(`INTERVAL_MS`). The committed output of each killed run is compared with the reference's,
record by record (the judge of `nosync chaos`); a table puts the modes side by side, and a
figure shows throughput over time with the kills.
"""

from __future__ import annotations

import os
from typing import Any

from experiments.chaos import committed_outputs, compare
from experiments.common import MODE_COLORS
from experiments.measure import KEYED_COUNT, recovery, steady

INTERVAL_MS = 1000
"""abs's checkpoint interval and nosync's persistence interval alike."""

ROWS = (
    ("records/s", "records_per_s", "{:,.0f}"),
    ("latency p99 (ms)", "latency_p99_ms", "{:,.0f}"),
    ("longest stall (ms)", "stall_ms_max", "{:,.1f}"),
    ("worker killed at (s)", "killed_at_s", "{:.1f}"),
    ("restore (s)", "restore_s", "{:.2f}"),
    ("recovery to 90% (s)", "recovery_s", "{:.2f}"),
    ("caught up (s)", "caught_up_s", "{:.2f}"),
    ("records read again", "records_reprocessed", "{:,}"),
    ("frames replayed", "frames_replayed", "{:,}"),
    ("output vs reference", "verdict", "{}"),
)


def run(out: str, records: int, keys: int, say: Any = print) -> dict:
    from nosync.spark.session import get_spark

    spark = get_spark(None, 2)
    params = {"records": str(records), "keys": str(keys), "skew": "0.0", "seed": "1"}
    results: dict[str, dict] = {}

    say(f"1/3  mode none: keyed_count, {records:,} records over {keys:,} keys, 2 workers, no failure")
    d = os.path.join(out, "none")
    results["none"] = steady(spark, d, "none", 2, records, keys, keep=True)
    reference = committed_outputs(KEYED_COUNT, {**params, "output": os.path.join(d, "out")})
    results["none"]["verdict"] = "reference"

    for i, mode in enumerate(("abs", "nosync"), start=2):
        say(f"{i}/3  mode {mode}: the same run, an interval of {INTERVAL_MS} ms; worker 1 gets SIGKILL half-way")
        d = os.path.join(out, mode)
        r = recovery(spark, d, mode, 2, keys, records, INTERVAL_MS, keep=True, progress=lambda m: say(f"     {m}"))
        got = committed_outputs(KEYED_COUNT, {**params, "output": os.path.join(d, "out")})
        sinks = compare(reference, got)
        lost = sum(s.get("lost", 0) for s in sinks.values())
        dup = sum(s.get("duplicated", 0) for s in sinks.values())
        r["lost"], r["duplicated"] = lost, dup
        r["verdict"] = "exactly-once" if lost == dup == 0 else f"{lost:,} lost, {dup:,} duplicated"
        say(f"     committed output: {r['verdict']} ({records:,} records compared with mode none's)")
        results[mode] = r
    return results


def table(results: dict) -> str:
    modes = list(results)
    w = max(len(label) for label, _, _ in ROWS)
    lines = [f"{'':<{w}}  " + "  ".join(f"{m:>16}" for m in modes)]
    for label, key, form in ROWS:
        cells = []
        for m in modes:
            v = results[m].get(key)
            cells.append("-" if v is None else form.format(v))
        lines.append(f"{label:<{w}}  " + "  ".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)


def figure(out: str, results: dict, path: str) -> None:
    """Records read over time, per mode, with the kills marked. The count is that of the
    state in use: a worker restored to a checkpoint counts from the checkpoint's position, so a
    rollback shows as a drop."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pyarrow.parquet as pq

    fig, ax = plt.subplots(figsize=(9, 4.5))
    killed = 0
    for mode, r in results.items():
        p = os.path.join(out, mode, "throughput.parquet")
        if not os.path.exists(p):
            continue
        rows = pq.read_table(p, columns=["t", "read"]).to_pylist()
        t0 = next((x["t"] for x in rows if x["read"] > 0), 0.0)
        rows = [x for x in rows if x["t"] >= t0 - 0.5]
        ax.plot([x["t"] - t0 for x in rows], [x["read"] / 1e6 for x in rows], label=mode, color=MODE_COLORS.get(mode))
        if r.get("killed_at_s") is not None:
            kt = r["killed_at_s"] - t0
            ax.axvline(kt, color=MODE_COLORS.get(mode), linestyle="--", alpha=0.8)
            # the modes' kills often fall at the same time: their labels go either side of it
            side = "right" if killed % 2 == 0 else "left"
            killed += 1
            ax.annotate(f"{mode}: worker 1 killed", (kt, 0), rotation=90, va="bottom", ha=side, fontsize=8)
    ax.set_xlabel("time since the first record was read (s)")
    ax.set_ylabel("records read, counted from the state in use (millions)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(
        "keyed_count, 2 workers, one SIGKILL: abs rolls every worker back to its checkpoint;\n"
        "nosync re-executes the lost worker's steps alone (a drop is input to be read again)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
