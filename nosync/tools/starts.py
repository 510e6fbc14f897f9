"""Where a rewind (or `nosync state`) can start from: the usable checkpoints of an abs run,
and a consistent cut of the snapshots of a nosync run, with the frames in flight at it."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgpack

from lineage import consistent_cut
from nosync import codec, storage
from nosync.api import sinks
from nosync.api.pipeline import Pipeline
from nosync.errors import NosyncError
from nosync.runtime import frames as wire
from nosync.spark.tasks import DATA as ROW_DATA
from nosync.spark.tasks import MARK as ROW_MARK
from nosync.state import checkpoints
from nosync.state.layout import iter_snapshots, logged_frames
from nosync.state.stores import read_store
from nosync.tools.stores import local_stores


def committed_epochs(directory: str) -> list[int]:
    """The epochs a Files sink committed part files of in `directory` (a path or a URI),
    sorted (none if it does not exist)."""
    return sorted({int(m.group(1)) for n in storage.listdir(directory) if (m := sinks.PART_NAME.match(n))})


def iter_usable_checkpoints(shared: str, pipeline_name: str, per_epoch: int, skipped: list | None = None) -> Any:
    """(id, path, body, first epoch) of each retained checkpoint of an abs run (whose shared
    tier is `shared`: `nosync.places`) that batch jobs can start from, newest first. One that
    left an operator's keyed state out (its input had ended before the barrier) is passed
    over; a damaged file too, its error appended to `skipped`. The first epoch is the first
    that begins at or after the checkpoint's cut."""
    for c in reversed(checkpoints.completed(shared)):
        path = checkpoints.path_of(shared, c)
        try:
            body = checkpoints.read(path)
        except checkpoints.CheckpointError as e:
            if skipped is not None:
                skipped.append(str(e))
            continue
        if body.get("pipeline") != pipeline_name:
            raise NosyncError(
                f"{storage.redact(path)} is a checkpoint of pipeline '{body.get('pipeline')}', not '{pipeline_name}'"
            )
        if all(m.get("keyed_state") is not False for w in body["workers"].values() for m in w["ops"].values()):
            yield c, path, body, checkpoints.find_first_epoch(body, per_epoch)


def find_checkpoint_before(shared: str, pipeline: Pipeline, to_epoch: int | None, per_epoch: int) -> dict:
    """The newest usable checkpoint of an abs run (whose shared tier is `shared`) whose cut
    lies at or before the start of epoch `to_epoch` (no source partition read a record of it;
    None: any), as {"checkpoint", "path", "body", "epoch", "records"}; {"checkpoint": -1, ...}
    if there is none. Also lists the retained ids and the damaged files skipped."""
    found: dict = {"checkpoint": -1, "retained": checkpoints.completed(shared), "skipped": []}
    for c, path, body, first in iter_usable_checkpoints(shared, pipeline.name, per_epoch, found["skipped"]):
        if to_epoch is None or first <= to_epoch:
            _, epoch, total = checkpoints.find_cut(body)
            return {**found, "checkpoint": c, "path": path, "body": body, "epoch": epoch, "records": total}
    return found


def open_copies(paths: list[str], read: Any, keep: bool) -> list[tuple[Any, Any]]:
    """Opens the store copies at `paths` in parallel (LevelDB's open, the bulk of the cost,
    leaves the interpreter lock) and reads each with `read(store)`. Returns, per path, the
    store (still open if `keep`, else closed) and what `read` returned. If one fails, every
    store opened is closed and its error raised."""

    def open_one(path: str) -> tuple[Any, Any]:
        store = read_store(path)
        try:
            got = read(store)
        except BaseException:
            store.close()
            raise
        if not keep:
            store.close()
        return store, got

    with ThreadPoolExecutor(max(1, min(len(paths), os.cpu_count() or 1))) as pool:
        futures = [pool.submit(open_one, path) for path in paths]
    failed = next((f.exception() for f in futures if f.exception() is not None), None)
    if failed is not None:
        if keep:
            for f in futures:
                if f.exception() is None:
                    f.result()[0].close()
        raise failed
    return [f.result() for f in futures]


