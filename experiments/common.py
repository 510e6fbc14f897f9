"""What the experiments share: the modes with fault tolerance, the colour of every mode,
aggregation of rows over repetitions, number formatting, and drawing."""

from __future__ import annotations

import math
import statistics
from typing import Any

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


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend."""
    # imported on first use: matplotlib is slow to import, and only figures need it
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
    pyplot().close(fig)


def worker_slots(p: dict) -> int:
    """Spark task slots of a point that runs one task per worker."""
    return p["workers"]
