"""Experiment `cycles`: abs and nosync on a loop whose body crosses workers.

The workload is `reachability` (experiments/workloads): a power-law graph's edges stream into
a loop keyed by vertex, and every vertex newly reached sends reaches round to its neighbours,
through the workers that own them. Without failures: throughput, latency p99, the longest
stall, and what each mode keeps of the records in flight round the loop. abs logs what comes
back on a loop head's back edges between its snapshot and the barrier's return, and persists
that log with the checkpoint (`backedge_log_bytes`); nosync keeps every frame it sent, the
back edge's included, in its output log in memory until the receiver's snapshot covers it, and
writes only the residue at a snapshot (`output_log_peak_bytes`, `residue_bytes`). With one
SIGKILL of the last worker once half the input is read: how long until every worker runs
again, how much longer the run took than without the kill (the loop lags its input, so
throughput after the kill says little), and how much it reads again. abs's checkpoint
interval and nosync's persistence interval are the same (1 s).
"""

from __future__ import annotations

import os
from typing import Any

from experiments.common import MODE_COLORS, agg, fmt, mean_sd, pyplot, save
from experiments.harness import Experiment
from experiments.measure import recovery, steady
from experiments.workloads import reachability

HERE = os.path.dirname(os.path.abspath(__file__))
REACHABILITY = os.path.join(HERE, "workloads", "reachability.py")
MODES = ("none", "abs", "nosync")
INTERVAL_MS = 1000


def points(quick: bool) -> list[dict]:
    sizes = (50_000,) if quick else (100_000, 300_000)
    return [{"mode": m, "workers": 2, "vertices": v, "interval_ms": INTERVAL_MS} for v in sizes for m in MODES]


def _workload(p: dict, seed: int) -> tuple[str, dict, int, int]:
    params = {"vertices": str(p["vertices"]), "seed": str(seed)}
    g = reachability.graph(params)
    reached = len(reachability.reference(params, g))
    return REACHABILITY, params, reached, len(g.roots) + len(g.src)


def measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    path, params, reached, records = _workload(p, seed)
    iv = None if p["mode"] == "none" else p["interval_ms"]
    row = steady(
        spark,
        os.path.join(d, "steady"),
        p["mode"],
        p["workers"],
        records,
        0,
        interval_ms=iv,
        seed=seed,
        workload=(path, params, reached),
    )
    row.update(records=records, reached=reached)
    if p["mode"] == "none":
        return row
    r = recovery(
        spark,
        os.path.join(d, "recovery"),
        p["mode"],
        p["workers"],
        0,
        records,
        iv,
        seed=seed,
        missed_ok=True,
        workload=(path, params, reached),
    )
    row.update({f"recovery_{k}": r.get(k) for k in ("restore_s", "records_reprocessed", "kill_missed")})
    if r.get("processing_s") is not None and row.get("processing_s") is not None:
        # the loop lags its input, so throughput after the kill says little: the run's time
        # with the kill against the same run's without
        row["recovery_added_s"] = r["processing_s"] - row["processing_s"]
    return row


def slots(p: dict) -> int:
    return p["workers"]


METRICS = (
    ("records_per_s", "records read per second", 1.0),
    ("latency_p99_ms", "latency p99 (ms)", 1.0),
    ("logged_mb", "records in flight kept (MB)", 1.0),
    ("recovery_restore_s", "restore: kill to every worker running (s)", 1.0),
    ("recovery_added_s", "run time added by the kill (s)", 1.0),
)


def _with_logged(rows: list[dict]) -> list[dict]:
    """What each mode kept of the loop's records in flight: abs's back-edge logs (persisted
    with its checkpoints), nosync's output log at its largest (in memory)."""
    out = []
    for r in rows:
        logged = r.get("backedge_log_bytes") if r["mode"] == "abs" else r.get("output_log_peak_bytes")
        out.append({**r, "logged_mb": (logged or 0) / 1e6 if r["mode"] != "none" else None})
    return out