def stores_hold(state_dir: str, c: int) -> str | None:
    """None if every keyed store under `state_dir` (a copy) still holds its versions as of
    seq `c`, else why not. Opening a copy for the first time recovers its LevelDB log, if the
    run left one, which the batch tasks then do not pay again."""
    paths = [path for _, _, path in local_stores(state_dir)]
    for path, (_, horizon) in zip(paths, open_copies(paths, lambda store: store.horizon, keep=False), strict=True):
        if c < horizon:
            w, name = path.split(os.sep)[-2:]
            return f"the store of operator '{name}' of worker {w[1:]} was compacted up to seq {horizon}"
    return None


SEED_SEQ = -(1 << 40)
"""Rows of the frames in flight at a cut sort before what the batch jobs emit on the same link
and epoch (`batch` sorts a destination's rows by epoch, sender, edge and this seq)."""
BUFFERED_SEQ = SEED_SEQ + (1 << 32)
"""Rows of the records in a sender's exchange buffers at its snapshot sort after its frames."""


def _read_all(meta: dict) -> bool:
    """Whether a worker's snapshot lies after its sources read their last record. A cut of
    such snapshots leaves the batch jobs nothing to run on: stages that get no rows do not
    run, so `state` would find no keys and a changed pipeline would never take over (windows
    that close at the end of the input closed in the run). A worker with no records to read
    does not count."""
    srcs = [m for m in meta["ops"].values() if "parts" in m]
    return all(m["finished"] for m in srcs) and sum(int(m["records_in"]) for m in srcs) > 0


class SnapshotLogs:
    """The snapshots a nosync run's worker stores retain (under `state_dir`), with the stores
    open inside a `with` block: where consistent cuts of them lie, and the frames in flight
    at one. Opening a store recovers its LevelDB log, which rewrites its files: a rewind
    opens copies."""

    def __init__(self, state_dir: str, workers: int, per_epoch: int) -> None:
        self.paths = {w: os.path.join(state_dir, f"w{w}", "nosync") for w in range(workers)}
        self.workers, self.per_epoch = workers, per_epoch
        self.stores: dict[int, Any] = {}
        self.snaps: dict[int, list[dict]] = {}
        """Per worker, its snapshots' metadata, newest first."""
        self.firsts: dict[int, list[int]] = {}
        """Per worker, the first epoch each snapshot's cut lies before."""
        self._found: dict[tuple[int, int], dict[int, bytes]] = {}
        self._scanned: set[tuple[int, int, int]] = set()

    def missing(self) -> int | None:
        """A worker without a nosync log, or None."""
        return next((w for w, path in self.paths.items() if not os.path.isdir(path)), None)

    def __enter__(self) -> SnapshotLogs:
        paths = [self.paths[w] for w in range(self.workers)]
        for w, (store, snaps) in enumerate(open_copies(paths, lambda s: list(iter_snapshots(s)), keep=True)):
            self.stores[w], self.snaps[w] = store, snaps
            self.firsts[w] = [
                checkpoints.find_first_epoch({"workers": {0: {"ops": m["ops"]}}}, self.per_epoch) for m in self.snaps[w]
            ]
        return self

    def __exit__(self, *exc: object) -> None:
        for store in self.stores.values():
            store.close()
        self.stores = {}

    def cut(self, to_epoch: int | None) -> dict[int, dict] | str:
        """Per worker, the metadata of its snapshot in the newest consistent cut at which no
        source partition had read a record of epoch `to_epoch` (None: any); or why there is
        none (`find_snapshot_cut`)."""
        where = "the end of the input" if to_epoch is None else f"the start of epoch {to_epoch}"
        cands = {
            w: [
                m
                for m, e in zip(self.snaps[w], self.firsts[w], strict=True)
                if (to_epoch is None or e <= to_epoch) and not _read_all(m)
            ]
            for w in range(self.workers)
        }
        for w in range(self.workers):
            if not cands[w]:
                return f"worker {w} retains no snapshot taken at or before {where}"

        def unreadable(src: int, index: int, dst: int, lo: int, hi: int) -> int | None:
            got = self._found.setdefault((src, dst), {})
            for meta in cands[src][index:]:
                need = next((q for q in range(lo, hi + 1) if q not in got), None)
                if need is None or int(meta["produced"].get(dst, 0)) < need:
                    break
                seq = int(meta["seq"])
                if (src, dst, seq) not in self._scanned:
                    self._scanned.add((src, dst, seq))
                    got.update(logged_frames(self.stores[src], dst, seq))
            return next((q for q in range(lo, hi + 1) if q not in got), None)

        pos = consistent_cut(cands, unreadable)
        if pos is None:
            return f"the workers' retained snapshots at or before {where} hold no consistent cut"
        return {w: cands[w][pos[w]] for w in range(self.workers)}

    def in_flight(self, cut: dict[int, dict]) -> dict[int, list]:
        """Per sending worker, the frames in flight at `cut` as batch rows (data and marker
        frames; events carry barriers, which a batch job has none of)."""
        rows: dict[int, list] = {w: [] for w in range(self.workers)}
        for src in range(self.workers):
            for dst in range(self.workers):
                if src == dst:
                    continue
                lo = int(cut[dst]["consumed"].get(src, 0)) + 1
                hi = int(cut[src]["produced"].get(dst, 0))
                for q in range(lo, hi + 1):
                    f = wire.decode(self._found[(src, dst)][q])
                    h = f.header
                    if f.kind == wire.DATA:
                        kind, data = ROW_DATA, msgpack.packb(f.body, use_bin_type=True)
                    elif f.kind == wire.MARKER:
                        kind, data = ROW_MARK, msgpack.packb([h.get("wm"), bool(h.get("eos"))], use_bin_type=True)
                    else:
                        continue
                    rows[src].append((dst, int(h["edge"]), src, SEED_SEQ + q, kind, int(h["epoch"]), data))
            # records in the exchange buffers at its snapshot: sent after every frame there
            for k, (edge, dst, epoch, data) in enumerate(cut[src].get("buffers", ())):
                records = codec.unpack(data)
                row = msgpack.packb(list(records), use_bin_type=True)
                rows[src].append((int(dst), int(edge), src, BUFFERED_SEQ + k, ROW_DATA, int(epoch), row))
        return rows

    def first_epoch(self) -> int | None:
        """The first epoch a consistent cut of the retained snapshots lies before, or None."""
        for e in sorted({e for firsts in self.firsts.values() for e in firsts}):
            if not isinstance(self.cut(e), str):
                return e
        return None


