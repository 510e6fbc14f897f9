"""Experiment `failure-classes`: what each persistence level costs in steady state, and what it
buys in recovery, for each class of failure.

keyed_count at W = 2, abs's checkpoint interval and nosync's persistence interval alike (1 s).
For each mode and level - the local disk, the replicated level (a copy in one peer's memory,
mode nosync), the remote tier, and both (snapshots count once on the remote tier, and a lost
machine restores from the peer's copy) - three runs: one without failures (steady-state
throughput, against mode none's), one in which worker W-1's process is killed once half the
input is read, and one in which its machine is lost at that point (its local root with it,
`experiments.failures`). A level that cannot survive a lost machine (the disk) is not run
with one: the report says so. The figure plots, per class, steady-state throughput against
the time to get back to 90% of it.
"""

from __future__ import annotations

import os
from typing import Any

from experiments.common import agg, fmt, mean_sd, pyplot, save
from experiments.failures import refusal
from experiments.harness import Experiment
from experiments.measure import recovery, steady

LEVELS = {
    "disk": ("disk", 0),
    "replicated": ("replicated", 1),
    "remote": ("remote", 0),
    "replicated+remote": ("remote", 1),
}
"""A level's --checkpoint-tier and --replicas."""
MODES = {"abs": ("disk", "remote"), "nosync": tuple(LEVELS)}
CLASSES = ("process", "machine")
INTERVAL_MS = 1000


def points(quick: bool) -> list[dict]:
    keys, records = (100_000, 1_500_000) if quick else (1_000_000, 4_000_000)
    base = {"workers": 2, "keys": keys, "records": records, "interval_ms": INTERVAL_MS}
    pts = [{**base, "mode": "none", "level": "-"}]
    pts += [{**base, "mode": m, "level": lv} for m, levels in MODES.items() for lv in levels]
    return pts


def measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    mode = p["mode"]
    if mode == "none":
        s = steady(spark, os.path.join(d, "steady"), mode, p["workers"], p["records"], p["keys"], seed=seed)
        return {"steady_records_per_s": s["records_per_s"], "steady_p99_ms": s["latency_p99_ms"]}
    tier, replicas = LEVELS[p["level"]]
    opts = {"replicas": replicas} if replicas else {}
    iv = p["interval_ms"]
    s = steady(
        spark,
        os.path.join(d, "steady"),
        mode,
        p["workers"],
        p["records"],
        p["keys"],
        0.0,
        iv,
        tier,
        seed=seed,
        options=opts,
    )
    row: dict = {
        "steady_records_per_s": s["records_per_s"],
        "steady_p99_ms": s["latency_p99_ms"],
        "bytes_persisted": s["bytes_persisted"],
    }
    for failure in CLASSES:
        if refusal(mode, failure, tier, replicas, p["workers"]) is not None:
            row[f"{failure}_refused"] = True
            continue
        r = recovery(
            spark,
            os.path.join(d, failure),
            mode,
            p["workers"],
            p["keys"],
            p["records"],
            iv,
            tier=tier,
            seed=seed,
            missed_ok=True,
            options=opts,
            failure=failure,
        )
        for f in ("recovery_s", "restore_s", "records_reprocessed", "restored_from", "kill_missed"):
            row[f"{failure}_{f}"] = r.get(f, "-" if f == "restored_from" else None)
    return row


def slots(p: dict) -> int:
    return p["workers"]


def _label(r: dict) -> str:
    return r["mode"] if r["mode"] == "none" else f"{r['mode']} / {r['level']}"


