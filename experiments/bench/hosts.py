"""`nosync bench hosts`: the same run on one host and across the hosts of a cluster, in one
command.

keyed_count (generated records over K keys, a running count per key, committed to Parquet
files) runs at W workers under each mode, in two places taken in turn for `reps` rounds:

- `one host`: an embedded Spark (`local[W]`) on the driver's host, the workers' local roots
  on a tmpfs (`/dev/shm`), as a cluster host's private disk is;
- `across hosts`: on the cluster `nosync cluster up` made, one worker a host (its master
  spreads the application's W cores over its hosts), the workers' local roots on their hosts'
  tmpfs.

Everything else is the same: the pipeline and its data, the interval (abs's checkpoints,
nosync's persistence), the checkpoint tier, the shared tier (the cluster's S3 server) and
the sinks' output (there too). Each run is a `nosync run` of its own, so a Spark
application of its own, and its start-up is not counted: records/s is the run's, from its
first record read to its last committed. Each place keeps its best round per mode; the
figure is across hosts over one host, whose bar is 0.8 (what a bridge's small latency should
cost at most). A run shorter than 30 intervals is flagged (`steady`: False): its figure is
not of a steady state.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from experiments.measure import KEYED_COUNT

BAR = 0.8
"""Records/s across hosts over one host, at least."""
PLACES = ("one host", "across hosts")
TMPFS = "/dev/shm"
"""Where the one-host run keeps its workers' local roots: a tmpfs, as a cluster host's disk is."""
FIELDS = ("records_per_s", "latency_p50_ms", "latency_p99_ms", "processing_s", "bytes_persisted", "startup_s")


def run(
    cluster: Any,
    modes: list[str],
    workers: int,
    records: int,
    keys: int,
    reps: int = 2,
    interval_ms: int = 1000,
    tier: str = "remote",
    progress: Any = lambda m: None,
) -> dict:
    """The table of `nosync bench hosts` (module docstring) on `cluster` (`experiments.cluster`)."""
    from nosync import storage

    work = tempfile.mkdtemp(prefix="nosync-bench-hosts-")
    local = tempfile.mkdtemp(prefix="nosync-bench-hosts-", dir=TMPFS if os.path.isdir(TMPFS) else None)
    best: dict[str, dict[str, dict]] = {m: {} for m in modes}
    try:
        for rep in range(reps):
            for mode in modes:
                for place in PLACES:
                    progress(f"round {rep + 1}/{reps}: mode {mode}, {place}")
                    name = f"{mode}-{place.replace(' ', '-')}-{rep}"
                    run_dir = os.path.join(work, name)
                    options = ["--mode", mode, "--workers", str(workers), "--run-dir", run_dir]
                    options += ["--remote", cluster.remote, "--checkpoint-ms", str(interval_ms)]
                    options += ["--persist-ms", str(interval_ms)]
                    if mode in ("abs", "nosync"):
                        options += ["--checkpoint-tier", tier]
                    if place == "across hosts":
                        options += ["--master", cluster.master]
                    else:
                        options += ["--local-dir", local]
                    out = storage.join(cluster.remote, "bench-hosts", os.path.basename(work), name)
                    row = _run(run_dir, options, records, keys, out)
                    row["steady"] = row["processing_s"] * 1000 >= 30 * interval_ms
                    kept = best[mode].get(place)
                    if kept is None or row["records_per_s"] > kept["records_per_s"]:
                        best[mode][place] = row
                    storage.delete_tree(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(local, ignore_errors=True)
    result: dict[str, Any] = {
        "workload": "keyed_count",
        "workers": workers,
        "records": records,
        "keys": keys,
        "reps": reps,
        "interval_ms": interval_ms,
        "checkpoint_tier": tier,
        "hosts": len(cluster.hosts),
        "master": cluster.master,
        "modes": best,
    }
    for rows in best.values():
        one, across = rows.get("one host"), rows.get("across hosts")
        if one and across:
            across["ratio_to_one_host"] = across["records_per_s"] / one["records_per_s"]
            across["bar"] = f">= {BAR}"
            across["bar_ok"] = across["ratio_to_one_host"] >= BAR
    return result


def _run(run_dir: str, options: list[str], records: int, keys: int, out: str) -> dict:
    """One `nosync run` of keyed_count; its summary's figures, once every record is committed."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [sys.executable, "-m", "cli.main", "run", KEYED_COUNT, *options]
    cmd += ["-p", f"records={records}", "-p", f"keys={keys}", "-p", f"output={out}"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        from nosync.errors import RunFailed

        raise RunFailed(f"the run in {run_dir} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    with open(os.path.join(run_dir, "summary.json"), encoding="utf-8") as f:
        s = json.load(f)
    if s["records_committed"] != records:
        raise AssertionError(f"{run_dir}: {s['records_committed']} of {records} records committed")
    return {f: s.get(f) for f in FIELDS} | {"worker_hosts": s.get("worker_hosts")}


def render(r: dict) -> str:
    """The table: per mode, each place's figures and the ratio."""
    lines = []
    fields = [*FIELDS, "steady", "ratio_to_one_host", "bar_ok"]
    w = max(len(f) for f in fields) + 2
    for mode, rows in r["modes"].items():
        lines.append(f"{'mode ' + mode:<{w + 2}}" + "".join(f"{p:>16}" for p in PLACES))
        for f in fields:
            cells = []
            for p in PLACES:
                v = rows.get(p, {}).get(f)
                if v is None:
                    cells.append("-")
                elif isinstance(v, float):
                    cells.append(f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3f}")
                else:
                    cells.append(f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v))
            lines.append(f"  {f:<{w}}" + "".join(f"{c:>16}" for c in cells))
    return "\n".join(lines)