def find_snapshot_cut(state_dir: str, workers: int, to_epoch: int | None, per_epoch: int) -> dict:
    """The newest consistent cut of a nosync run's snapshots (under `state_dir`, a copy of its
    stores) at which no source partition had read a record of epoch `to_epoch` (None: any),
    and the frames in flight at it, as batch rows per sending worker: {"steps", "ops",
    "inflight", "epoch", "records"}; or {"why_not": ...} when there is none.

    Each worker snapshots alone, so the cut is chosen link by link (`lineage.consistent_cut`):
    no worker's snapshot consumed a frame its sender's snapshot had not produced. A frame
    produced but not consumed at the cut is read from the sender's output log, at the
    version of the snapshot that wrote it; one that no snapshot wrote (produced and trimmed
    between two) sends its sender back to a snapshot before it."""
    logs = SnapshotLogs(state_dir, workers, per_epoch)
    w = logs.missing()
    if w is not None:
        return {"why_not": f"worker {w} of the run left no nosync log"}
    with logs:
        cut = logs.cut(to_epoch)
        if isinstance(cut, str):
            return {"why_not": cut}
        inflight = logs.in_flight(cut)
    body = {"workers": {w: {"ops": m["ops"]} for w, m in cut.items()}}
    _, epoch, total = checkpoints.find_cut(body)
    return {
        "steps": {w: int(m["step"]) for w, m in cut.items()},
        "seqs": {w: int(m["seq"]) for w, m in cut.items()},
        "ops": {w: m["ops"] for w, m in cut.items()},
        "inflight": inflight,
        "epoch": epoch,
        "records": total,
    }
