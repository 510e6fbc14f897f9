"""Experiment `overhead-vs-interval`: throughput and latency of abs and nosync against the
checkpoint or persistence interval, with mode none as the reference."""

from __future__ import annotations

import os
from typing import Any

from experiments.common import FT, MODE_COLORS, agg, draw_lines, mean_sd, pyplot, save, with_variant, worker_slots
from experiments.harness import Experiment
from experiments.measure import steady

INTERVALS = (100, 300, 1000, 3000, 10000)


def points(quick: bool) -> list[dict]:
    records, keys = (400_000, 20_000) if quick else (2_000_000, 100_000)
    base = {"workers": 2, "records": records, "keys": keys}
    pts = [{"mode": "none", "interval_ms": 0, **base}]
    for iv in (100, 1000, 10000) if quick else INTERVALS:
        pts += [{"mode": m, "interval_ms": iv, **base} for m in FT]
    return pts


def measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    iv = p["interval_ms"] or None
    return steady(spark, os.path.join(d, "run"), p["mode"], p["workers"], p["records"], p["keys"], 0.0, iv, seed=seed)


def figure(rows: list[dict], path: str) -> None:
    plt = pyplot()
    rows = with_variant(rows)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    base = [r for r in rows if r["mode"] == "none"]
    ft = [r for r in rows if r["mode"] != "none"]
    for ax, y, label, scale in (
        (axes[0], "records_per_s", "throughput (thousand records/s)", 1e-3),
        (axes[1], "latency_p50_ms", "latency p50, ingest to commit (ms)", 1.0),
        (axes[2], "latency_p99_ms", "latency p99, ingest to commit (ms)", 1.0),
    ):
        draw_lines(ax, ft, "interval_ms", y, scale=scale)
        b = agg(base, ("mode",), y).get(("none",))
        if b:
            ax.axhline(b[0] * scale, color=MODE_COLORS["none"], linestyle="--", label="none (no fault tolerance)")
            if b[1]:
                lo, hi = max(0.0, b[0] - b[1]) * scale, (b[0] + b[1]) * scale
                ax.axhspan(lo, hi, color=MODE_COLORS["none"], alpha=0.12)
        ax.set_xscale("log")
        ax.set_xlabel("checkpoint (abs) or persistence (nosync) interval (ms)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Overhead against the interval: keyed_count, W = 2")
    save(fig, path)


def reading(rows: list[dict]) -> list[str]:
    tp = agg(rows, ("mode", "interval_ms"), "records_per_s")
    p99 = agg(rows, ("mode", "interval_ms"), "latency_p99_ms")
    # none has no interval: its rows are one reference, whatever interval_ms they carry
    none_rows = [r for r in rows if r["mode"] == "none"]
    base = agg(none_rows, ("mode",), "records_per_s").get(("none",))
    b99 = agg(none_rows, ("mode",), "latency_p99_ms").get(("none",))
    if not base:
        return ["Mode none was not measured: no ratio can be given."]
    out = []
    for m in FT:
        ivs = sorted(k[1] for k in tp if k[0] == m)
        if not ivs:
            continue
        parts = [f"{tp[(m, iv)][0] / base[0]:.2f}x none at {iv} ms" for iv in ivs]
        out.append(f"Throughput of {m}: " + ", ".join(parts) + ".")
        lo, hi = ivs[0], ivs[-1]
        if b99 and (m, lo) in p99 and (m, hi) in p99:
            out.append(
                f"Latency p99 of {m} is {p99[(m, lo)][0] / b99[0]:.1f}x none's at {lo} ms "
                f"and {p99[(m, hi)][0] / b99[0]:.1f}x at {hi} ms."
            )
    for iv in sorted({k[1] for k in tp if k[0] == "abs"} & {k[1] for k in tp if k[0] == "nosync"}):
        a, n = tp[("abs", iv)][0], tp[("nosync", iv)][0]
        faster = "nosync" if n > a else "abs"
        out.append(f"At {iv} ms, {faster} has the higher throughput ({max(a, n) / min(a, n):.2f}x the other).")
    return out


def table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    keys = sorted({(r["mode"], r["interval_ms"]) for r in rows}, key=lambda k: (k[0] != "none", k[0], k[1]))
    body = []
    for k in keys:
        sel = [r for r in rows if (r["mode"], r["interval_ms"]) == k]
        body.append(
            [k[0], str(k[1] or "-")]
            + [
                mean_sd(agg(sel, ("mode",), f).get((k[0],)))
                for f in ("records_per_s", "latency_p50_ms", "latency_p99_ms", "bytes_persisted")
            ]
        )
    return ["mode", "interval (ms)", "records/s", "p50 (ms)", "p99 (ms)", "bytes persisted"], body


EXPERIMENT = Experiment(
    "overhead-vs-interval",
    "Runtime overhead against the checkpoint or persistence interval",
    "keyed_count without failures; abs with checkpoint intervals, nosync with persistence "
    "intervals over the same range, against mode none. Throughput is first record read to "
    "last committed; latency is ingest to commit.",
    points,
    (3, 2),
    measure,
    worker_slots,
    figure,
    reading,
    table,
)
