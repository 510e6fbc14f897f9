"""The experiments `nosync experiment NAME` runs: their grids, measurements, figures and readings.

Every measurement is a run of `keyed_count` (generated records over K keys, a running count per
key, committed to Parquet files) through `experiments.measure`, the code `nosync bench` uses.
The full grids are the defaults; `--quick` grids are small enough that all seven run in about 12
minutes on a 2-core machine, and are meant to check the pipeline of figures, not to be quoted
without their repetitions.
"""

from __future__ import annotations

import collections
import math
import os
import statistics
from typing import Any

from experiments.harness import Experiment
from experiments.measure import recovery, steady

FT = ("abs", "nosync")
MODE_COLORS = {
    "none": "#555555",
    "abs": "#1f77b4",
    "nosync": "#d62728",
    "nosync (remote)": "#ff9896",
    "abs (remote)": "#aec7e8",
    "replay": "#2ca02c",
}


# -- aggregation -------------------------------------------------------------------------


def agg(rows: list[dict], by: tuple[str, ...], metric: str) -> dict[tuple, tuple[float, float, int]]:
    """(mean, standard deviation, n) of `metric` per value of the `by` columns; rows without
    the metric are left out."""
    groups: dict[tuple, list[float]] = {}
    for r in rows:
        v = r.get(metric)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            continue
        groups.setdefault(tuple(r.get(b) for b in by), []).append(float(v))
    return {k: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v)) for k, v in groups.items()}


def variant(r: dict) -> str:
    """The line a row belongs to: its mode, and its tier when not the local disk."""
    tier = r.get("tier") or "disk"
    return r["mode"] if tier == "disk" else f"{r['mode']} ({tier})"


def with_variant(rows: list[dict]) -> list[dict]:
    return [{**r, "variant": variant(r)} for r in rows]


def fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        v = int(v)
    if isinstance(v, float):
        s = f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}" if abs(v) >= 1 else f"{v:.3f}"
    else:
        s = f"{v:,}"
    return s + unit


def mean_sd(m: tuple[float, float, int] | None, unit: str = "") -> str:
    if m is None:
        return "-"
    mean, sd, n = m
    return fmt(mean, unit) + (f" ± {fmt(sd)}" if n > 1 else "")


# -- drawing -----------------------------------------------------------------------------


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_lines(ax: Any, rows: list[dict], x: str, y: str, group: str = "variant", scale: float = 1.0) -> None:
    """One line per `group` value: mean of `y` over the repetitions at each `x`, error bars of
    one standard deviation."""
    stats = agg(rows, (group, x), y)
    for g in sorted({k[0] for k in stats}, key=lambda g: list(MODE_COLORS).index(g) if g in MODE_COLORS else 99):
        pts = sorted((k[1], v) for k, v in stats.items() if k[0] == g)
        ax.errorbar(
            [p[0] for p in pts],
            [p[1][0] * scale for p in pts],
            # no bar where a point was measured once: a deviation of 0 would claim precision
            yerr=[p[1][1] * scale if p[1][2] > 1 else float("nan") for p in pts],
            label=g,
            marker="o",
            capsize=3,
            color=MODE_COLORS.get(g),
        )


def save(fig: Any, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)


# -- 1. overhead against the interval ----------------------------------------------------

INTERVALS = (100, 300, 1000, 3000, 10000)


def _overhead_points(quick: bool) -> list[dict]:
    records, keys = (400_000, 20_000) if quick else (2_000_000, 100_000)
    base = {"workers": 2, "records": records, "keys": keys}
    pts = [{"mode": "none", "interval_ms": 0, **base}]
    for iv in (100, 1000, 10000) if quick else INTERVALS:
        pts += [{"mode": m, "interval_ms": iv, **base} for m in FT]
    return pts


def _overhead_measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    iv = p["interval_ms"] or None
    return steady(spark, os.path.join(d, "run"), p["mode"], p["workers"], p["records"], p["keys"], 0.0, iv, seed=seed)


def _overhead_figure(rows: list[dict], path: str) -> None:
    plt = _plt()
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


def _overhead_reading(rows: list[dict]) -> list[str]:
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


def _overhead_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
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


# -- 2. stall against state size ---------------------------------------------------------


def _stall_points(quick: bool) -> list[dict]:
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


def _stall_measure(spark: Any, d: str, p: dict, seed: int) -> dict:
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


def _stall_figure(rows: list[dict], path: str) -> None:
    plt = _plt()
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


def _stall_reading(rows: list[dict]) -> list[str]:
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


def _stall_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
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


# -- 3. and 4. recovery ------------------------------------------------------------------

RECOVERY_VARIANTS = (("abs", "disk"), ("nosync", "disk"), ("nosync", "remote"), ("replay", "disk"))


