"""What a run directory holds, for `nosync inspect`: the pipeline and mode, epochs and safe
points, checkpoints (abs), durable points and storage per tier (nosync), recoveries and what
each cost. Everything is read from the files a run leaves; nothing is changed (a store is
opened from a copy: opening one writes to its files)."""

from __future__ import annotations

import collections
import fcntl
import json
import os
from typing import Any

import lsm
from lsm.files import copy_store, scratch_near, tree_bytes
from lsm.manifest import read_manifest
from lsm.store import DEFAULT_REMOTE
from nosync import storage
from nosync.errors import NosyncError
from nosync.spark.batch import epoch_records_of
from nosync.state import checkpoints as checkpoint_files
from nosync.state.stores import read_store
from nosync.tools.starts import SnapshotLogs, iter_usable_checkpoints
from nosync.tools.stores import local_base, local_stores, run_places, shared_stores

TIERS = ("log", "disk", "remote")
"""The directories of an `lsm` store: the local log, the LevelDB disk tier, the remote tier."""


def _json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _parquet(path: str) -> list[dict]:
    import pyarrow.parquet as pq  # lazy: pyarrow costs ~0.3 s to import and only this path needs it

    return pq.read_table(path).to_pylist() if os.path.exists(path) else []


def _stores(run_dir: str, run: dict) -> list[dict]:
    """Every `lsm` store of the run: worker, name, bytes per tier; from its local roots when
    they are on this host, else from its shared tier (remote bytes only)."""
    base = local_base(run_dir, run)
    if base is not None:
        out = []
        for w, name, path in local_stores(base):
            row = {"worker": w, "store": name, "path": path}
            row.update({f"{t}_bytes": tree_bytes(os.path.join(path, t)) for t in TIERS})
            try:
                remote = read_manifest(path).remote
            except lsm.LsmError:
                remote = DEFAULT_REMOTE  # opening its copy below says what is wrong with it
            if remote != DEFAULT_REMOTE:
                # a store whose remote tier is outside the worker's local root
                row["remote_bytes"] += storage.tree_bytes(remote)
            out.append(row)
        return out
    return [
        {"worker": w, "store": name, "path": storage.redact(uri), "log_bytes": 0, "disk_bytes": 0}
        | {"remote_bytes": storage.tree_bytes(uri), "shared": True}
        for w, name, uri in shared_stores(run_dir, run)
    ]


