"""The experiment harness: a declared grid of points, each measured `reps` times, resumable.

An experiment (a module each, assembled in `experiments/catalog.py`) declares its points
(dicts of parameters) for the full grid and for `--quick`, how many repetitions, and how to
measure one point. The harness runs every (point, repetition) not measured yet, on one Spark
session sized for the whole grid, and appends each result as one row to the experiment's Parquet table, a directory of
one file per row:

    OUT/<experiment>/<point id>-r<rep>.parquet

A row holds the point's parameters, the measured figures, and where they were measured: the
machine (host, cores, memory), the Python, PySpark and nosync versions, the git commit, the
Spark master, the grid (quick or full), when, and how long the measurement took. A row is
written atomically once its point is measured, so a run that is interrupted loses only the
point in progress; the next run of the same grid skips every row already there.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nosync.errors import NosyncError, RunFailed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Experiment:
    name: str
    title: str
    about: str
    """What it measures and how, for the report."""
    points: Callable[[bool], list[dict]]
    """The grid: quick -> points."""
    reps: tuple[int, int]
    """Repetitions of every point: (full grid, quick grid)."""
    measure: Callable[[Any, str, dict, int], dict]
    """(spark, scratch dir, point, seed) -> figures."""
    slots: Callable[[dict], int]
    """Spark task slots a point needs."""
    figure: Callable[[list[dict], str], None] = field(repr=False, default=None)  # type: ignore[assignment]
    """(rows, png path): draws the experiment's figure."""
    reading: Callable[[list[dict]], list[str]] = field(repr=False, default=None)  # type: ignore[assignment]
    """rows -> sentences about what the figures show, computed from them."""
    table: Callable[[list[dict]], tuple[list[str], list[list[str]]]] = field(repr=False, default=None)  # type: ignore[assignment]
    """rows -> (header, body) of the report's table."""


def point_id(point: dict) -> str:
    """A stable, readable name of a point: its parameters in key order."""
    text = ",".join(f"{k}={point[k]}" for k in sorted(point))
    safe = "".join(c if c.isalnum() or c in "=,.-_" else "_" for c in text)
    if len(safe) > 120:
        safe = safe[:100] + "-" + hashlib.sha1(text.encode()).hexdigest()[:12]
    return safe


def environment(master: str | None) -> dict:
    """Where the figures come from."""
    import pyspark

    try:
        from importlib.metadata import version

        nosync_version = version("nosync")
    except Exception:  # not installed as a package: the source tree only
        nosync_version = "unknown"
    commit = _git("rev-parse", "HEAD") or "unknown"
    if commit != "unknown" and _git("status", "--porcelain", "--untracked-files=no"):
        commit += "+changes"
    mem = 0
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            mem = int(next(line for line in f if line.startswith("MemTotal")).split()[1]) * 1024
    except (OSError, StopIteration, ValueError):
        pass
    return {
        "host": platform.node(),
        "machine": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count() or 0,
        "memory_gib": round(mem / 2**30, 1),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "nosync": nosync_version,
        "git_commit": commit,
        "master": master or "embedded",
    }


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def table_dir(out: str, name: str) -> str:
    return os.path.join(out, name)


def _row_path(out: str, name: str, pid: str, rep: int) -> str:
    return os.path.join(table_dir(out, name), f"{pid}-r{rep}.parquet")


def _write_row(path: str, row: dict) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    flat = {k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v for k, v in row.items()}
    # a figure a run did not have (None) is a null double, not a column of type null: the
    # files of one table then read as one dataset, whatever rows had a figure
    table = pa.Table.from_pylist([flat])
    schema = pa.schema([pa.field(f.name, pa.float64()) if pa.types.is_null(f.type) else f for f in table.schema])
    table = table.cast(schema)
    tmp = path + ".tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def read_rows(out: str, name: str) -> list[dict]:
    """Every row of the experiment's table under `out` (none if it has not run)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = table_dir(out, name)
    if not os.path.isdir(d):
        return []
    files = sorted(f for f in os.listdir(d) if f.endswith(".parquet"))
    if not files:
        return []
    tables = [pq.read_table(os.path.join(d, f)) for f in files]
    return pa.concat_tables(tables, promote_options="permissive").to_pylist()


def points(exp: Experiment, quick: bool, overrides: dict | None = None, strict: bool = True) -> list[dict]:
    """The grid's points, with `overrides` (parameter -> value) set in every point that has
    the parameter; with `strict`, a parameter no point has is refused, naming it."""
    pts = exp.points(quick)
    overrides = overrides or {}
    known = {k for p in pts for k in p}
    for k in overrides:
        if strict and k not in known:
            have = ", ".join(sorted(known))
            raise NosyncError(f"experiment {exp.name} has no parameter '{k}' (its parameters: {have})")
    out: list[dict] = []
    for p in pts:
        q = {**p, **{k: _typed(k, v, p[k]) for k, v in overrides.items() if k in p}}
        if q not in out:
            out.append(q)
    return out


def _typed(key: str, value: Any, like: Any) -> Any:
    """`value` (a command-line string) as the type of the grid's own value `like`."""
    if not isinstance(value, str) or isinstance(like, bool) or not isinstance(like, (int, float)):
        return value
    try:
        return int(float(value)) if isinstance(like, int) else float(value)
    except ValueError:
        raise NosyncError(f"{key}={value}: '{value}' is not a number, as {key} is in the grid") from None