def _recovery_state_points(quick: bool) -> list[dict]:
    sizes = (10_000, 100_000) if quick else (10_000, 100_000, 1_000_000)
    pts = []
    for keys in sizes:
        # long enough that the kill, at half the records, comes after abs's first checkpoint,
        # and (the full grid, as `bench recovery`) that the input outlasts the recovery
        records = max(1_000_000, 4 * keys) if quick else max(8_000_000, 8 * keys)
        pts += [
            {"mode": m, "tier": t, "workers": 2, "records": records, "keys": keys, "interval_ms": 1000}
            for m, t in RECOVERY_VARIANTS
        ]
    return pts


def _recovery_measure(spark: Any, d: str, p: dict, seed: int) -> dict:
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


def _recovery_slots(p: dict) -> int:
    return 2 * p["workers"]  # replay's batch jobs beside the streaming tasks


def _recovery_figure(rows: list[dict], path: str, x: str, xlabel: str, title: str, logx: bool) -> None:
    plt = _plt()
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


def _recovery_reading(rows: list[dict], x: str, unit: str) -> list[str]:
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


def _recovery_table(rows: list[dict], x: str, xname: str) -> tuple[list[str], list[list[str]]]:
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


def _failure_points(quick: bool) -> list[dict]:
    phases = (0.2, 0.8) if quick else (0.05, 0.25, 0.5, 0.75, 0.95)
    records, keys = (3_000_000, 20_000) if quick else (4_000_000, 100_000)
    return [
        {"mode": m, "workers": 2, "records": records, "keys": keys, "interval_ms": 1000, "phase": ph}
        for ph in phases
        for m in FT
    ]


# -- 5. scaling --------------------------------------------------------------------------


def _scaling_points(quick: bool) -> list[dict]:
    records, keys = (600_000, 20_000) if quick else (3_000_000, 100_000)
    return [
        {"mode": m, "workers": w, "records": records, "keys": keys}
        for w in (1, 2, 4)
        for m in ("none", "abs", "nosync", "replay")
    ]


def _scaling_measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    return steady(spark, os.path.join(d, "run"), p["mode"], p["workers"], p["records"], p["keys"], seed=seed)


def _scaling_figure(rows: list[dict], path: str) -> None:
    plt = _plt()
    modes = [m for m in ("none", "abs", "nosync", "replay") if any(r["mode"] == m for r in rows)]
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


def _scaling_reading(rows: list[dict]) -> list[str]:
    st = agg(rows, ("mode", "workers"), "records_per_s")
    out = []
    for m in ("none", "abs", "nosync", "replay"):
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


def _scaling_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    keys = sorted({(r["workers"], r["mode"]) for r in rows})
    body = []
    for k in keys:
        sel = [r for r in rows if (r["workers"], r["mode"]) == k]
        body.append(
            [str(k[0]), k[1]]
            + [mean_sd(agg(sel, ("mode",), f).get((k[1],))) for f in ("records_per_s", "latency_p99_ms")]
        )
    return ["W", "mode", "records/s", "p99 (ms)"], body


# -- 6. snapshot size --------------------------------------------------------------------


def _snapshot_points(quick: bool) -> list[dict]:
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


def _snapshot_measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    """Bytes the mode's snapshots wrote (incremental: changed keys only), per second and per
    snapshot, the bytes each tier holds at the end, and the size a full snapshot of the state
    would have (every key's value, packed as the stores pack them), from the state recomputed
    at the end of the input by the batch jobs of `nosync state`."""
    import msgpack

    from experiments.measure import KEYED_COUNT
    from nosync.batch import keyed_state
    from nosync.runinfo import inspect_run

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


def _snapshot_figure(rows: list[dict], path: str) -> None:
    plt = _plt()
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


def _snapshot_reading(rows: list[dict]) -> list[str]:
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


def _snapshot_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
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


# -- 7. persistence as resources permit: overhead and recovery span against the budget ----------

BUDGETS = (0.01, 0.02, 0.05, 0.1, 0.2, 1.0)


def _budget_points(quick: bool) -> list[dict]:
    records, keys = (600_000, 100_000) if quick else (3_000_000, 1_000_000)
    base = {"workers": 2, "records": records, "keys": keys, "interval_ms": 200}
    pts = [{"mode": "none", "budget": 0.0, **base}]
    pts += [{"mode": "nosync", "budget": b, **base} for b in ((0.01, 0.05, 1.0) if quick else BUDGETS)]
    return pts


def _budget_measure(spark: Any, d: str, p: dict, seed: int) -> dict:
    options = {"persist_budget": p["budget"]} if p["mode"] == "nosync" else {}
    iv = p["interval_ms"] if p["mode"] == "nosync" else None
    run = os.path.join(d, "run")
    return steady(spark, run, p["mode"], p["workers"], p["records"], p["keys"], 0.0, iv, seed=seed, options=options)


def _budget_ratio(rows: list[dict]) -> list[dict]:
    """The nosync rows with their throughput as a fraction of mode none's (mean of none's rows)."""
    base = agg([r for r in rows if r["mode"] == "none"], ("mode",), "records_per_s").get(("none",))
    if not base:
        return []
    return [{**r, "overhead": 1 - r["records_per_s"] / base[0]} for r in rows if r["mode"] == "nosync"]


