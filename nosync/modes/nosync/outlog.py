"""The output log: every frame a worker sent, kept for its receiver (upstream backup).

Per destination, the frames in chan_seq order, in memory, until the receiver's durable point
covers them (`trim`); nothing of it is written in steady state. A snapshot writes the residue
(`residue`): the frames still uncovered when it is taken, one compressed blob per destination,
so that a sender restored from that snapshot can still serve a receiver that recovers later.

Past `max_bytes` in memory, the oldest frames go to this process's spill, a directory of
segment files (`segment_bytes`, 64 MiB, each), read back frame by frame, by offset and length,
if a receiver asks for them again (`since`) or a snapshot takes them into its residue (one
destination's residue in memory at a time, never a whole segment). Each destination spills to
segments of its own, and a segment is deleted as soon as the last of its frames is trimmed: as
a destination's frames are trimmed in the order they were spilled, only its oldest segment
can hold frames already trimmed, so the spill's disk is at most its untrimmed frames plus one
segment per destination, however long the run. A restarted process starts a new spill, its
snapshot's residue holding what it needs; a log restored from a residue, or closed, deletes
the spill it had.
"""

from __future__ import annotations

import os
from collections import deque
from itertools import islice

from nosync.state.layout import pack_residue, unpack_residue

SEGMENT_BYTES = 64 << 20
"""The size of a spill segment: one past it starts the next (a larger frame has one alone)."""


class _Segment:
    """One spill file: frames of one destination appended back to back, `live` of them not
    trimmed yet."""

    __slots__ = ("dest", "file", "live", "path", "size")

    def __init__(self, path: str, dest: int) -> None:
        self.path = path
        self.dest = dest
        self.file = open(path, "w+b")  # noqa: SIM115 - closed by _drop; read back with os.pread
        self.size = 0
        self.live = 0

    def read(self, off: int, n: int) -> bytes:
        data = os.pread(self.file.fileno(), n, off)
        if len(data) != n:
            raise OSError(f"output-log spill {self.path}: {len(data)} bytes at offset {off}, expected {n}")
        return data

    def drop(self) -> None:
        self.file.close()
        os.unlink(self.path)


