"""`nosync bench span`: a nosync recovery re-executed record by record, or by the span job.

keyed_count over K keys on W workers in mode nosync, with no snapshot before the end
(`--persist-ms` beyond the run), so the span a recovery re-executes is everything the lost
worker had read: the kill point sets its length. For each kill point (a fraction of the
records read), two runs in this command: one without a threshold (the lost worker re-executes
its steps one by one), one with `--replay-threshold-records 1` (the steps up to the last cut
go to a Spark job of W tasks, parallel over keys; the few after it one by one). Reported per
run: `restore_s` (failure to every worker processing again), the records of the span, and for
the span job its own time (`span_s`: the frames collected, the store copied, the job, its
state loaded) and the records re-executed after its cut.
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
    progress: Any = lambda m: None,
) -> dict:
    from experiments.measure import recovery
    from nosync.spark_host import get_spark

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
    w = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w[i]) for i, c in enumerate(row)) for row in rows)
