"""`nosync experiment report`: one PNG per experiment and REPORT.md, from the Parquet tables.

Every sentence of a reading is computed from the rows at the time the report is written; the
report says nothing the tables do not hold.
"""

from __future__ import annotations

import os
import time

from experiments.catalog import EXPERIMENTS
from experiments.harness import read_rows, table_dir

ENV_FIELDS = ("host", "machine", "cpus", "memory_gib", "python", "pyspark", "nosync", "git_commit", "master")


def write(out: str) -> dict:
    """Writes OUT/<experiment>.png and OUT/REPORT.md for every experiment with rows; returns
    {experiment: png path}."""
    figures: dict[str, str] = {}
    lines = [
        "# nosync experiments",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M')} from the tables under `{os.path.abspath(out)}`. "
        "Every figure shows the mean over the repetitions, error bars one standard deviation; "
        "the readings are computed from the same rows.",
        "",
    ]
    for name, exp in EXPERIMENTS.items():
        rows = read_rows(out, name)
        if not rows:
            continue
        png = os.path.join(out, f"{name}.png")
        exp.figure(rows, png)
        figures[name] = png
        reps = max(r["rep"] for r in rows) + 1
        grids = sorted({r["grid"] for r in rows})
        lines += [f"## {exp.title} (`{name}`)", "", exp.about, "", f"![{name}]({name}.png)", ""]
        lines += ["What the figures show:", ""]
        lines += [f"- {s}" for s in exp.reading(rows)] or ["- (nothing to compare)"]
        header, body = exp.table(rows)
        lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        envs = sorted({tuple(str(r.get(f)) for f in ENV_FIELDS) for r in rows})
        lines += [
            "",
            f"Configuration: {len(rows)} measurements, up to {reps} per point, grid {', '.join(grids)}; "
            f"table `{os.path.relpath(table_dir(out, name), out)}/`.",
        ]
        for e in envs:
            lines.append("- " + ", ".join(f"{f} {v}" for f, v in zip(ENV_FIELDS, e, strict=True)))
        lines.append("")
    if not figures:
        lines.append("No experiment has rows here yet: run `nosync experiment NAME --out DIR` first.")
    with open(os.path.join(out, "REPORT.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return figures