class OutputLog:
    """One worker's output log: per destination, the frames it sent in chan_seq order, in memory
    or spilled, until trimmed."""

    def __init__(self, spill_path: str, max_bytes: int, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.spill_path = spill_path
        """The directory of the spill's segments, made at the first spill."""
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self.frames: dict[int, deque] = {}
        """Per destination, [chan_seq, frame] items; the frame is (segment, offset, length) once
        spilled. Invariant: the spilled items of a destination are a prefix of its deque,
        `_on_disk[d]` of them, in the order of their offsets."""
        self.mem = 0
        self.peak = 0
        """The most bytes the log held in memory at once."""
        self.spilled = 0
        """Frames written to the spill, over the log's life."""
        self.restored: dict[int, int] = {}
        """Per destination, the last chan_seq a restored residue held."""
        self.resent_from_residue = 0
        self._on_disk: dict[int, int] = {}
        self._tail: dict[int, _Segment] = {}
        """Per destination, the segment its next spilled frame goes to."""
        self._segments: set[_Segment] = set()
        self._serial = 0
        self._dir_made = False

    @property
    def spill_bytes(self) -> int:
        """Bytes in the spill's files now."""
        return sum(s.size for s in self._segments)

    def add(self, dest: int, seq: int, frame: bytes) -> None:
        """Keeps frame `seq` sent to `dest`; past `max_bytes` in memory, the
        oldest frames are spilled."""
        self.frames.setdefault(dest, deque()).append([seq, frame])
        self.mem += len(frame)
        if self.mem > self.peak:
            self.peak = self.mem
        if self.mem > self.max_bytes:
            self._spill_oldest()

    def first(self, dest: int) -> int | None:
        """The chan_seq of the oldest frame kept for `dest`, None if none is."""
        q = self.frames.get(dest)
        return q[0][0] if q else None

    def trim(self, dest: int, upto: int) -> None:
        """Drops the frames to `dest` up to chan_seq `upto` (its durable point covers them); a
        segment whose last frame goes is deleted."""
        q = self.frames.get(dest)
        while q and q[0][0] <= upto:
            _, frame = q.popleft()
            if type(frame) is bytes:
                self.mem -= len(frame)
                continue
            self._on_disk[dest] -= 1
            seg = frame[0]
            seg.live -= 1
            if seg.live == 0:
                self._drop(seg)

    def trim_all(self, dest: int) -> None:
        """Drops every frame kept for `dest`."""
        self.trim(dest, 1 << 62)

    def since(self, dest: int, start: int) -> list[bytes]:
        """The frames to `dest` from chan_seq `start` on, in order."""
        out = [(seq, self._bytes(f)) for seq, f in self.frames.get(dest, ()) if seq >= start]
        last = self.restored.get(dest, 0)
        self.resent_from_residue += sum(1 for seq, _ in out if seq <= last)
        return [f for _, f in out]

    def residue(self) -> dict[int, dict]:
        """Per destination, the frames it has not durably consumed, as one compressed value
        (`layout.pack_residue`). Spilled frames are read one by one: one destination's frames
        are in memory at a time."""
        return {d: pack_residue([[seq, self._bytes(f)] for seq, f in q]) for d, q in self.frames.items()}

    def restore(self, blobs: dict) -> None:
        """The output log a snapshot's residue held (frames stay encoded); the spill is dropped."""
        self._drop_spill()
        self.frames = {}
        self.mem = 0
        for d, blob in blobs.items():
            q = deque([int(seq), frame] for seq, frame in unpack_residue(blob))
            self.frames[int(d)] = q
            self.mem += sum(len(f) for _, f in q)
            if q:
                self.restored[int(d)] = q[-1][0]

    def count(self) -> int:
        """The number of frames kept, over every destination."""
        return sum(len(q) for q in self.frames.values())

    def _bytes(self, frame: bytes | tuple) -> bytes:
        if type(frame) is bytes:
            return frame
        seg, off, n = frame
        return seg.read(off, n)

    def _spill_oldest(self) -> None:
        """Writes the oldest frames in memory to the spill until half the bound is left."""
        if not self._dir_made:
            self._open_spill()
        for d, q in self.frames.items():
            if self.mem <= self.max_bytes // 2:
                break
            written = 0
            for item in islice(q, self._on_disk.get(d, 0), None):
                if self.mem <= self.max_bytes // 2:
                    break
                frame = item[1]
                seg = self._segment_for(d, len(frame))
                seg.file.write(frame)
                item[1] = (seg, seg.size, len(frame))
                seg.size += len(frame)
                seg.live += 1
                self.mem -= len(frame)
                written += 1
            self._on_disk[d] = self._on_disk.get(d, 0) + written
            self.spilled += written
        for seg in self._tail.values():
            seg.file.flush()

    def _segment_for(self, dest: int, n: int) -> _Segment:
        """The segment `dest`'s next frame of `n` bytes goes to: a new one past `segment_bytes`."""
        seg = self._tail.get(dest)
        if seg is not None and (seg.size == 0 or seg.size + n <= self.segment_bytes):
            return seg
        if seg is not None:
            seg.file.flush()
        self._serial += 1
        seg = self._tail[dest] = _Segment(os.path.join(self.spill_path, f"d{dest}-{self._serial:06d}.seg"), dest)
        self._segments.add(seg)
        return seg

    def _open_spill(self) -> None:
        """Makes the spill's directory, emptied of the segments a log of the same path left."""
        os.makedirs(self.spill_path, exist_ok=True)
        for name in os.listdir(self.spill_path):
            if name.endswith(".seg"):
                os.unlink(os.path.join(self.spill_path, name))
        self._dir_made = True

    def _drop(self, seg: _Segment) -> None:
        """Deletes a segment none of whose frames is kept."""
        self._segments.discard(seg)
        if self._tail.get(seg.dest) is seg:
            del self._tail[seg.dest]
        seg.drop()

    def _drop_spill(self) -> None:
        for seg in list(self._segments):
            self._drop(seg)
        self._on_disk = {}

    def close(self) -> None:
        """Deletes the spill (the log is not used after: its spilled frames are gone)."""
        self._drop_spill()
        try:
            os.rmdir(self.spill_path)
        except OSError:
            pass  # never made, or holds files of another's