def _budget_figure(rows: list[dict], path: str) -> None:
    plt = _plt()
    ns_rows = with_variant(_budget_ratio(rows))
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


def _budget_reading(rows: list[dict]) -> list[str]:
    ns_rows = _budget_ratio(rows)
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


def _budget_table(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    ns_rows = _budget_ratio(rows)
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


# -- the catalog -------------------------------------------------------------------------


def _w(p: dict) -> int:
    return p["workers"]


EXPERIMENTS: dict[str, Experiment] = {
    e.name: e
    for e in (
        Experiment(
            "overhead-vs-interval",
            "Runtime overhead against the checkpoint or persistence interval",
            "keyed_count without failures; abs with checkpoint intervals, nosync with persistence "
            "intervals over the same range, against mode none. Throughput is first record read to "
            "last committed; latency is ingest to commit.",
            _overhead_points,
            (3, 2),
            _overhead_measure,
            _w,
            _overhead_figure,
            _overhead_reading,
            _overhead_table,
        ),
        Experiment(
            "stall-vs-state",
            "Operator stall and latency as keyed state grows",
            "keyed_count without failures as the number of keys grows, with uniform and Zipf-skewed "
            "keys, with and without a slow worker 0 (its source sleeps after every batch). A stall is "
            "time an operator could not process available input because of fault tolerance: abs's "
            "barrier alignment, nosync's persistence backpressure.",
            _stall_points,
            (2, 2),
            _stall_measure,
            _w,
            _stall_figure,
            _stall_reading,
            _stall_table,
        ),
        Experiment(
            "recovery-vs-state",
            "Recovery time as keyed state grows",
            "keyed_count; worker W-1 gets SIGKILL once half the records are read and the mode has "
            "something to recover from. abs checkpoints and nosync persists every second (to the local "
            "disk, or to the remote tier only); replay recomputes with batch jobs.",
            _recovery_state_points,
            (2, 2),
            _recovery_measure,
            _recovery_slots,
            lambda rows, path: _recovery_figure(
                rows, path, "keys", "keys in state", "Recovery as state grows: keyed_count, W = 2, one kill", True
            ),
            lambda rows: _recovery_reading(rows, "keys", " keys"),
            lambda rows: _recovery_table(rows, "keys", "keys"),
        ),
        Experiment(
            "recovery-vs-failure-point",
            "Recovery time against where in the interval the failure falls",
            "keyed_count; abs checkpoints and nosync persists every 1000 ms; the kill comes a chosen "
            "fraction of that interval after a completed checkpoint (abs) or safe point (nosync).",
            _failure_points,
            (3, 2),
            _recovery_measure,
            _recovery_slots,
            lambda rows, path: _recovery_figure(
                rows,
                path,
                "phase",
                "kill point, as a fraction of the 1000 ms interval",
                "Recovery against the failure point: keyed_count, W = 2, one kill",
                False,
            ),
            lambda rows: _recovery_reading(rows, "phase", " of the interval"),
            lambda rows: _recovery_table(rows, "phase", "kill point"),
        ),
        Experiment(
            "scaling",
            "Throughput per mode and worker count",
            "keyed_count without failures for W = 1, 2, 4 on the given master (embedded by default).",
            _scaling_points,
            (3, 2),
            _scaling_measure,
            lambda p: 2 * p["workers"] if p["mode"] == "replay" else p["workers"],
            _scaling_figure,
            _scaling_reading,
            _scaling_table,
        ),
        Experiment(
            "snapshot-size",
            "Bytes written by snapshots, per mode and tier; incremental against full",
            "keyed_count without failures; abs checkpoints and nosync persists every 250 ms, to the "
            "local disk or to the remote tier. Snapshots of both modes are incremental: abs writes the "
            "keys changed since the last checkpoint; nosync writes those, the frames its receivers had "
            "not durably consumed (the residue of its output logs), its metadata, and lineage points "
            "in between. A full snapshot is every key's value, packed as the stores pack them, from "
            "the state recomputed by `nosync state`'s batch jobs.",
            _snapshot_points,
            (2, 2),
            _snapshot_measure,
            _w,
            _snapshot_figure,
            _snapshot_reading,
            _snapshot_table,
        ),
        Experiment(
            "budget",
            "Persistence as resources permit: overhead and recovery span against the budget",
            "keyed_count without failures, 1M keys; nosync with --persist-ms 200 and each --persist-budget: "
            "after each snapshot the next interval is what it cost divided by the budget. Overhead is the "
            "throughput lost against mode none; the span is the longest time from a snapshot to the next "
            "one being durable (what a recovery would re-execute at worst).",
            _budget_points,
            (2, 2),
            _budget_measure,
            _w,
            _budget_figure,
            _budget_reading,
            _budget_table,
        ),
    )
}
