"""Experiment `stall-vs-state`: the longest operator stall and latency p99 of abs and nosync as
keyed state grows, with uniform or skewed keys and with or without a slow worker."""

from __future__ import annotations

import os
from typing import Any

from experiments.common import FT, agg, draw_lines, fmt, mean_sd, pyplot, save, with_variant, worker_slots
from experiments.harness import Experiment
from experiments.measure import steady


def points(quick: bool) -> list[dict]:
    sizes = (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000, 10_000_000)
    pts = []
    for keys in sizes:
        records = (300_000 if quick else 2_000_000) if keys <= 100_000 else 2 * keys
        for skew in (0.0, 1.2):
            for slow in (0, 2):
                pts += [
                    {"mode": m, "workers": 2, "records": records, "keys": keys, "skew": skew, "slow_ms": slow}
                    for m in FT
                ]
    return pts


def measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    return steady(
        spark,
        os.path.join(d, "run"),
        p["mode"],
        p["workers"],
        p["records"],
        p["keys"],
        p["skew"],
        None,
        slow_ms=p["slow_ms"],
        seed=seed,
    )


def _condition(r: dict) -> str:
    keys = "uniform keys" if not r["skew"] else f"Zipf {r['skew']} keys"
    return keys + (f", worker 0 slowed {r['slow_ms']} ms/batch" if r["slow_ms"] else "")


def figure(rows: list[dict], path: str) -> None:
    plt = pyplot()
    rows = with_variant(rows)
    conds = sorted({(r["skew"], r["slow_ms"]) for r in rows})
    fig, axes = plt.subplots(2, len(conds), figsize=(4.2 * len(conds), 7.5), squeeze=False)
    for j, c in enumerate(conds):
        sel = [r for r in rows if (r["skew"], r["slow_ms"]) == c]
        for i, (y, label) in enumerate(
            (("stall_ms_max", "longest operator stall (ms)"), ("latency_p99_ms", "latency p99 (ms)"))
        ):
            ax = axes[i][j]
            draw_lines(ax, sel, "keys", y)
            ax.set_xscale("log")
            ax.set_xlabel("keys in state")
            ax.set_ylabel(label)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            if i == 0:
                ax.set_title(_condition(sel[0]), fontsize=10)
    axes[0][0].legend()
    fig.suptitle("Stall and latency as keyed state grows: keyed_count, W = 2 (abs: alignment; nosync: backpressure)")
    save(fig, path)


def reading(rows: list[dict]) -> list[str]:
    st = agg(rows, ("mode", "keys", "skew", "slow_ms"), "stall_ms_max")
    p99 = agg(rows, ("mode", "keys", "skew", "slow_ms"), "latency_p99_ms")
    out = []
    for cond in sorted({k[1:] for k in st}):
        a, n = st.get(("abs", *cond)), st.get(("nosync", *cond))
        if not a or not n:
            continue
        keys, skew, slow = cond
        label = _condition({"skew": skew, "slow_ms": slow})
        pa_, pn = p99.get(("abs", *cond)), p99.get(("nosync", *cond))
        lat = ""
        if pa_ and pn:
            lat = f"; p99 {fmt(pa_[0])} ms against {fmt(pn[0])} ms"
        out.append(f"{keys:,} keys, {label}: longest stall abs {fmt(a[0])} ms, nosync {fmt(n[0])} ms{lat}.")
    skewed = [k for k in st if k[0] == "abs" and k[2] and ("nosync", *k[1:]) in p99 and k in p99]
    if skewed:
        ahead = sum(1 for k in skewed if p99[("nosync", *k[1:])][0] < p99[k][0])
        out.append(
            f"Under Zipf skew, nosync's p99 was below abs's at {ahead} of {len(skewed)} points "
            "(CheckMate's finding that uncoordinated checkpointing leads under skew "
            + ("holds here)." if ahead * 2 > len(skewed) else "does not hold here).")
        )
    return out


def table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    keys = sorted({(r["keys"], r["skew"], r["slow_ms"], r["mode"]) for r in rows})
    body = []
    for k in keys:
        sel = [r for r in rows if (r["keys"], r["skew"], r["slow_ms"], r["mode"]) == k]
        body.append(
            [f"{k[0]:,}", str(k[1]), str(k[2]), k[3]]
            + [
                mean_sd(agg(sel, ("mode",), f).get((k[3],)))
                for f in ("stall_ms_max", "latency_p99_ms", "records_per_s")
            ]
        )
    return ["keys", "skew", "slow (ms/batch)", "mode", "stall max (ms)", "p99 (ms)", "records/s"], body


EXPERIMENT = Experiment(
    "stall-vs-state",
    "Operator stall and latency as keyed state grows",
    "keyed_count without failures as the number of keys grows, with uniform and Zipf-skewed "
    "keys, with and without a slow worker 0 (its source sleeps after every batch). A stall is "
    "time an operator could not process available input because of fault tolerance: abs's "
    "barrier alignment, nosync's persistence backpressure.",
    points,
    (2, 2),
    measure,
    worker_slots,
    figure,
    reading,
    table,
)
