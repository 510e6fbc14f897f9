"""Experiment `scaling`: throughput per mode (none, abs, nosync, replay) and worker count."""

from __future__ import annotations

import os
from typing import Any

from experiments.common import MODE_COLORS, agg, fmt, mean_sd, pyplot, save
from experiments.harness import Experiment
from experiments.measure import steady
from nosync.modes import MODES


def points(quick: bool) -> list[dict]:
    records, keys = (600_000, 20_000) if quick else (3_000_000, 100_000)
    return [{"mode": m, "workers": w, "records": records, "keys": keys} for w in (1, 2, 4) for m in MODES]


def measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    return steady(spark, os.path.join(d, "run"), p["mode"], p["workers"], p["records"], p["keys"], seed=seed)


def figure(rows: list[dict], path: str) -> None:
    plt = pyplot()
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    ws = sorted({r["workers"] for r in rows})
    st = agg(rows, ("mode", "workers"), "records_per_s")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(modes))
    for i, m in enumerate(modes):
        xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(ws))]
        vals = [st.get((m, w), (0.0, 0.0, 0)) for w in ws]
        ax.bar(
            xs,
            [v[0] / 1e3 for v in vals],
            width,
            yerr=[v[1] / 1e3 if v[2] > 1 else float("nan") for v in vals],
            capsize=3,
            label=m,
            color=MODE_COLORS[m],
        )
    ax.set_xticks(range(len(ws)), [f"W = {w}" for w in ws])
    ax.set_xlabel(f"workers (this machine: {rows[0].get('cpus', '?')} cores; master {rows[0].get('master', '?')})")
    ax.set_ylabel("throughput (thousand records/s)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    ax.set_title("Scaling: keyed_count throughput per mode and worker count")
    save(fig, path)


def reading(rows: list[dict]) -> list[str]:
    st = agg(rows, ("mode", "workers"), "records_per_s")
    out = []
    for m in MODES:
        ws = sorted(k[1] for k in st if k[0] == m)
        if len(ws) > 1:
            parts = [f"W = {w}: {fmt(st[(m, w)][0])} records/s" for w in ws]
            out.append(
                f"{m}: " + ", ".join(parts) + f" ({st[(m, ws[-1])][0] / st[(m, ws[0])][0]:.2f}x from "
                f"W = {ws[0]} to W = {ws[-1]})."
            )
    cpus = rows[0].get("cpus") if rows else None
    if cpus:
        out.append(f"The machine had {cpus} cores: past W = {cpus}, workers share them.")
    return out


def table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    keys = sorted({(r["workers"], r["mode"]) for r in rows})
    body = []
    for k in keys:
        sel = [r for r in rows if (r["workers"], r["mode"]) == k]
        body.append(
            [str(k[0]), k[1]]
            + [mean_sd(agg(sel, ("mode",), f).get((k[1],))) for f in ("records_per_s", "latency_p99_ms")]
        )
    return ["W", "mode", "records/s", "p99 (ms)"], body


EXPERIMENT = Experiment(
    "scaling",
    "Throughput per mode and worker count",
    "keyed_count without failures for W = 1, 2, 4 on the given master (embedded by default).",
    points,
    (3, 2),
    measure,
    lambda p: 2 * p["workers"] if p["mode"] == "replay" else p["workers"],
    figure,
    reading,
    table,
)
