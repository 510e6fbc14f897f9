"""Measured runs of `keyed_count` for the benchmarks and experiments.

A run goes through `nosync.driver.runner.run`, the code of `nosync run`, on a Spark session the caller
owns (so that a grid of runs pays Spark's start-up once). Every run must commit all its records,
or it raises: a figure from a run that lost records would mean nothing.

- `steady`: a failure-free run; its summary's figures.
- `recovery`: a run whose last worker gets SIGKILL once half the records are read and the mode
  has something to recover from; optionally at a chosen phase of the checkpoint (or
  persistence) interval. Its figures come from the recovery row that kill caused
  (`caused_by`); a run whose kill did not come, or caused no recovery, says so.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from typing import Any

from experiments.chaos import Progress, restores_to
from experiments.failures import lose_machines
from lsm.files import tree_bytes

HERE = os.path.dirname(os.path.abspath(__file__))
KEYED_COUNT = os.path.join(HERE, "workloads", "keyed_count.py")

STEADY_FIELDS = (
    "records_per_s",
    "latency_p50_ms",
    "latency_p99_ms",
    "stall_ms_max",
    "checkpoint_ms_p50",
    "checkpoint_ms_p99",
    "checkpoint_bytes",
    "bytes_persisted",
    "checkpoints_completed",
    "snapshots",
    "processing_s",
    "peak_rss_mb",
    "persist_share",
    "interval_ms_mean",
    "interval_ms_max",
    "recovery_span_ms_max",
    "recovery_span_records_max",
    "backedge_log_bytes",
    "backedge_log_bytes_max",
    "output_log_peak_bytes",
    "residue_bytes",
)


def backlog(samples: list[tuple[float, int]], t0: float, rate: float) -> list[tuple[float, float]]:
    """(wall time, backlog) of a paced run from its (wall time, records read) samples: the
    records due by then at `rate` records/s in all from `t0`, minus the records read."""
    return [(t, rate * (t - t0) - read) for t, read in samples]


def drained_after(samples: list[tuple[float, int]], t0: float, rate: float, kill_at: float) -> float | None:
    """Seconds from `kill_at` until the backlog (`backlog`) is back within a tenth of a second of
    input of its mean over the second before the kill, having grown past that since; 0.0 if it
    never grew past it, None if it never came back."""
    points = backlog(samples, t0, rate)
    before = [b for t, b in points if kill_at - 1.0 <= t <= kill_at]
    if not before:
        return None
    level = max(0.0, sum(before) / len(before)) + 0.1 * rate
    grew = False
    for t, b in points:
        if t <= kill_at:
            continue
        over = b > level
        if over:
            grew = True
        elif grew:
            return t - kill_at
    return None if grew else 0.0


def _params(d: str, records: int, keys: int, skew: float, seed: int) -> dict:
    return {"records": str(records), "keys": str(keys), "skew": str(skew), "seed": str(seed)}


def _interval_options(mode: str, interval_ms: int | None, tier: str) -> dict:
    """The interval of abs checkpoints or of nosync snapshots, and the tier both write to. The
    modes are compared at the same interval: nosync's is not stretched past it (a run's own
    `max_persist_ms` stretches it, as the budget experiment does)."""
    opts: dict[str, Any] = {"checkpoint_tier": tier}
    if interval_ms is not None:
        if mode == "nosync":
            opts["persist_ms"] = opts["max_persist_ms"] = interval_ms
        else:
            opts["checkpoint_ms"] = interval_ms
    return opts


def _run(
    spark: Any,
    d: str,
    mode: str,
    workers: int,
    records: int,
    keys: int,
    skew: float,
    seed: int,
    interval_ms: int | None,
    tier: str,
    workload: tuple[str, dict, int] | None = None,
    **extra: Any,
) -> dict:
    """keyed_count (or `workload`: a pipeline file, its parameters and the records it must
    commit) through `nosync run`'s code; its summary, once every record was committed."""
    from nosync.driver.runner import run as run_pipeline

    path, params, expect = workload or (KEYED_COUNT, _params(d, records, keys, skew, seed), records)
    paced = extra.pop("paced", None)
    if paced is not None:
        # open loop at a fixed rate, unbounded, stopped after its duration: all it read is committed
        params = {**params, "records": "none", "rate": paced["rate"], "value_bytes": paced["value_bytes"]}
        extra["duration"] = paced["duration"]
        expect = None
    result = run_pipeline(
        path,
        mode=mode,
        workers=workers,
        spark=spark,
        run_dir=d,
        params={**params, "output": os.path.join(d, "out")},
        **{**_interval_options(mode, interval_ms, tier), **extra},
    )
    s = result.summary
    if s["records_committed"] != (s["records_read"] if expect is None else expect):
        want = s["records_read"] if expect is None else expect
        raise AssertionError(f"mode {mode}: {s['records_committed']} of {want} records committed")
    return s