def figure(rows: list[dict], path: str) -> None:
    plt = pyplot()
    rows = _with_logged(rows)
    sizes = sorted({r["vertices"] for r in rows})
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4.2 * len(METRICS), 4.2))
    width = 0.8 / len(MODES)
    for ax, (metric, label, _) in zip(axes, METRICS, strict=True):
        for i, mode in enumerate(MODES):
            got = agg([r for r in rows if r.get(metric) is not None], ("mode", "vertices"), metric)
            xs = [j + (i - (len(MODES) - 1) / 2) * width for j in range(len(sizes))]
            ys = [got.get((mode, v), (0.0, 0.0, 0))[0] for v in sizes]
            err = [got.get((mode, v), (0.0, 0.0, 0))[1] for v in sizes]
            if any(got.get((mode, v)) for v in sizes):
                ax.bar(xs, ys, width, yerr=err, label=mode, color=MODE_COLORS.get(mode))
        ax.set_xticks(range(len(sizes)), [f"{v:,} vertices" for v in sizes])
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend()
    fig.suptitle(
        f"A loop across workers: reachability, W = 2, abs checkpoints and nosync snapshots every {INTERVAL_MS} ms"
    )
    save(fig, path)


def reading(rows: list[dict]) -> list[str]:
    rows = _with_logged(rows)
    out = []
    for v in sorted({r["vertices"] for r in rows}):
        sel = [r for r in rows if r["vertices"] == v]
        tp = agg(sel, ("mode",), "records_per_s")
        p99 = agg(sel, ("mode",), "latency_p99_ms")
        logged = agg([r for r in sel if r["logged_mb"] is not None], ("mode",), "logged_mb")
        rec = agg([r for r in sel if r.get("recovery_restore_s") is not None], ("mode",), "recovery_restore_s")
        added = agg([r for r in sel if r.get("recovery_added_s") is not None], ("mode",), "recovery_added_s")
        none = tp.get(("none",))
        parts = []
        for m in ("abs", "nosync"):
            t = tp.get((m,))
            if t and none:
                parts.append(f"{m} {t[0] / none[0]:.2f}x none's throughput, p99 {fmt(p99.get((m,), (None,))[0])} ms")
        if parts:
            out.append(f"{v:,} vertices: " + "; ".join(parts) + ".")
        a, n = logged.get(("abs",)), logged.get(("nosync",))
        if a and n:
            out.append(
                f"{v:,} vertices: abs persisted {a[0] * 1000:,.1f} KB of back-edge log in all with its checkpoints "
                f"(the records that came back round to a head between its snapshot and the barrier's return; "
                f"what was in flight inside the body is covered by alignment, not logged); nosync held at most "
                f"{n[0] * 1000:,.1f} KB of output log in memory (every frame it sent, the back edge's among them, "
                "until the receiver's snapshot covered it; only the residue is written, with a snapshot)."
            )
        ra, rn = rec.get(("abs",)), rec.get(("nosync",))
        if ra and rn:
            text = (
                f"{v:,} vertices: after a kill, every worker was running again in {ra[0]:.2f} s in abs, "
                f"{rn[0]:.2f} s in nosync"
            )
            da, dn = added.get(("abs",)), added.get(("nosync",))
            if da and dn:
                text += (
                    f"; the run with the kill took {da[0]:+.2f} s longer than the run without in abs, "
                    f"{dn[0]:+.2f} s in nosync (a difference within the spread of failure-free runs is noise)"
                )
            out.append(text + ".")
    return out


def table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    rows = _with_logged(rows)
    body = []
    for v, m in sorted({(r["vertices"], r["mode"]) for r in rows}, key=lambda k: (k[0], MODES.index(k[1]))):
        sel = [r for r in rows if (r["vertices"], r["mode"]) == (v, m)]
        cells = [f"{v:,}", m]
        for f in (
            "records_per_s",
            "latency_p99_ms",
            "stall_ms_max",
            "backedge_log_bytes",
            "output_log_peak_bytes",
            "residue_bytes",
            "recovery_restore_s",
            "recovery_added_s",
            "recovery_records_reprocessed",
        ):
            got = agg([r for r in sel if r.get(f) is not None], ("mode",), f).get((m,))
            cells.append(mean_sd(got) if got else "-")
        body.append(cells)
    header = [
        "vertices",
        "mode",
        "records/s",
        "p99 (ms)",
        "stall max (ms)",
        "back-edge log (B)",
        "output log peak (B)",
        "residue (B)",
        "restore (s)",
        "run time added by a kill (s)",
        "read again after a kill",
    ]
    return header, body


EXPERIMENT = Experiment(
    "cycles",
    "A loop across workers: back-edge logging against upstream backup",
    __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(),
    points,
    (3, 1),
    measure,
    slots,
    figure,
    reading,
    table,
)
