"""Run metrics: a summary (JSON) and tables (Parquet) under the run directory.

- summary.json: mode, workers, records read and committed, throughput (first record read to
  last commit), start-up time, latency p50/p99/p99.9/max (source ingest to sink commit, record
  weighted; the quantiles from the workers' merged histograms, to within 0.4%, the max exact:
  `nosync.runtime.histogram`), per-operator records in/out and busy time, dead letters;
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
from collections import deque
from collections.abc import Iterable
from typing import Any

from nosync.driver.rows import RowLog, to_parquet
from nosync.runtime.histogram import Histogram


def summarize(run: dict, done: dict[int, dict]) -> dict:
    """The run's summary: `run` with records read and committed, dead letters, memory, latency
    percentiles and per-operator totals over the finished workers."""
    lat = Histogram()
    for d in done.values():
        wire = d["metrics"].get("latency")
        if wire is not None:
            lat.merge(Histogram.from_wire(wire))
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
        "latency_p50_ms": _ms(lat.quantile(0.5)),
        "latency_p99_ms": _ms(lat.quantile(0.99)),
        "latency_p999_ms": _ms(lat.quantile(0.999)),
        "latency_max_ms": _ms(lat.max),
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
    recoveries: list[dict], samples: Iterable[dict], launched: float, per_worker: Iterable[dict] | None = None
) -> None:
    """Adds `back_to_90_s` to each recovery, from the progress samples (t: seconds since
    `launched`, read: records read so far), and `caught_up_s` from the per-worker ones (t: wall
    time, worker, read): loss to the first sample in which every worker has read again at least
    what it had read in its last sample before the loss (None: the run ended first). A worker a
    mode did not set back (a survivor in nosync) is caught up throughout; one it did, the lost
    one or every one in a rollback, once it has redone its work.

    Both series come in time order and are read once, a row at a time (a `rows.RowLog` reads
    its file): what is held is a few seconds of samples around each loss, whatever the run's
    length."""
    _add_caught_up(recoveries, per_worker or ())
    pending = [_BackTo90(r, launched) for r in recoveries]
    for s in samples:
        pending = [b for b in pending if not b.feed(s["t"], s["read"])]
        if not pending:
            return
    for b in pending:
        b.finish()


class _BackTo90:
    """One recovery's `back_to_90_s`, fed the samples in time order: the first and last sample
    of the 3 s before the loss (`read_rate` needs no more), then from the restore the samples
    of the 1 s window after each, until one window's rate is back to 90%."""

    def __init__(self, rec: dict, launched: float) -> None:
        self.rec = rec
        rec["back_to_90_s"] = None
        self.lost = rec["lost_at"] - launched
        self.start = rec["restored_at"] - launched if "restored_at" in rec else None
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None
        self.before: float | None = None
        self.known = False
        """Whether a sample after the loss came: `before` is final."""
        self.window: deque[tuple[float, int]] = deque()

    def feed(self, t: float, read: int) -> bool:
        """Takes the next sample; True once the recovery's time is found or cannot be."""
        if self.start is None:
            return True
        if self.lost - 3.0 <= t <= self.lost:
            self.first = self.first or (t, read)
            self.last = (t, read)
        elif t > self.lost and not self.known and self._know():
            return True
        if t >= self.start:
            self.window.append((t, read))
        return self.known and self._judge(complete_only=True)

    def finish(self) -> None:
        """The samples ended: judges the windows left with what they hold."""
        if self.start is not None and (self.known or not self._know()):
            self._judge(complete_only=False)

    def _know(self) -> bool:
        """Fixes `before`; True when there is none (no rate to get back to)."""
        self.known = True
        if self.first and self.last and self.last[0] > self.first[0]:
            self.before = (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])
        return not self.before

    def _judge(self, complete_only: bool) -> bool:
        w = self.window
        assert self.before is not None
        while w and (not complete_only or w[-1][0] > w[0][0] + 1.0):
            t0 = w[0][0]
            inside = [p for p in w if p[0] <= t0 + 1.0]
            if len(inside) >= 2 and inside[-1][0] > t0:
                rate = (inside[-1][1] - inside[0][1]) / (inside[-1][0] - t0)
                if rate >= 0.9 * self.before:
                    self.rec["back_to_90_s"] = t0 - self.lost
                    return True
            w.popleft()
        return False


def _add_caught_up(recoveries: list[dict], rows: Iterable[dict]) -> None:
    # one pass over the rows, a time's rows at a time (they come grouped and in time order)
    pending = [_CaughtUp(r) for r in recoveries]
    t = float("nan")  # equal to no time: the first row starts a group
    group: dict[int, dict] = {}
    for r in rows:
        if r["t"] != t:
            if group:
                pending = [c for c in pending if not c.feed(t, group)]
            t, group = r["t"], {}
        group[r["worker"]] = r
        if not pending:
            return
    if group:
        for c in pending:
            c.feed(t, group)


class _CaughtUp:
    """One recovery's `caught_up_s`, fed each time's per-worker rows in time order."""

    def __init__(self, rec: dict) -> None:
        self.rec = rec
        rec["caught_up_s"] = None
        self.lost = rec["lost_at"]
        self.start = max(self.lost, rec.get("restored_at", self.lost))
        self.need: dict[int, int] = {}
        """Each worker's last report before the loss (the lost one's is also recorded at the loss)."""

    def feed(self, t: float, now: dict[int, dict]) -> bool:
        """Takes the rows of time `t`; True once the time is found or cannot be."""
        if t < self.lost:
            self.need.update((w, r["read"]) for w, r in now.items())
            return False
        if t <= self.start:
            return False
        if not self.need:
            return True
        rec = self.rec
        # the lost worker counts once its next attempt has a restored position of its own:
        # until then the samples keep the count its lost attempt had last reported
        again = now.get(rec["worker"], {})
        if again.get("attempt", 0) <= rec.get("attempt", 0) or not again.get("positioned", True):
            return False
        if all(now.get(w, {}).get("read", 0) >= n for w, n in self.need.items()):
            rec["caught_up_s"] = t - self.lost
            return True
        return False


def write(
    run_dir: str, summary: dict, samples: Iterable[dict], done: dict[int, dict], tables: dict | None = None
) -> None:
    """Writes summary.json, throughput.parquet (`samples`), operators.parquet and the mode's
    `tables` into `run_dir`. A series (samples or table) may be a list or a `rows.RowLog`,
    written a row group at a time; a RowLog's file goes once its table is written."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1, sort_keys=True, default=str)
    rows: list[dict[str, Any]] = []
    for w, d in sorted(done.items()):
        for name, m in d["metrics"]["operators"].items():
            rows.append({"worker": w, "operator": name, **{k: float(v) for k, v in m.items()}})
    for name, table in {"throughput": samples, "operators": rows, **(tables or {})}.items():
        to_parquet(table, os.path.join(run_dir, f"{name}.parquet"))
        if isinstance(table, RowLog):
            table.remove()