def steady(
    spark: Any,
    d: str,
    mode: str,
    workers: int,
    records: int,
    keys: int,
    skew: float = 0.0,
    interval_ms: int | None = None,
    tier: str = "disk",
    slow_ms: int = 0,
    seed: int = 1,
    keep: bool = False,
    options: dict | None = None,
    workload: tuple[str, dict, int] | None = None,
) -> dict:
    """A failure-free run in run directory `d` (`options` go to the run; `workload` as `_run`
    takes it); removed after unless `keep`."""
    try:
        slow = (0, slow_ms) if slow_ms else None
        s = _run(
            spark,
            d,
            mode,
            workers,
            records,
            keys,
            skew,
            seed,
            interval_ms,
            tier,
            workload,
            slow_worker=slow,
            **(options or {}),
        )
        row = {f: s.get(f) for f in STEADY_FIELDS}
        if mode in ("none", "replay"):
            row["stall_ms_max"] = 0.0  # nothing of theirs ever holds an operator back
            row["checkpoint_bytes"] = row["bytes_persisted"] = 0
        row["stall_ms_by_operator"] = stall_by_operator(d, mode, s)
        return row
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


def stall_by_operator(d: str, mode: str, summary: dict) -> dict:
    """The longest stall of each operator: in abs, its longest barrier alignment (from
    checkpoint_instances.parquet); in nosync, its worker's persistence backpressure, which
    holds every operator of that worker at once (the operators of a worker step together)."""
    ops = sorted(summary.get("operators", {}))
    if mode == "abs":
        path = os.path.join(d, "checkpoint_instances.parquet")
        if not os.path.exists(path):
            return {op: 0.0 for op in ops}
        import pyarrow.parquet as pq

        rows = pq.read_table(path, columns=["operator", "align_ms"]).to_pylist()
        out = {op: 0.0 for op in ops}
        for r in rows:
            out[r["operator"]] = max(out.get(r["operator"], 0.0), float(r["align_ms"] or 0.0))
        return out
    if mode == "nosync":
        return {op: float(summary.get("stall_ms_max") or 0.0) for op in ops}
    return {op: 0.0 for op in ops}


