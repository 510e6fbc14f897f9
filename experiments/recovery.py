"""Experiments `recovery-vs-state` and `recovery-vs-failure-point`: restore and recovery time,
and records read again, after one SIGKILL, as keyed state grows and against where in the
interval the kill falls. Both share the measurement, the figure, the reading and the table."""

from __future__ import annotations

import collections
import os
from typing import Any

from experiments.common import FT, agg, draw_lines, fmt, mean_sd, pyplot, save, with_variant
from experiments.harness import Experiment
from experiments.measure import recovery

VARIANTS = (("abs", "disk"), ("nosync", "disk"), ("nosync", "remote"), ("replay", "disk"))


def state_points(quick: bool) -> list[dict]:
    sizes = (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000)
    pts = []
    for keys in sizes:
        # long enough that the kill, at half the records, comes after abs's first checkpoint,
        # and (the full grid, as `bench recovery`) that the input outlasts the recovery
        records = max(1_000_000, 4 * keys) if quick else max(8_000_000, 8 * keys)
        pts += [
            {"mode": m, "tier": t, "workers": 2, "records": records, "keys": keys, "interval_ms": 1000}
            for m, t in VARIANTS
        ]
    return pts


def failure_points(quick: bool) -> list[dict]:
    phases = (0.2, 0.8) if quick else (0.05, 0.25, 0.5, 0.75, 0.95)
    records, keys = (3_000_000, 20_000) if quick else (4_000_000, 100_000)
    return [
        {"mode": m, "workers": 2, "records": records, "keys": keys, "interval_ms": 1000, "phase": ph}
        for ph in phases
        for m in FT
    ]


def measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    # abs's checkpoint interval and nosync's persistence interval alike, as in `bench recovery`
    iv = p["interval_ms"]
    return recovery(
        spark,
        os.path.join(d, "run"),
        p["mode"],
        p["workers"],
        p["keys"],
        p["records"],
        iv,
        tier=p.get("tier", "disk"),
        phase=p.get("phase"),
        seed=seed,
        # a kill at a chosen phase waits for the next interval: it starts earlier in the run
        kill_after=0.2 if "phase" in p else 0.5,
        missed_ok=True,
    )


def slots(p: dict) -> int:
    return 2 * p["workers"]  # replay's batch jobs beside the streaming tasks


def figure(rows: list[dict], path: str, x: str, xlabel: str, title: str, logx: bool) -> None:
    plt = pyplot()
    rows = with_variant(rows)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, y, label in (
        (axes[0], "recovery_s", "recovery: kill to 90% throughput (s)"),
        (axes[1], "restore_s", "restore: kill to all workers running (s)"),
        (axes[2], "records_reprocessed", "records read again"),
    ):
        draw_lines(ax, rows, x, y)
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    save(fig, path)


def reading(rows: list[dict], x: str, unit: str) -> list[str]:
    rows = with_variant(rows)
    out = []
    for y, what in (("restore_s", "restore (kill to all workers running)"), ("recovery_s", "recovery (to 90%)")):
        st = agg(rows, ("variant", x), y)
        for v in sorted({r["variant"] for r in rows}):
            xs = sorted(k[1] for k in st if k[0] == v)
            if xs:
                parts = [f"{fmt(st[(v, xv)][0])} s at {fmt(xv)}{unit}" for xv in xs]
                out.append(f"{v}, {what}: " + ", ".join(parts) + ".")
        for xv in sorted({k[1] for k in st}):
            here = {k[0]: m[0] for k, m in st.items() if k[1] == xv}
            if len(here) > 1:
                best = min(here, key=here.get)
                out.append(f"At {fmt(xv)}{unit}, {best} had the shortest {y.split('_')[0]} ({fmt(here[best])} s).")
    for v, n in sorted(collections.Counter(r["variant"] for r in rows if r.get("kill_missed")).items()):
        total = sum(1 for r in rows if r["variant"] == v)
        out.append(
            f"{v}: in {n} of {total} runs the input ended before the kill could come (no completed "
            "checkpoint or safe point until then): those runs have no recovery figures."
        )
    missing = collections.Counter(
        r["variant"] for r in rows if r.get("recovery_s") is None and not r.get("kill_missed")
    )
    for v, n in sorted(missing.items()):
        total = sum(1 for r in rows if r["variant"] == v)
        out.append(
            f"{v}: in {n} of {total} runs throughput had not got back to 90% of its level before the kill "
            "when the input ended (no recovery time; the restore time is shown)."
        )
    rep = agg(rows, ("variant",), "records_reprocessed")
    out.append(
        "Records read again, mean over the grid: "
        + ", ".join(f"{v} {fmt(m[0])}" for (v,), m in sorted(rep.items()))
        + "."
    )
    return out


def table(rows: list[dict], x: str, xname: str) -> tuple[list[str], list[list[str]]]:
    rows = with_variant(rows)
    keys = sorted({(r[x], r["variant"]) for r in rows})
    body = []
    for k in keys:
        sel = [r for r in rows if (r[x], r["variant"]) == k]
        body.append(
            [fmt(k[0]), k[1]]
            + [
                mean_sd(agg(sel, ("variant",), f).get((k[1],)))
                for f in ("recovery_s", "restore_s", "records_reprocessed", "records_per_s")
            ]
        )
    return [xname, "mode", "recovery (s)", "restore (s)", "records read again", "records/s"], body


VS_STATE = Experiment(
    "recovery-vs-state",
    "Recovery time as keyed state grows",
    "keyed_count; worker W-1 gets SIGKILL once half the records are read and the mode has "
    "something to recover from. abs checkpoints and nosync persists every second (to the local "
    "disk, or to the remote tier only); replay recomputes with batch jobs.",
    state_points,
    (2, 2),
    measure,
    slots,
    lambda rows, path: figure(
        rows, path, "keys", "keys in state", "Recovery as state grows: keyed_count, W = 2, one kill", True
    ),
    lambda rows: reading(rows, "keys", " keys"),
    lambda rows: table(rows, "keys", "keys"),
)

VS_FAILURE_POINT = Experiment(
    "recovery-vs-failure-point",
    "Recovery time against where in the interval the failure falls",
    "keyed_count; abs checkpoints and nosync persists every 1000 ms; the kill comes a chosen "
    "fraction of that interval after a completed checkpoint (abs) or safe point (nosync).",
    failure_points,
    (3, 2),
    measure,
    slots,
    lambda rows, path: figure(
        rows,
        path,
        "phase",
        "kill point, as a fraction of the 1000 ms interval",
        "Recovery against the failure point: keyed_count, W = 2, one kill",
        False,
    ),
    lambda rows: reading(rows, "phase", " of the interval"),
    lambda rows: table(rows, "phase", "kill point"),
)