def _in_use(path: str) -> bool:
    """Whether a process (a live run) holds the lock of the store at `path`. The lock is
    taken and let go at once when it is free; nothing is written."""
    try:
        fd = os.open(os.path.join(path, "LOCK"), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # lets the lock go
    return False


def _durable(path: str, original: str) -> dict:
    """The seqs a store (a copy at `path` of the run's store at `original`) holds and has made
    durable per tier; an error names the run's store, not the copy."""
    try:
        s = read_store(path)
    except lsm.LsmError as e:
        return {"error": str(e).replace(path, original)}
    try:
        return {"last_seq": s.last_seq, "disk": s.durable("disk"), "remote": s.durable("remote")}
    finally:
        s.close()


def _first_cut_epoch(state_dir: str, run: dict) -> int | None:
    """The first epoch `rewind` can start from a consistent cut of a nosync run's retained
    snapshots, from copies of its stores under `state_dir` (None: none, or a store is
    missing or unreadable)."""
    per_epoch = epoch_records_of(run)
    logs = SnapshotLogs(state_dir, int(run.get("workers") or 0), per_epoch)
    if logs.missing() is not None:
        return None
    try:
        with logs:
            return logs.first_epoch()
    except lsm.LsmError:
        return None


def inspect_run(run_dir: str, open_stores: bool = True) -> dict:
    """Everything `nosync inspect` shows, as a dict."""
    meta_path = os.path.join(run_dir, "run.json")
    if not os.path.isfile(meta_path):
        raise NosyncError(f"{run_dir} is not a run directory: it has no run.json")
    run = _json(meta_path)
    summary_path = os.path.join(run_dir, "summary.json")
    summary = _json(summary_path) if os.path.isfile(summary_path) else None
    events: list[dict] = []
    ev_path = os.path.join(run_dir, "events.jsonl")
    if os.path.isfile(ev_path):
        with open(ev_path, encoding="utf-8") as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue  # a line torn by a killed driver
    counts = collections.Counter(e.get("event") for e in events)
    info: dict[str, Any] = {
        "run_dir": run_dir,
        "pipeline": run.get("pipeline"),
        "pipeline_file": run.get("pipeline_file"),
        "params": run.get("params", {}),
        "mode": run.get("mode"),
        "workers": run.get("workers"),
        "finished": summary is not None,
        "events": dict(counts),
    }
    places = run_places(run_dir, run)
    info["places"] = {
        "master": run.get("master") or (summary or {}).get("master"),
        "shared": storage.redact(places.shared),
        "local": places.local if local_base(run_dir, run) is not None else "on the workers' hosts",
        "worker_hosts": (summary or {}).get("worker_hosts"),
    }
    if summary is not None:
        info["records_read"] = summary.get("records_read")
        info["records_committed"] = summary.get("records_committed")
        info["records_per_s"] = summary.get("records_per_s")
        info["latency_p99_ms"] = summary.get("latency_p99_ms")
    safe = _parquet(os.path.join(run_dir, "safe_points.parquet"))
    safe_events = [e["epoch"] for e in events if e.get("event") == "safe_point"]
    if safe or safe_events:
        epochs = [r["safe_point"] for r in safe] or safe_events
        info["safe_points"] = {"count": len(epochs), "last": max(epochs)}
    checkpoints = _parquet(os.path.join(run_dir, "checkpoints.parquet"))
    completed = [e for e in events if e.get("event") == "checkpoint_completed"]
    if checkpoints or completed:
        ids = [e["checkpoint"] for e in completed]
        shared = run_places(run_dir, run).shared
        on_disk = [n for n in storage.listdir(checkpoint_files.directory(shared)) if n.startswith("chk-")]
        info["checkpoints"] = {
            "completed": len(completed),
            "last": max(ids) if ids else None,
            "aborted": counts.get("checkpoint_aborted", 0),
            "files": len(on_disk),
            "bytes": sum(e.get("bytes", 0) for e in completed),
            "duration_ms_mean": (sum(e.get("duration_ms", 0.0) for e in completed) / len(completed))
            if completed
            else None,
        }
        if on_disk and not run.get("epoch_ms"):
            # the first epoch `rewind` can start from a retained checkpoint (if its stores
            # still hold that checkpoint's versions: they keep the last abs.RETENTION)
            per_epoch = epoch_records_of(run)
            try:
                firsts = [first for *_, first in iter_usable_checkpoints(shared, run.get("pipeline"), per_epoch)]
            except NosyncError:
                firsts = []  # checkpoints of another pipeline: none to start from
            info["checkpoints"]["rewind_from_epoch"] = min(firsts, default=None)
    stores = _stores(run_dir, run)
    if open_stores:
        uris = {(w, n): u for w, n, u in shared_stores(run_dir, run)} if any(s.get("shared") for s in stores) else {}
        with scratch_near(run_dir, "nosync-inspect-") as copies:
            busy = False
            for s in stores:
                copy = os.path.join(copies, f"w{s['worker']}", s["store"])
                if s.get("shared"):
                    # rebuilt from its remote tier: an empty directory opened with it
                    try:
                        lsm.Store(copy, remote=uris[(s["worker"], s["store"])], budget=0, uploads=False).close()
                    except (OSError, lsm.LsmError) as e:
                        s["error"] = storage.redact(f"cannot be read from the shared tier: {e}")
                        continue
                else:
                    if _in_use(s["path"]):
                        s["in_use"] = busy = True
                        continue
                    try:
                        copy_store(s["path"], copy)
                    except OSError as e:
                        s["error"] = f"cannot be copied to be read: {e}"
                        continue
                s.update(_durable(copy, s["path"]))
            if run.get("mode") == "nosync" and not run.get("epoch_ms"):
                first = None if busy else _first_cut_epoch(copies, run)
                info["snapshots"] = {"rewind_from_epoch": first}
    info["stores"] = stores
    info["storage_bytes"] = {t: sum(s[f"{t}_bytes"] for s in stores) for t in TIERS}
    if (summary or {}).get("durable_seqs"):
        # per level, what each worker had made durable when it finished, and the longest an
        # append waited to reach each level (the replicated level lives only in memory: the
        # summary is where it is told)
        info["levels"] = {
            "durable_seqs": summary["durable_seqs"],
            "lag_ms_max": summary.get("level_lag_ms_max") or {},
            "gap_ms_max": summary.get("level_gap_ms_max") or {},
            "replicas": summary.get("replicas", 0),
            "replica_holder_losses": summary.get("replica_holder_losses", 0),
            "replica_holders_over_budget": summary.get("replica_holders_over_budget") or {},
        }
    recoveries = (summary or {}).get("recoveries") or []
    info["recoveries"] = [
        {
            k: r.get(k)
            for k in (
                "worker",
                "reason",
                "detection_s",
                "restore_s",
                "back_to_90_s",
                "caught_up_s",
                "records_reprocessed",
                "steps_replayed",
                "restored_step",
                "restored_from",
                "checkpoint",
                "span_steps",
                "span_records",
                "span_s",
                "span_reason",
            )
            if r.get(k) is not None
        }
        for r in recoveries
    ]
    info["regroups"] = counts.get("regroup", 0)
    return info
