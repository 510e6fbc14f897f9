"""Experiment `snapshot-size`: bytes written by the snapshots of abs and nosync, per tier,
against the size of a full snapshot of the same state."""

from __future__ import annotations

import os
from typing import Any

import msgpack

from experiments.common import FT, MODE_COLORS, agg, draw_lines, fmt, mean_sd, pyplot, save, with_variant, worker_slots
from experiments.harness import Experiment
from experiments.measure import KEYED_COUNT, steady
from nosync.spark.batch import keyed_state
from nosync.tools.runinfo import inspect_run


def points(quick: bool) -> list[dict]:
    sizes = (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000)
    pts = []
    for keys in sizes:
        # several intervals long, so that snapshots taken mid-run outnumber the last one
        records = max(600_000 if quick else 3_000_000, 2 * keys)
        pts += [
            {"mode": m, "tier": t, "workers": 2, "records": records, "keys": keys, "interval_ms": 250}
            for m in FT
            for t in ("disk", "remote")
        ]
    return pts


def measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    """Bytes the mode's snapshots wrote (incremental: changed keys only), per second and per
    snapshot, the bytes each tier holds at the end, and the size a full snapshot of the state
    would have (every key's value, packed as the stores pack them), from the state recomputed
    at the end of the input by the batch jobs of `nosync state`."""
    run = os.path.join(d, "run")
    row = steady(
        spark,
        run,
        p["mode"],
        p["workers"],
        p["records"],
        p["keys"],
        0.0,
        p["interval_ms"],
        p["tier"],
        seed=seed,
        keep=True,
    )
    info = inspect_run(run)
    for t in ("disk", "log", "remote"):
        row[f"held_{t}_bytes"] = sum(s.get(f"{t}_bytes", 0) or 0 for s in info.get("stores", []))
    snaps = row.get("checkpoints_completed") if p["mode"] == "abs" else row.get("snapshots")
    row["snapshots_taken"] = snaps
    row["bytes_per_s"] = (row["checkpoint_bytes"] or 0) / row["processing_s"]
    row["bytes_per_snapshot"] = (row["checkpoint_bytes"] or 0) / snaps if snaps else None
    params = {"records": str(p["records"]), "keys": str(p["keys"]), "seed": str(seed), "output": "none"}
    state = keyed_state(
        KEYED_COUNT, params, "aggregate_1", workers=p["workers"], spark=spark, run_dir=os.path.join(d, "q")
    )
    row["full_snapshot_bytes"] = sum(len(msgpack.packb([k, v])) for k, v in state)
    row["state_keys"] = len(state)
    return row


def figure(rows: list[dict], path: str) -> None:
    plt = pyplot()
    rows = with_variant(rows)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    draw_lines(axes[0], rows, "keys", "bytes_per_s", scale=1 / 2**20)
    axes[0].set_ylabel("snapshot bytes written (MiB/s)")
    draw_lines(axes[1], rows, "keys", "bytes_per_snapshot", scale=1 / 2**20)
    full = agg(rows, ("keys",), "full_snapshot_bytes")
    xs = sorted(full)
    axes[1].plot(
        [k[0] for k in xs], [full[k][0] / 2**20 for k in xs], "k--", marker="s", label="a full snapshot of the state"
    )
    axes[1].set_ylabel("bytes per snapshot (MiB)")
    axes[1].legend()
    for t, style in (("disk", "-"), ("log", ":"), ("remote", "--")):
        st = agg(rows, ("variant", "keys"), f"held_{t}_bytes")
        for v in sorted({k[0] for k in st}):
            pts = sorted((k[1], m[0]) for k, m in st.items() if k[0] == v)
            if any(p[1] for p in pts):
                axes[2].plot(
                    [p[0] for p in pts],
                    [p[1] / 2**20 for p in pts],
                    style,
                    marker="o",
                    color=MODE_COLORS.get(v),
                    label=f"{v}: {t}",
                )
    axes[2].set_ylabel("bytes held at the end, per tier (MiB)")
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("keys in state")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Snapshot size: incremental snapshots against a full one, keyed_count, W = 2")
    save(fig, path)


def reading(rows: list[dict]) -> list[str]:
    rows = with_variant(rows)
    per = agg(rows, ("variant", "keys"), "bytes_per_snapshot")
    rate = agg(rows, ("variant", "keys"), "bytes_per_s")
    full = agg(rows, ("keys",), "full_snapshot_bytes")
    out = []
    for (v, k), m in sorted(per.items()):
        f = full.get((k,))
        if f and f[0]:
            out.append(
                f"{v}, {k:,} keys: {fmt(m[0] / 1024)} KiB per snapshot, {m[0] / f[0]:.2f}x a full snapshot "
                f"({fmt(f[0] / 1024)} KiB); {fmt(rate[(v, k)][0] / 2**20)} MiB/s written."
            )
    return out


def table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    rows = with_variant(rows)
    keys = sorted({(r["keys"], r["variant"]) for r in rows})
    body = []
    for k in keys:
        sel = [r for r in rows if (r["keys"], r["variant"]) == k]
        body.append(
            [f"{k[0]:,}", k[1]]
            + [
                mean_sd(agg(sel, ("variant",), f).get((k[1],)))
                for f in ("bytes_per_s", "snapshots_taken", "bytes_per_snapshot", "full_snapshot_bytes")
            ]
        )
    return ["keys", "mode", "bytes/s", "snapshots", "bytes/snapshot", "full snapshot (bytes)"], body


EXPERIMENT = Experiment(
    "snapshot-size",
    "Bytes written by snapshots, per mode and tier; incremental against full",
    "keyed_count without failures; abs checkpoints and nosync persists every 250 ms, to the "
    "local disk or to the remote tier. Snapshots of both modes are incremental: abs writes the "
    "keys changed since the last checkpoint; nosync writes those, the frames its receivers had "
    "not durably consumed (the residue of its output logs), its metadata, and lineage points "
    "in between. A full snapshot is every key's value, packed as the stores pack them, from "
    "the state recomputed by `nosync state`'s batch jobs.",
    points,
    (2, 2),
    measure,
    worker_slots,
    figure,
    reading,
    table,
)
