"""The local log: numbered segment files of framed records, the disk tier's durability.

The persister writes each frozen memtable here as one write + fsync before it indexes the
memtable into LevelDB, so `durable("disk")` advances at the speed of a sequential write. A
segment is named by the seq of its first record (`{seq:020d}.log`); it is sealed when it
reaches `segment_bytes` or when the remote tier wants it, and then uploaded and, once
uploaded and older than the retention horizon, deleted.

Invariant: records across all segments have strictly increasing seqs, and only the last
segment may end in a torn record (cut on open).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from lsm import files
from lsm.errors import CorruptLogError
from lsm.records import SEGMENT_HEADER, Record, record_parts, scan_segment, segment_header

SUFFIX = ".log"


@dataclass
class Segment:
    """One segment file of the log: the seq it is named by, its path, the last seq it holds, its
    size, whether it is sealed, and the monotonic time this process opened or started it at."""

    first: int
    path: str
    last: int = -1
    size: int = 0
    sealed: bool = False
    created: float = field(default_factory=time.monotonic)


def segment_name(first: int) -> str:
    """The file name of the segment whose first record has seq `first`."""
    return f"{first:020d}{SUFFIX}"


class Log:
    """REQUIRES: one thread at a time (the persister, or the API thread holding the tier lock)."""

    def __init__(self, path: str, segment_bytes: int) -> None:
        self.path = path
        self.segment_bytes = segment_bytes
        self.segments: list[Segment] = []
        self._fd = -1
        os.makedirs(path, exist_ok=True)

    # -- open -----------------------------------------------------------------

    def open(self, after: int) -> list[Record]:
        """Finds the segments, cuts a torn tail, returns the records with seq > `after`."""
        names = sorted(n for n in os.listdir(self.path) if n.endswith(SUFFIX))
        self.segments = [Segment(int(n[: -len(SUFFIX)]), os.path.join(self.path, n)) for n in names]
        replay: list[Record] = []
        for i, seg in enumerate(self.segments):
            is_last = i == len(self.segments) - 1
            next_first = self.segments[i + 1].first if not is_last else None
            if next_first is not None and next_first <= after + 1:
                seg.size, seg.sealed = os.path.getsize(seg.path), True
                seg.last = next_first - 1
                continue
            with open(seg.path, "rb") as f:
                data = f.read()
            scan = scan_segment(seg.path, data)
            if scan.torn and not is_last:
                raise CorruptLogError(seg.path, scan.valid_end, "damaged record in a sealed segment")
            seg.last = scan.records[-1].seq if scan.records else seg.first - 1
            seg.sealed = not is_last
            if scan.torn:
                self._cut(seg, scan.valid_end)
            else:
                seg.size = len(data)
            replay.extend(r for r in scan.records if r.seq > after)
        return replay

    def _cut(self, seg: Segment, valid_end: int) -> None:
        fd = os.open(seg.path, os.O_WRONLY)
        try:
            if valid_end < SEGMENT_HEADER.size:
                files.truncate(fd, 0)
                files.write(fd, segment_header())
                valid_end = SEGMENT_HEADER.size
            else:
                files.truncate(fd, valid_end)
            files.fsync(fd)
        finally:
            os.close(fd)
        seg.size = valid_end

    @property
    def last_seq(self) -> int:
        """The seq of the last record in the log, -1 if it holds none."""
        for seg in reversed(self.segments):
            if seg.last >= seg.first:
                return seg.last
        return -1

    # -- writing --------------------------------------------------------------

    def append(self, batches: list[tuple[int, bytes | list[bytes]]]) -> None:
        """Writes the batches as records (a body in bytes, or in parts laid end to end) and
        fsyncs them; on OSError nothing is half-written.

        REQUIRES: batches sorted by seq, all above `last_seq`.
        """
        seg = self.segments[-1] if self.segments else None
        if seg is None or seg.sealed or seg.size >= self.segment_bytes:
            seg = self._start_segment(batches[0][0])
        else:
            self._ensure_fd()
        parts = []
        for seq, body in batches:
            parts += record_parts(seq, body if type(body) is list else [body])
        size = sum(map(len, parts))
        fd = self._fd
        try:
            files.write_durable(fd, parts, seg.size)
        except OSError:
            try:
                files.truncate(fd, seg.size)
            except OSError:
                self._close_fd()
            raise
        seg.size += size
        seg.last = batches[-1][0]

    def _start_segment(self, first: int) -> Segment:
        if self.segments and not self.segments[-1].sealed:
            self.seal()
        path = os.path.join(self.path, segment_name(first))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            files.write(fd, segment_header())
            files.fsync(fd)
            files.fsync_dir(self.path)
        except OSError:
            os.close(fd)
            os.unlink(path)
            raise
        self._fd = fd
        seg = Segment(first, path, first - 1, SEGMENT_HEADER.size)
        self.segments.append(seg)
        return seg

    def _ensure_fd(self) -> None:
        if self._fd < 0:
            seg = self.segments[-1]
            self._fd = os.open(seg.path, os.O_WRONLY)
            os.lseek(self._fd, seg.size, os.SEEK_SET)

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def seal(self) -> None:
        """Closes the current segment to writes; the next append starts a new one."""
        if self.segments and not self.segments[-1].sealed:
            seg = self.segments[-1]
            if seg.last < seg.first:
                self._close_fd()
                os.unlink(seg.path)
                self.segments.pop()
                return
            seg.sealed = True
        self._close_fd()

    # -- reading, trimming ----------------------------------------------------

    def read(self, seg: Segment) -> list[Record]:
        """The records of a segment; raises CorruptLogError if any of them is damaged."""
        with open(seg.path, "rb") as f:
            data = f.read(seg.size)
        scan = scan_segment(seg.path, data)
        if scan.torn:
            raise CorruptLogError(seg.path, scan.valid_end, "damaged record")
        return scan.records

    def records_after(self, seq: int) -> list[Record] | None:
        """Every record with seq > `seq`, or None when the log no longer holds all of them."""
        out: list[Record] = []
        segs = [s for s in self.segments if s.last > seq]
        if not segs:
            return out
        if segs[0].first > seq + 1 and segs[0] is self.segments[0]:
            return None
        for seg in segs:
            out.extend(r for r in self.read(seg) if r.seq > seq)
        return out

    def truncate_after(self, seq: int) -> None:
        """Removes every record with seq > `seq` (rollback)."""
        while self.segments and self.segments[-1].first > seq:
            seg = self.segments.pop()
            if self._fd >= 0 and not seg.sealed:
                self._close_fd()
            os.unlink(seg.path)
        files.fsync_dir(self.path)
        if not self.segments:
            return
        # read even when the bound says nothing is above seq: a bound open() estimated (the
        # next segment's first - 1) may name a seq with no record, which must not look logged
        seg = self.segments[-1]
        records = self.read(seg)
        kept = [r for r in records if r.seq <= seq]
        # the segment's last is what it holds, not the rollback target: open() may have only
        # bounded it by the next segment's first, and a target without a record of its own
        # must not look logged
        seg.last = kept[-1].seq if kept else seg.first - 1
        if len(kept) == len(records):
            return
        end = records[len(kept)].offset
        fd = os.open(seg.path, os.O_WRONLY)
        try:
            files.truncate(fd, end)
            files.fsync(fd)
        finally:
            os.close(fd)
        seg.size = end
        if not seg.sealed:
            self._close_fd()
            seg.sealed = True

    def drop_through(self, seq: int) -> int:
        """Deletes the sealed segments whose records are all <= `seq`; returns the bytes freed."""
        freed = 0
        while self.segments:
            seg = self.segments[0]
            if not seg.sealed or seg.last > seq:
                break
            os.unlink(seg.path)
            freed += seg.size
            self.segments.pop(0)
        return freed

    def disk_bytes(self) -> int:
        """The bytes the log's segments take on disk."""
        return sum(s.size for s in self.segments)

    def close(self) -> None:
        """Closes the current segment's file descriptor."""
        self._close_fd()
