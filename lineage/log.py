"""The lineage log: one process's own lineage entries, persisted compactly.

A process appends the entry of each step it executes; the log is what it hands on (with its
frames) and what survives its own restart until its durable point covers the entries. The file
is nothing but records, appended:

    length n u32 LE | checksum u64 LE | payload (n bytes)

with payload = msgpack `[step, entry]` and checksum = xxh64(payload, seed=n), so a damaged
length fails the check like a damaged payload. Steps strictly increase through the file.

`append` only buffers; `flush` writes the buffer with one write and fsyncs it. On open, a damaged
record with no intact record after it is a torn tail (a crash in the middle of a write) and is
cut; a damaged record followed by an intact one is corruption in the middle and raises
CorruptLineageLogError with the path and byte offset, never skipped. `truncate_before` rewrites
the file without the entries a durable point covers (temporary file, fsync, rename).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, NamedTuple

import msgpack
import xxhash

from lineage.errors import CorruptLineageLogError, LineageError
from lineage.plan import Lineage

RECORD = struct.Struct("<IQ")
MAX_RECORD = 1 << 24
"""No lineage entry comes near this; a bigger length is damage."""


def encode_record(step: int, entry: Sequence[Any]) -> bytes:
    """One framed record of the entry of `step`."""
    payload = msgpack.packb([step, list(entry)], use_bin_type=True)
    n = len(payload)
    return RECORD.pack(n, xxhash.xxh64_intdigest(payload, seed=n)) + payload


def _intact_at(data: bytes, pos: int) -> int:
    """The end offset of an intact record starting at `pos`, or -1."""
    if pos + RECORD.size > len(data):
        return -1
    n, checksum = RECORD.unpack_from(data, pos)
    start = pos + RECORD.size
    if n == 0 or n > MAX_RECORD or start + n > len(data):
        return -1
    if xxhash.xxh64_intdigest(data[start : start + n], seed=n) != checksum:
        return -1
    return start + n


def _damage(data: bytes, pos: int) -> str:
    if pos + RECORD.size > len(data):
        return "truncated record header"
    n, _ = RECORD.unpack_from(data, pos)
    if n == 0 or n > MAX_RECORD:
        return f"impossible record length {n}"
    if pos + RECORD.size + n > len(data):
        return "record runs past the end of the file"
    return "checksum mismatch"


class _Scan(NamedTuple):
    entries: Lineage
    end: int
    torn: bool


def _scan(path: str, data: bytes) -> _Scan:
    entries: Lineage = []
    last = 0
    pos = 0
    while pos < len(data):
        end = _intact_at(data, pos)
        if end < 0:
            if any(_intact_at(data, probe) >= 0 for probe in range(pos + 1, len(data) - RECORD.size)):
                raise CorruptLineageLogError(path, pos, _damage(data, pos) + " (intact records follow)")
            return _Scan(entries, pos, True)
        try:
            step, entry = msgpack.unpackb(data[pos + RECORD.size : end], use_list=False, raw=False)
            step, entry = int(step), tuple(entry)
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            raise CorruptLineageLogError(path, pos, f"payload is not [step, entry]: {e}") from e
        if step <= last:
            raise CorruptLineageLogError(path, pos, f"step {step} does not follow step {last}")
        entries.append((step, entry))
        last = step
        pos = end
    return _Scan(entries, pos, False)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LineageLog:
    """The append-only log of one process's own lineage entries, at `path`.

    Invariant: the file holds whole records only (a torn tail is cut on open, a failed write is
    cut back), and `_size` is its length; `_pending` holds appended records not yet written.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        scan = _scan(path, data)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if scan.torn:
            os.ftruncate(self._fd, scan.end)
            os.fsync(self._fd)
        if not data:
            _fsync_dir(path)
        self._size = scan.end
        self._last = scan.entries[-1][0] if scan.entries else 0
        self._pending: list[bytes] = []
        self._pending_entries: Lineage = []

    @property
    def last_step(self) -> int:
        """The highest step appended (0: none since the file was created)."""
        return self._last

    def append(self, entries: Iterable[Sequence[Any]]) -> None:
        """Buffers (step, entry) pairs; steps must exceed every step appended before."""
        for step, entry in entries:
            step, entry = int(step), tuple(entry)
            if step <= self._last:
                raise LineageError(f"{self.path}: step {step} appended after step {self._last}")
            self._pending.append(encode_record(step, entry))
            self._pending_entries.append((step, entry))
            self._last = step

    def flush(self) -> None:
        """Writes the buffered entries and fsyncs them: after this they survive a crash."""
        if not self._pending:
            return
        data = b"".join(self._pending)
        try:
            _write_all(self._fd, data)
            os.fsync(self._fd)
        except OSError:
            os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)
        self._pending.clear()
        self._pending_entries.clear()

    def read(self, after_step: int = 0) -> Lineage:
        """The entries with a step above `after_step`, written or still buffered, in order."""
        with open(self.path, "rb") as f:
            data = f.read(self._size)
        scan = _scan(self.path, data)
        if scan.torn:
            raise CorruptLineageLogError(self.path, scan.end, "damaged record (the file changed under the log)")
        return [e for e in scan.entries + self._pending_entries if e[0] > after_step]

    def truncate_before(self, step: int) -> None:
        """Rewrites the file with only the entries above `step` (buffered ones included, now durable)."""
        keep = self.read(step)
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            data = b"".join(encode_record(s, e) for s, e in keep)
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        _fsync_dir(self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = len(data)
        self._pending.clear()
        self._pending_entries.clear()

    def close(self) -> None:
        """Flushes and closes the file."""
        if self._fd < 0:
            return
        try:
            self.flush()
        finally:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> LineageLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