def plan(
    exp: Experiment, quick: bool, seed: int, overrides: dict | None = None, strict: bool = True
) -> list[tuple[dict, int, int]]:
    """(point, rep, seed) of the whole grid, in the order they run: repetition by repetition,
    so that an interrupted grid has every point measured about as often."""
    reps = exp.reps[1] if quick else exp.reps[0]
    pts = points(exp, quick, overrides, strict)
    return [(p, r, seed + r) for r in range(reps) for p in pts]


def run(
    exp: Experiment,
    out: str,
    quick: bool = False,
    seed: int = 1,
    master: str | None = None,
    echo: Callable[[str], None] = print,
    overrides: dict | None = None,
    strict: bool = True,
    slots: int = 0,
) -> dict:
    """Measures every (point, rep) of the grid that `out` does not hold yet; returns counts.
    The Spark session has at least `slots` task slots (so that a session sized for several
    experiments is reused by each).
    A run that does not commit all its records fails the experiment (RunFailed)."""
    from nosync.spark.session import get_spark

    todo = plan(exp, quick, seed, overrides, strict)
    os.makedirs(table_dir(out, exp.name), exist_ok=True)
    left = [(p, r, s) for p, r, s in todo if not os.path.exists(_row_path(out, exp.name, point_id(p), r))]
    skipped = len(todo) - len(left)
    if skipped:
        echo(f"{exp.name}: {skipped} of {len(todo)} measurements already in {table_dir(out, exp.name)}, skipped")
    if not left:
        return {"measured": 0, "skipped": skipped, "total": len(todo)}
    env = environment(master)
    spark = get_spark(master, max([slots, *(exp.slots(p) for p, _, _ in left)]), app="nosync-experiment")
    # one unrecorded run first, so that the first point is measured warm as the others are
    echo(f"{exp.name}: a warm-up run (not recorded)")
    _warm_up(spark, left[0][0])
    t_start = time.monotonic()
    for i, (point, rep, s) in enumerate(left):
        pid = point_id(point)
        label = " ".join(f"{k}={v}" for k, v in point.items())
        _bar(echo, i, len(left), t_start, f"{exp.name}: {label} (rep {rep + 1})")
        t0 = time.monotonic()
        figures = _measure(exp, spark, point, s, f"{label} (rep {rep + 1})")
        row = {
            "experiment": exp.name,
            "point": pid,
            **point,
            "rep": rep,
            "seed": s,
            **figures,
            "grid": "quick" if quick else "full",
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "measure_s": round(time.monotonic() - t0, 3),
            **env,
        }
        _write_row(_row_path(out, exp.name, pid, rep), row)
    _bar(echo, len(left), len(left), t_start, f"{exp.name}: done")
    return {"measured": len(left), "skipped": skipped, "total": len(todo)}


def _measure(exp: Experiment, spark: Any, point: dict, seed: int, label: str) -> dict:
    scratch = tempfile.mkdtemp(prefix=f"nosync-exp-{exp.name}-")
    try:
        return exp.measure(spark, scratch, point, seed)
    except AssertionError as e:
        raise RunFailed(f"{label}: {e}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _warm_up(spark: Any, point: dict) -> None:
    """A short failure-free run of keyed_count with the point's mode and workers."""
    from experiments.measure import steady

    scratch = tempfile.mkdtemp(prefix="nosync-exp-warm-up-")
    try:
        records = min(int(point.get("records", 300_000)), 300_000)
        steady(spark, os.path.join(scratch, "run"), point.get("mode", "none"), point.get("workers", 2), records, 10_000)
    except AssertionError as e:
        raise RunFailed(f"warm-up: {e}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _bar(echo: Callable[[str], None], done: int, total: int, t0: float, what: str) -> None:
    width = 24
    filled = int(width * done / max(1, total))
    elapsed = time.monotonic() - t0
    eta = f", about {elapsed / done * (total - done):.0f} s left" if 0 < done < total else ""
    echo(f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {elapsed:.0f} s{eta}  {what}")


def stderr_echo(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
