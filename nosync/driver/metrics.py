"""Run metrics: a summary (JSON) and tables (Parquet) under the run directory.

- summary.json: mode, workers, records read and committed, throughput (first record read to
  last commit), start-up time, latency p50/p99/max (source ingest to sink commit, record
  weighted), per-operator records in/out and busy time, dead letters;
- throughput.parquet: the progress samples (time, records read, records committed);
- operators.parquet: one row per (worker, operator);
- whatever tables the mode adds (abs: checkpoints.parquet, one row per completed checkpoint,
  and checkpoint_instances.parquet, one row per instance and checkpoint: alignment time,
  records held, synchronous and asynchronous snapshot time, bytes).

Per recovery the summary has the detection time (last heartbeat to loss), the restore time
(loss to every worker running again), `back_to_90_s`: loss to the first progress sample
after which the read rate, over a 1 s window, is back to 90% of its mean over the 3 s before
the loss (None when the input ran out first), and `caught_up_s`: loss to every worker having
read again what it had read before the loss (progress.parquet: per worker, every 0.1 s).
"""

from __future__ import annotations

import json
import os
from typing import Any


def percentile(weighted: list[tuple[float, int]], q: float) -> float | None:
    """The q-quantile of values weighted by counts."""
    if not weighted:
        return None
    ordered = sorted(weighted)
    total = sum(n for _, n in ordered)
    target = q * total
    acc = 0
    for v, n in ordered:
        acc += n
        if acc >= target:
            return v
    return ordered[-1][0]


def summarize(run: dict, done: dict[int, dict]) -> dict:
    """The run's summary: `run` with records read and committed, dead letters, memory, latency
    percentiles and per-operator totals over the finished workers."""
    lat = [tuple(x) for d in done.values() for x in d["metrics"].get("latencies", [])]
    ops: dict[str, dict] = {}
    for d in done.values():
        for name, m in d["metrics"]["operators"].items():
            agg = ops.setdefault(name, {})
            for k, v in m.items():
                agg[k] = agg.get(k, 0) + v
    committed = sum(d["metrics"]["committed"] for d in done.values())
    read = sum(d["metrics"]["read"] for d in done.values())
    out = {
        **run,
        "records_read": read,
        "records_committed": committed,
        "dead_letters": sum(d["metrics"]["dead_letters"] for d in done.values()),
        "peak_rss_mb": sum(d["metrics"].get("peak_rss_mb", 0) for d in done.values()),
        "latency_p50_ms": _ms(percentile(lat, 0.5)),
        "latency_p99_ms": _ms(percentile(lat, 0.99)),
        "latency_max_ms": _ms(max((v for v, _ in lat), default=None)),
        "operators": ops,
    }
    return out


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000


def read_rate(points: list[tuple[float, int]], t0: float, t1: float) -> float | None:
    """Records read per second between the first and last of `points` (time, records read so
    far) inside [t0, t1]; None with fewer than two there."""
    inside = [(t, r) for t, r in points if t0 <= t <= t1]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def add_recovery_times(
    recoveries: list[dict], samples: list[dict], launched: float, per_worker: list[dict] | None = None
) -> None:
    """Adds `back_to_90_s` to each recovery, from the progress samples (t: seconds since
    `launched`, read: records read so far), and `caught_up_s` from the per-worker ones (t: wall
    time, worker, read): loss to the first sample in which every worker has read again at least
    what it had read in its last sample before the loss (None: the run ended first). A worker a
    mode did not set back (a survivor in nosync) is caught up throughout; one it did, the lost
    one or every one in a rollback, once it has redone its work."""
    _add_caught_up(recoveries, per_worker or [])
    pts = [(s["t"], s["read"]) for s in samples]
    for r in recoveries:
        lost = r["lost_at"] - launched
        before = read_rate(pts, lost - 3.0, lost)
        r["back_to_90_s"] = None
        if not before or "restored_at" not in r:
            continue
        start = r["restored_at"] - launched
        for t, _ in pts:
            if t < start:
                continue
            now = read_rate(pts, t, t + 1.0)
            if now is not None and now >= 0.9 * before:
                r["back_to_90_s"] = t - lost
                break


def _add_caught_up(recoveries: list[dict], rows: list[dict]) -> None:
    by_t: dict[float, dict[int, dict]] = {}
    for r in rows:
        by_t.setdefault(r["t"], {})[r["worker"]] = r
    times = sorted(by_t)
    for rec in recoveries:
        lost = rec["lost_at"]
        rec["caught_up_s"] = None
        # each worker's last report before the loss (the lost one's is also recorded at the loss)
        need = {w: r["read"] for t in times if t < lost for w, r in by_t[t].items()}
        if not need:
            continue
        start = max(lost, rec.get("restored_at", lost))
        for t in times:
            if t <= start:
                continue
            now = by_t[t]
            # the lost worker counts once its next attempt has a restored position of its own:
            # until then the samples keep the count its lost attempt had last reported
            again = now.get(rec["worker"], {})
            if again.get("attempt", 0) <= rec.get("attempt", 0) or not again.get("positioned", True):
                continue
            if all(now.get(w, {}).get("read", 0) >= n for w, n in need.items()):
                rec["caught_up_s"] = t - lost
                break


def write(run_dir: str, summary: dict, samples: list[dict], done: dict[int, dict], tables: dict | None = None) -> None:
    """Writes summary.json, throughput.parquet, operators.parquet and the mode's
    `tables` into `run_dir`."""
    import pyarrow as pa  # lazy: pyarrow costs ~0.3 s to import and only this path needs it
    import pyarrow.parquet as pq  # lazy: pyarrow costs ~0.3 s to import and only this path needs it

    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, sort_keys=True, default=str)
    if samples:
        pq.write_table(pa.Table.from_pylist(samples), os.path.join(run_dir, "throughput.parquet"))
    rows: list[dict[str, Any]] = []
    for w, d in sorted(done.items()):
        for name, m in d["metrics"]["operators"].items():
            rows.append({"worker": w, "operator": name, **{k: float(v) for k, v in m.items()}})
    if rows:
        pq.write_table(pa.Table.from_pylist(rows), os.path.join(run_dir, "operators.parquet"))
    for name, table in (tables or {}).items():
        if table:
            pq.write_table(pa.Table.from_pylist(table), os.path.join(run_dir, f"{name}.parquet"))