def figure(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(CLASSES), figsize=(6.5 * len(CLASSES), 4.6))
    base = agg(rows, ("mode",), "steady_records_per_s").get(("none",))
    tput = agg(rows, ("mode", "level"), "steady_records_per_s")
    # one colour per mode and level, the same in every panel
    palette = plt.get_cmap("tab10").colors
    color = {k: palette[i % len(palette)] for i, k in enumerate(sorted(k for k in tput if k[0] != "none"))}
    for ax, failure in zip(axes, CLASSES, strict=True):
        rec = agg(rows, ("mode", "level"), f"{failure}_recovery_s")
        for (mode, level), (y, ysd, _) in sorted(tput.items()):
            if mode == "none" or (mode, level) not in rec:
                continue
            x, xsd, _ = rec[(mode, level)]
            marker = "o" if mode == "nosync" else "s"
            ax.errorbar(
                x, y, xerr=xsd, yerr=ysd, fmt=marker, capsize=3, color=color[(mode, level)], label=f"{mode} / {level}"
            )
            ax.annotate(f"{mode}/{level}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
        if base:
            ax.axhline(base[0], color="#555555", linestyle="--", linewidth=1, label="none (no persistence)")
        ax.set_xlabel(f"recovery after a {failure} failure: kill to 90% throughput (s)")
        ax.set_ylabel("steady-state records/s (no failure)")
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.set_title(f"failure class: {failure}")
    axes[0].legend(fontsize=7)
    fig.suptitle("What each level costs and buys: keyed_count, W = 2, 1 s interval")
    save(fig, path)


def reading(rows: list[dict]) -> list[str]:
    out = []
    base = agg(rows, ("mode",), "steady_records_per_s").get(("none",))
    tput = agg(rows, ("mode", "level"), "steady_records_per_s")
    for (mode, level), (y, _, _) in sorted(tput.items()):
        if mode == "none":
            continue
        share = f" ({y / base[0]:.2f}x none)" if base else ""
        parts = [f"{mode} on {level}: {fmt(y)} records/s without failures{share}"]
        for failure in CLASSES:
            sel = [r for r in rows if r["mode"] == mode and r["level"] == level]
            if any(r.get(f"{failure}_refused") for r in sel):
                parts.append(f"a {failure} failure: refused (the level does not survive it)")
                continue
            rec = agg(sel, ("mode",), f"{failure}_recovery_s").get((mode,))
            res = agg(sel, ("mode",), f"{failure}_restore_s").get((mode,))
            src = sorted({str(r.get(f"{failure}_restored_from", "-")) for r in sel} - {"-", "None"})
            where = f", restored from {'/'.join(src)}" if src else ""
            parts.append(
                f"a {failure} failure: back to 90% in {fmt(rec[0] if rec else None)} s, "
                f"restore {fmt(res[0] if res else None)} s{where}"
            )
        out.append("; ".join(parts) + ".")
    return out


def table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    body = []
    for key in sorted({(r["mode"], r["level"]) for r in rows}):
        sel = [r for r in rows if (r["mode"], r["level"]) == key]
        cells = [_label(sel[0]), mean_sd(agg(sel, ("mode",), "steady_records_per_s").get((key[0],)))]
        for failure in CLASSES:
            if any(r.get(f"{failure}_refused") for r in sel):
                cells += ["refused", "-"]
                continue
            cells += [
                mean_sd(agg(sel, ("mode",), f"{failure}_recovery_s").get((key[0],))),
                mean_sd(agg(sel, ("mode",), f"{failure}_restore_s").get((key[0],))),
            ]
        body.append(cells)
    head = ["mode / level", "records/s (no failure)"]
    for failure in CLASSES:
        head += [f"{failure}: to 90% (s)", f"{failure}: restore (s)"]
    return head, body


EXPERIMENT = Experiment(
    "failure-classes",
    "What each persistence level costs, and what it buys, per failure class",
    "keyed_count, W = 2, abs's checkpoints and nosync's persistence every 1 s. Per mode and level "
    "(disk; replicated: one peer's memory, mode nosync; remote; replicated + remote): a run without "
    "failures, one in which worker 1's process is killed at half the input, and one in which its "
    "machine is lost there (its local root deleted before Spark's retry). A level that does not "
    "survive a lost machine is refused it, as `nosync chaos` refuses it.",
    points,
    (2, 1),
    measure,
    slots,
    figure,
    reading,
    table,
)
