"""Completed checkpoints on disk: one metadata file per checkpoint, written atomically.

    <run dir>/checkpoints/chk-<id, 10 digits>.msgpack

    magic "NSCK" | format u8 | xxh64 of the body u64 LE | body (msgpack map)

The body names the pipeline, the checkpoint id and, per worker, what its operators need to
restart that is not keyed state (source positions, frontiers and watermarks, window
bookkeeping, the sinks' pre-commit handles), plus the handle of each keyed operator's
incremental snapshot: its `lsm` store under `<run dir>/state/w<i>/<operator>` at seq = the
checkpoint id. A file is written to a temporary name, fsynced, renamed, and its directory
fsynced, so a reader sees a whole file or none. A file that is damaged (bad magic, checksum,
or msgpack) raises CheckpointError naming it; recovery then falls back to the previous one.
"""

from __future__ import annotations

import os
import re
import struct
from typing import Any

import msgpack
import xxhash

from lsm.files import fsync_dir
from nosync import codec
from nosync.errors import NosyncError
from nosync.state.stores import load_keyed

MAGIC = b"NSCK"
FORMAT = 1
_HEAD = struct.Struct("<4sBQ")
_NAME = re.compile(r"^chk-(\d{10})\.msgpack$")


class CheckpointError(NosyncError):
    """A checkpoint file that cannot be used: missing, damaged, or of another format."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"checkpoint file {path}: {reason}")
        self.path = path


def directory(run_dir: str) -> str:
    """The directory of a run's checkpoint files."""
    return os.path.join(run_dir, "checkpoints")


def path_of(run_dir: str, checkpoint: int) -> str:
    """The path of the file of checkpoint `checkpoint` in run `run_dir`."""
    return os.path.join(directory(run_dir), f"chk-{checkpoint:010d}.msgpack")


def write(run_dir: str, checkpoint: int, body: dict) -> str:
    """Writes the metadata of a completed checkpoint atomically; returns its path."""
    d = directory(run_dir)
    os.makedirs(d, exist_ok=True)
    data = msgpack.packb(body, use_bin_type=True)
    path = path_of(run_dir, checkpoint)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(_HEAD.pack(MAGIC, FORMAT, xxhash.xxh64_intdigest(data)) + data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(d)
    return path


def read(path: str) -> dict:
    """The body of a checkpoint file; raises CheckpointError if it is missing or damaged."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise CheckpointError(path, f"cannot be read: {e.strerror or e}") from None
    if len(raw) < _HEAD.size:
        raise CheckpointError(path, f"truncated ({len(raw)} bytes)")
    magic, fmt, digest = _HEAD.unpack_from(raw)
    if magic != MAGIC:
        raise CheckpointError(path, "not a checkpoint file (bad magic)")
    if fmt != FORMAT:
        raise CheckpointError(path, f"format {fmt}, this build reads {FORMAT}")
    data = raw[_HEAD.size :]
    if xxhash.xxh64_intdigest(data) != digest:
        raise CheckpointError(path, "checksum mismatch: the file is damaged")
    try:
        body = codec.unpack(data)
    except Exception as e:  # noqa: BLE001 - msgpack raises several types
        raise CheckpointError(path, f"malformed body: {e}") from None
    if not isinstance(body, dict):
        raise CheckpointError(path, "malformed body")
    return body


def completed(run_dir: str) -> list[int]:
    """Ids of the checkpoint files in the run directory, oldest first."""
    d = directory(run_dir)
    if not os.path.isdir(d):
        return []
    ids = []
    for name in os.listdir(d):
        m = _NAME.match(name)
        if m:
            ids.append(int(m.group(1)))
    return sorted(ids)


def latest_valid(run_dir: str, below: int | None = None) -> tuple[int, dict | None, list[CheckpointError]]:
    """The newest checkpoint (below `below`, if given) whose file reads whole: its id and body,
    and the errors of the newer ones skipped. (-1, None, errors) when there is none."""
    errors = []
    for c in reversed(completed(run_dir)):
        if below is not None and c >= below:
            continue
        try:
            return c, read(path_of(run_dir, c)), errors
        except CheckpointError as e:
            errors.append(e)
    return -1, None, errors


def prune(run_dir: str, keep: int) -> None:
    """Removes all but the newest `keep` checkpoint files."""
    ids = completed(run_dir)
    for c in ids[:-keep] if keep else ids:
        try:
            os.unlink(path_of(run_dir, c))
        except FileNotFoundError:
            pass


def body(pipeline: str, checkpoint: int, workers: dict[int, Any], extra: dict | None = None) -> dict:
    """The body of a checkpoint file: the format, the pipeline, the checkpoint id and each
    worker's metadata, with `extra`."""
    return {"format": FORMAT, "pipeline": pipeline, "checkpoint": checkpoint, "workers": workers, **(extra or {})}


def find_cut(body: dict) -> tuple[int, int, int]:
    """Where a checkpoint's cut lies in the input: the most records read from one source
    partition, the greatest epoch a source was in, and the records read in all (source
    instances are the operators whose metadata names partitions)."""
    most = epoch = total = 0
    for w in body["workers"].values():
        for meta in w["ops"].values():
            if "parts" in meta:
                most = max([most, *(int(part[2]) for part in meta["parts"])])
                epoch = max(epoch, int(meta["epoch"]))
                total += int(meta["records_in"])
    return most, epoch, total


def find_first_epoch(body: dict, epoch_records: int) -> int:
    """The first epoch a rewind can start from this checkpoint: the first that begins at or
    after its cut."""
    return -(-find_cut(body)[0] // epoch_records)


STATE = "state"
"""The name of an operator's keyed state in its store."""


def state_path(run_dir: str, worker: int, operator: str) -> str:
    """The directory of the keyed store of operator `operator` on worker `worker` (mode abs)."""
    return os.path.join(run_dir, "state", f"w{worker}", operator)


def restore_keyed(op: Any, store: Any, as_of: int | None = None) -> None:
    """Gives `op` the keyed state its store held after seq `as_of` (None: its last)."""
    load_keyed(op, store, STATE, as_of)
