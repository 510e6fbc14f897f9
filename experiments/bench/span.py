"""`nosync bench span`: a nosync recovery re-executed record by record, or by the span job.

keyed_count over K keys on W workers in mode nosync, with no snapshot before the end
(`--persist-ms` beyond the run), so the span a recovery re-executes is everything the lost
worker had read: the kill point sets its length. For each kill point (a fraction of the
records read), two runs in this command: one without a threshold (the lost worker re-executes
its steps one by one), one with `--replay-threshold-records 1` (the steps up to the last cut
go to a Spark job of W tasks, parallel over keys; the few after it one by one). Reported per
run: `restore_s` (failure to every worker processing again), the records of the span, and for
the span job its own time (`span_s`) and where it went (the span's frames gathered, the store
copied, the Spark job, the wait for it, the survivors' cover, the results loaded), and the
records re-executed after its cut.

The cuts a threshold makes workers log cost something in steady state: `steady` is a pair of
failure-free runs at the default `--persist-ms`, without a threshold and with
`--replay-threshold-records 1` (a cut every 64 steps, the most often), alternated `reps` times.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

NO_SNAPSHOT_MS = 3_600_000


def run(
    workers: int,
    keys: int,
    records: int,
    points: list[float],
    master: str | None = None,
    reps: int = 2,
    progress: Any = lambda m: None,
) -> dict:
    from experiments.measure import _run, recovery
    from nosync.spark.session import get_spark

    spark = get_spark(master, 2 * workers)  # the job's W tasks beside the W streaming ones
    out: dict[str, Any] = {"workload": "keyed_count", "workers": workers, "keys": keys, "records": records, "runs": []}
    work = tempfile.mkdtemp(prefix="nosync-bench-span-")
    try:
        for at in points:
            for way, threshold in (("records", None), ("span_job", 1)):
                progress(f"kill at {at:.0%} of the records read, recovery {way}")
                got = recovery(
                    spark,
                    os.path.join(work, f"{way}-{at}"),
                    "nosync",
                    workers,
                    keys,
                    records,
                    NO_SNAPSHOT_MS,
                    kill_after=at,
                    progress=progress,
                    options={"replay_threshold_records": threshold},
                    after_event=False,
                )
                out["runs"].append({"kill_at": at, "way": way, **got})
        out["steady"] = {"records": [], "span_job": []}
        for rep in range(reps):
            for way, threshold in (("records", None), ("span_job", 1)):
                progress(f"steady run {rep + 1} of {reps}, {way}")
                d = os.path.join(work, f"steady-{way}-{rep}")
                s = _run(
                    spark, d, "nosync", workers, records, keys, 0.0, 1, None, "disk", replay_threshold_records=threshold
                )
                out["steady"][way].append(s["records_per_s"])
                shutil.rmtree(d, ignore_errors=True)
        best = {k: max(v) for k, v in out["steady"].items()}
        out["steady"]["ratio"] = best["span_job"] / best["records"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def render(r: dict) -> str:
    head = (
        "kill_at",
        "way",
        "killed_at_read",
        "restore_s",
        "span_records",
        "span_s",
        "records_replayed",
        "records_per_s",
    )
    rows = [head]
    for x in r["runs"]:
        rows.append(
            (
                f"{x['kill_at']:.0%}",
                x["way"],
                f"{x.get('killed_at_read') or 0:,}",
                f"{x.get('restore_s') or 0:.2f}",
                f"{x.get('span_records') or 0:,}",
                f"{x.get('span_s') or 0:.2f}",
                f"{x.get('records_replayed') or 0:,}",
                f"{x.get('records_per_s') or 0:,.0f}",
            )
        )
    parts = ("gather_s", "copy_s", "job_s", "wait_s", "cover_s", "load_s")
    out = _table(rows)
    st = r.get("steady")
    if st:

        def runs(v: list) -> str:
            return ", ".join(f"{x:,.0f}" for x in v)

        out += (
            f"\n\nsteady state, records/s: no threshold {runs(st['records'])}; with cuts every 64 steps "
            f"{runs(st['span_job'])}; best against best {st['ratio']:.3f}"
        )
    jobs = [x for x in r["runs"] if x.get("span_parts")]
    if jobs:
        out += "\n\nspan job, where its time went (s)\n"
        out += _table(
            [("kill_at", *parts)]
            + [(f"{x['kill_at']:.0%}", *(f"{x['span_parts'].get(p, 0):.2f}" for p in parts)) for x in jobs]
        )
    return out


def _table(rows: list) -> str:
    w = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w[i]) for i, c in enumerate(row)) for row in rows)