def recovery(
    spark: Any,
    d: str,
    mode: str,
    workers: int,
    keys: int,
    records: int,
    interval_ms: int | None = None,
    tier: str = "disk",
    phase: float | None = None,
    seed: int = 1,
    kill_after: float = 0.5,
    keep: bool = False,
    missed_ok: bool = False,
    progress: Any = lambda m: None,
    options: dict | None = None,
    after_event: bool = True,
    workload: tuple[str, dict, int] | None = None,
    failure: str = "process",
    paced: dict | None = None,
) -> dict:
    """A run in which worker W-1 is killed (with `failure` "machine", its local root is lost
    too: `experiments.failures`; with "hang", it is stopped with SIGSTOP and never resumed, and
    the result's `failure_to_90_s` counts from the stop, detection included) once `kill_after`
    of the records are read (half, by
    default), once it has state to restore (`Progress.restorable`: a completed checkpoint, a
    durable snapshot of its own under nosync; not waited for without `after_event`). `options`
    go to the run. With `phase` in [0, 1), the kill waits for the next event that gave it such
    state after that point and comes `phase` x the interval after it: the kill moved across
    the interval. The figures are those of the recovery the kill caused (`caused_by`); the
    run's other recoveries are counted (`other_recoveries`), not measured. A run whose input
    ends before the kill (or whose kill caused no recovery) raises, or with `missed_ok`
    returns `kill_missed`. No kill comes once the run is over.

    With `paced` ({rate, value_bytes, duration, kill_at_read}), keyed_count reads at `rate`
    records/s per partition, unbounded, for `duration` seconds, and the kill comes once
    `kill_at_read` records were read; the result adds `drained_s`, from the kill to the backlog
    (records due minus records read) back within a tenth of a second of input of its level in the
    interval before the kill, and the run directory's bytes at the kill."""

    victim = workers - 1
    events = Progress(os.path.join(d, "events.jsonl"))
    killed: dict = {}
    state: dict = {"read": 0}
    gap_s = (interval_ms or 1000) / 1000.0
    # Invariant: no kill once the run is over. Spark reuses its Python worker processes, so
    # the victim's pid may run a worker of the next run, which a late kill would make recover.
    # `lock` orders a kill (timer thread) against the progress callback and the run's end.
    lock = threading.RLock()
    timers: list[threading.Timer] = []

    def kill() -> None:
        with lock:
            if killed or state.get("ended"):
                return
            events.poll()
            pid = events.pid_of(victim)
            if pid is None or events.over:
                return
            now = time.time()  # before the signal: the loss it causes comes after it
            try:
                os.kill(pid, signal.SIGSTOP if failure == "hang" else signal.SIGKILL)
            except ProcessLookupError:
                return  # the run had ended: it reports no recovery
            killed["pid"] = pid
            if paced:
                killed["dir_bytes"] = tree_bytes(d)
            if failure == "machine":
                lose_machines(d, [victim])
            killed.update(at_read=state["read"], at=now, at_s=state.get("t", 0.0) + now - state.get("wall", now))
        progress(f"mode {mode}: killed worker {victim} at {state['read']:,} records read")

    samples: list[tuple[float, int]] = []
    kill_at_read = paced["kill_at_read"] if paced else records * kill_after

    def watch(p: dict) -> None:
        with lock:
            state.update(read=p["read"], t=p.get("t", 0.0), wall=time.time())
            samples.append((state["wall"], p["read"]))
            if killed or "armed" in state or p["read"] < kill_at_read:
                return
            events.poll()
            if after_event and not events.restorable(mode, [victim]):
                return
            if phase is None:
                kill()
                return
            # the first progress event from now on starts the interval the kill falls in
            since = state.setdefault("since", len(events.seen))
            ev = [e for e in events.seen[since:] if restores_to(mode, e, victim)]
            if ev:
                state["armed"] = ev[0]["t"]
                delay = max(0.0, ev[0]["t"] + phase * gap_s - time.time())
                timers.append(threading.Timer(delay, kill))
                timers[-1].start()

    try:
        try:
            s = _run(
                spark,
                d,
                mode,
                workers,
                records,
                keys,
                0.0,
                seed,
                interval_ms,
                tier,
                workload,
                progress=watch,
                paced=paced,
                **(options or {}),
            )
        finally:
            with lock:
                state["ended"] = True
            for t in timers:
                t.cancel()
        r, others = caused_by(s.get("recoveries") or [], victim, killed.get("at"))
        if r is None and missed_ok:
            # the kill did not come (the input ended first), or came after the victim's work
            # was done: no recovery of it to measure; said, not hidden
            return {
                "kill_missed": True,
                "killed_at_read": killed.get("at_read"),
                "other_recoveries": others,
                "records_per_s": s["records_per_s"],
            }
        if r is None:
            what = "the run ended before the kill" if not killed else "the kill caused no recovery of the worker"
            raise AssertionError(f"mode {mode}: {what} ({others} other recoveries)")
        back = r.get("back_to_90_s")
        steady_regime = {}
        if paced:
            rate = paced["rate"] * workers
            steady_regime = {
                "drained_s": drained_after(samples, s["source_t0"], rate, killed["at"]),
                "run_dir_bytes_at_kill": killed.get("dir_bytes"),
                "records_read": s["records_read"],
                "latency_p50_ms": s.get("latency_p50_ms"),
                "latency_p999_ms": s.get("latency_p999_ms"),
            }
        return {
            **steady_regime,
            # from the failure itself: for a hang, the silence before the loss counts too
            "failure_to_90_s": None if back is None else r["lost_at"] - killed["at"] + back,
            "suspected_after_s": r["lost_at"] - killed["at"],
            "recovery_s": r.get("back_to_90_s"),
            "caught_up_s": r.get("caught_up_s"),
            "restore_s": r.get("restore_s"),
            "detection_s": r.get("detection_s"),
            "records_reprocessed": r.get("records_reprocessed"),
            "frames_replayed": r.get("frames_replayed"),
            "restored_from": (r.get("restored_from") or {}).get(str(victim)) or "-",
            "kill_missed": False,
            "other_recoveries": others,
            "killed_at_read": killed.get("at_read"),
            "killed_at_s": killed.get("at_s"),
            # how long after the progress event the kill came (the phase, as it happened)
            "killed_after_s": killed["at"] - state["armed"] if phase is not None else None,
            "checkpoint_restored": r.get("checkpoint"),
            "epoch_restored": r.get("epoch"),
            "batch_s": r.get("batch_s"),
            "replay_restore_s": r.get("replay_restore_s"),
            # nosync: the keyed state's load in the worker's spare time, the keys read alone
            # meanwhile, and how long the first of them waited for the index of the runs
            "load_s": r.get("load_s"),
            "keys_read_alone": r.get("keys_read_alone"),
            "load_wait_s": r.get("load_wait_s"),
            "records_replayed": r.get("records_replayed"),
            "span_records": r.get("span_records"),
            "span_steps": r.get("span_steps"),
            "span_s": r.get("span_s"),
            "span_reason": r.get("span_reason"),
            "span_parts": r.get("span_parts"),
            "records_per_s": s["records_per_s"],
            "processing_s": s.get("processing_s"),
            "latency_p99_ms": s.get("latency_p99_ms"),
            "stall_ms_max": 0.0 if mode == "replay" else s.get("stall_ms_max"),
            # nosync: the snapshot interval the budget set, and the longest span a loss would replay
            "interval_ms_mean": s.get("interval_ms_mean"),
            "interval_ms_max": s.get("interval_ms_max"),
            "recovery_span_records_max": s.get("recovery_span_records_max"),
            # both modes: the share of the workers' time persistence took (equal terms)
            "persist_share": s.get("persist_share"),
        }
    finally:
        if failure == "hang" and "pid" in killed:
            try:
                os.kill(killed["pid"], signal.SIGKILL)  # one Spark did not kill: not left behind
            except ProcessLookupError:
                pass
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


def caused_by(recoveries: list[dict], victim: int, killed_at: float | None) -> tuple[dict | None, int]:
    """The recovery row a kill of worker `victim` at `killed_at` (None: no kill) caused: the
    first loss of that worker at or after it. With the number of the run's other recovery rows
    (a worker suspected for another reason), which a caller reports rather than measures."""
    mine = None
    if killed_at is not None:
        mine = next((r for r in recoveries if r.get("worker") == victim and r["lost_at"] >= killed_at), None)
    return mine, len(recoveries) - (mine is not None)
