"""`nosync bench throughput`: the keyed running count through the engine, against the bare loop.

The same command first measures the limit, `bare_loop_per_s`: the keyed running count as a
plain Python loop over a dict on one core, with the run's own record and key counts N and K.
`BARE_SCRIPT` runs in a fresh interpreter (`python -c`), its loop at module level (its
variables globals, as in a script): for i in range(N), the key `str(i % K)`, that key's count
read from the dict (`get`, 0 when absent), incremented and stored back, and one output
counted; nothing is written anywhere. Its figure is N divided by the loop's own wall time
(the interpreter's start-up excluded), best of three runs, before Spark starts. The same loop
inside a function (local variables, about twice as fast in CPython) is reported beside it as
`bare_loop_local_per_s`, with the engine's ratio to it: the stricter limit. Then it runs the
`keyed_count` workload (generator -> key_by -> aggregate -> committed Parquet files) and
reports `records_per_s` from the first record read to the last one committed, Spark start-up
excluded (`startup_s`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time

BAR = 0.22
HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(os.path.dirname(HERE), "workloads", "keyed_count.py")


BARE_SCRIPT = """
import sys, time
N, K = int(sys.argv[1]), int(sys.argv[2])
t = time.time(); state = {}; out = 0
for i in range(N):
    k = str(i % K); v = state.get(k, 0) + 1; state[k] = v; out += 1
dt = time.time() - t
print(N / dt)
"""


def bare_script(n: int, k: int) -> float:
    """Records per second of the bare loop as a script runs it (module level, fresh process)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", BARE_SCRIPT, str(n), str(k)], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip())


def bare_loop(n: int, k: int) -> float:
    """Records per second of the same loop inside a function (local variables)."""
    t = time.perf_counter()
    state: dict = {}
    out = 0
    for i in range(n):
        key = str(i % k)
        v = state.get(key, 0) + 1
        state[key] = v
        out += 1
    return n / (time.perf_counter() - t)


def run(
    mode: str,
    workers: int,
    records: int,
    keys: int,
    master: str | None = None,
    sink: str = "parquet",
    epoch_records: int | None = None,
    progress=lambda m: None,
) -> dict:
    from nosync.driver.runner import run as run_pipeline

    progress("limit: bare loop")
    bare = max(bare_script(records, keys) for _ in range(3))
    bare_local = max(bare_loop(records, keys) for _ in range(3))
    work = tempfile.mkdtemp(prefix="nosync-bench-tp-")
    try:
        out = "none" if sink == "null" else os.path.join(work, "out")
        progress(f"engine: keyed_count, mode {mode}, {workers} workers")
        result = run_pipeline(
            WORKLOAD,
            mode=mode,
            workers=workers,
            master=master,
            run_dir=os.path.join(work, "run"),
            epoch_records=epoch_records,
            params={"records": str(records), "keys": str(keys), "output": out},
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    s = result.summary
    assert s["records_committed"] == records, f"{s['records_committed']} of {records} records committed"
    r = {
        "workload": "keyed_count",
        "mode": mode,
        "workers": workers,
        "records": records,
        "keys": keys,
        "sink": sink,
        "records_per_s": s["records_per_s"],
        "processing_s": s["processing_s"],
        "startup_s": s["startup_s"],
        "latency_p50_ms": s["latency_p50_ms"],
        "latency_p99_ms": s["latency_p99_ms"],
        "peak_rss_mb": s["peak_rss_mb"],
        "bare_loop_per_s": bare,
        "ratio_to_bare": s["records_per_s"] / bare,
        "bare_loop_local_per_s": bare_local,
        "ratio_to_bare_local": s["records_per_s"] / bare_local,
        "ratio_bar": f">= {BAR}",
    }
    r["ratio_ok"] = r["ratio_to_bare"] >= BAR
    return r


def render(r: dict) -> str:
    rows = [
        ("bare loop (limit)", f"{r['bare_loop_per_s']:,.0f} records/s"),
        (f"engine, mode {r['mode']}, {r['workers']} workers", f"{r['records_per_s']:,.0f} records/s"),
        ("ratio to bare", f"{r['ratio_to_bare']:.3f} (bar {r['ratio_bar']}) {'ok' if r['ratio_ok'] else 'BELOW BAR'}"),
        (
            "bare loop in a function",
            f"{r['bare_loop_local_per_s']:,.0f} records/s (ratio {r['ratio_to_bare_local']:.3f})",
        ),
        ("start-up (excluded)", f"{r['startup_s']:.1f} s"),
        ("latency p50 / p99", f"{r['latency_p50_ms']:,.0f} / {r['latency_p99_ms']:,.0f} ms"),
        ("peak RSS (workers)", f"{r['peak_rss_mb']:,.0f} MB"),
    ]
    w = max(len(a) for a, _ in rows)
    return "\n".join(f"{a:<{w}}  {b}" for a, b in rows)
