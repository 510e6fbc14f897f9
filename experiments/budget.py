"""Experiment `budget`: persistence as resources permit. nosync's overhead, snapshot interval
and recovery span against its `--persist-budget`, with mode none as the reference."""

from __future__ import annotations

import os
from typing import Any

from experiments.common import agg, draw_lines, fmt, mean_sd, pyplot, save, with_variant, worker_slots
from experiments.harness import Experiment
from experiments.measure import steady
from nosync.options import MAX_PERSIST_MS

BUDGETS = (0.01, 0.02, 0.05, 0.1, 0.2, 1.0)


def points(quick: bool) -> list[dict]:
    records, keys = (600_000, 100_000) if quick else (3_000_000, 1_000_000)
    base = {"workers": 2, "records": records, "keys": keys, "interval_ms": 200}
    pts = [{"mode": "none", "budget": 0.0, **base}]
    pts += [{"mode": "nosync", "budget": b, **base} for b in ((0.01, 0.05, 1.0) if quick else BUDGETS)]
    return pts


def measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    # the interval stretched by the budget, up to the run's default bound
    options = {"persist_budget": p["budget"], "max_persist_ms": MAX_PERSIST_MS} if p["mode"] == "nosync" else {}
    iv = p["interval_ms"] if p["mode"] == "nosync" else None
    run = os.path.join(d, "run")
    return steady(spark, run, p["mode"], p["workers"], p["records"], p["keys"], 0.0, iv, seed=seed, options=options)


def _with_overhead(rows: list[dict]) -> list[dict]:
    """The nosync rows with their throughput as a fraction of mode none's (mean of none's rows)."""
    base = agg([r for r in rows if r["mode"] == "none"], ("mode",), "records_per_s").get(("none",))
    if not base:
        return []
    return [{**r, "overhead": 1 - r["records_per_s"] / base[0]} for r in rows if r["mode"] == "nosync"]


def figure(rows: list[dict], path: str) -> None:
    plt = pyplot()
    ns_rows = with_variant(_with_overhead(rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, y, label, scale in (
        (axes[0], "overhead", "throughput lost to fault tolerance (share of none's)", 1.0),
        (axes[1], "interval_ms_mean", "snapshot interval, mean (ms)", 1.0),
        (axes[2], "recovery_span_ms_max", "longest span a recovery would re-execute (ms)", 1.0),
    ):
        draw_lines(ax, ns_rows, "budget", y, scale=scale)
        ax.set_xscale("log")
        ax.set_xlabel("--persist-budget (share of a worker's time)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Persistence as resources permit: keyed_count, W = 2, --persist-ms 200")
    save(fig, path)


def reading(rows: list[dict]) -> list[str]:
    ns_rows = _with_overhead(rows)
    if not ns_rows:
        return ["Mode none was not measured: no overhead can be given."]
    ov = agg(ns_rows, ("budget",), "overhead")
    iv = agg(ns_rows, ("budget",), "interval_ms_mean")
    span = agg(ns_rows, ("budget",), "recovery_span_ms_max")
    share = agg(ns_rows, ("budget",), "persist_share")
    out = []
    for (b,) in sorted(ov):
        sh, i, sp = share.get((b,)), iv.get((b,)), span.get((b,))
        out.append(
            f"Budget {b:g}: {ov[(b,)][0]:.1%} of none's throughput lost, persistence took "
            f"{f'{sh[0]:.1%}' if sh else '-'} of the workers' time, snapshots every "
            f"{fmt(i[0]) if i else '-'} ms on average, a recovery would re-execute at most "
            f"{fmt(sp[0]) if sp else '-'} ms."
        )
    return out


def table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    ns_rows = _with_overhead(rows)
    body = []
    for b in sorted({r["budget"] for r in ns_rows}):
        sel = [r for r in ns_rows if r["budget"] == b]
        body.append(
            [f"{b:g}"]
            + [
                mean_sd(agg(sel, ("mode",), f).get(("nosync",)))
                for f in (
                    "records_per_s",
                    "overhead",
                    "persist_share",
                    "interval_ms_mean",
                    "recovery_span_ms_max",
                    "recovery_span_records_max",
                )
            ]
        )
    head = ["budget", "records/s", "overhead", "persistence share", "interval (ms)", "span (ms)", "span (records)"]
    return head, body


EXPERIMENT = Experiment(
    "budget",
    "Persistence as resources permit: overhead and recovery span against the budget",
    "keyed_count without failures, 1M keys; nosync with --persist-ms 200 and each --persist-budget: "
    "after each snapshot the next interval is what it cost divided by the budget. Overhead is the "
    "throughput lost against mode none; the span is the longest time from a snapshot to the next "
    "one being durable (what a recovery would re-execute at worst).",
    points,
    (2, 2),
    measure,
    worker_slots,
    figure,
    reading,
    table,
)
