"""Completed checkpoints on the shared tier: one metadata file per checkpoint, written atomically.

    <shared tier>/checkpoints/chk-<id, 10 digits>.msgpack

    magic "NSCK" | format u8 | xxh64 of the body u64 LE | body (msgpack map)

The shared tier is the run's (`nosync.places`): the run directory of an embedded run, else
`--remote URI/<run name>`, so that a tool, a resumed driver or a driver on another host finds
them. The body names the pipeline, the checkpoint id and, per worker, what its operators need to
restart that is not keyed state (source positions, frontiers and watermarks, window
bookkeeping, the sinks' pre-commit handles), plus the handle of each keyed operator's
incremental snapshot: its `lsm` store `<local root of w<i>>/<operator>` at seq = the
checkpoint id (the store's remote tier, with --checkpoint-tier remote, on the shared tier).
Only the driver writes and reads these files; a worker gets its part of the body in the
message that starts its generation. A file is written atomically (`storage.write_bytes`: on
a local file system a temporary name, fsynced, renamed, its directory fsynced; on an object
store one PUT), so a reader sees a whole file or none. A file that is damaged (bad magic,
checksum, or msgpack) raises CheckpointError naming it; recovery then falls back to the
previous one.
"""

from __future__ import annotations

import re
import struct
from typing import Any

import xxhash

from nosync import codec, storage
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


def directory(root: str) -> str:
    """The directory of the checkpoint files of the run whose shared tier is `root`."""
    return storage.join(root, "checkpoints")


def path_of(root: str, checkpoint: int) -> str:
    """The path (or URI) of the file of checkpoint `checkpoint` of the run whose shared tier is `root`."""
    return storage.join(directory(root), f"chk-{checkpoint:010d}.msgpack")


def write(root: str, checkpoint: int, body: dict) -> str:
    """Writes the metadata of a completed checkpoint atomically; returns its path."""
    data = codec.pack(body)
    path = path_of(root, checkpoint)
    storage.write_bytes(path, _HEAD.pack(MAGIC, FORMAT, xxhash.xxh64_intdigest(data)) + data)
    return path


def read(path: str) -> dict:
    """The body of a checkpoint file; raises CheckpointError if it is missing or damaged."""
    try:
        raw = storage.read_bytes(path)
    except OSError as e:
        raise CheckpointError(storage.redact(path), f"cannot be read: {e.strerror or e}") from None
    path = storage.redact(path)
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


def completed(root: str) -> list[int]:
    """Ids of the checkpoint files of the run whose shared tier is `root`, oldest first."""
    ids = []
    for name in storage.listdir(directory(root)):
        m = _NAME.match(name)
        if m:
            ids.append(int(m.group(1)))
    return sorted(ids)


def latest_valid(root: str, below: int | None = None) -> tuple[int, dict | None, list[CheckpointError]]:
    """The newest checkpoint (below `below`, if given) whose file reads whole: its id and body,
    and the errors of the newer ones skipped. (-1, None, errors) when there is none."""
    errors = []
    for c in reversed(completed(root)):
        if below is not None and c >= below:
            continue
        try:
            return c, read(path_of(root, c)), errors
        except CheckpointError as e:
            errors.append(e)
    return -1, None, errors


def prune(root: str, keep: int) -> None:
    """Removes all but the newest `keep` checkpoint files."""
    ids = completed(root)
    for c in ids[:-keep] if keep else ids:
        storage.delete(path_of(root, c))


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


def restore_keyed(op: Any, store: Any, as_of: int | None = None) -> None:
    """Gives `op` the keyed state its store held after seq `as_of` (None: its last)."""
    load_keyed(op, store, STATE, as_of)
