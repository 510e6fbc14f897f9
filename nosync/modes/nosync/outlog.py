"""The output log: every frame a worker sent, kept for its receiver (upstream backup).

Per destination, the frames in chan_seq order, in memory, until the receiver's durable point
covers them (`trim`); nothing of it is written in steady state. A snapshot writes the residue
(`residue`): the frames still uncovered when it is taken, one compressed blob per destination,
so that a sender restored from that snapshot can still serve a receiver that recovers later.
Past `max_bytes` in memory, the oldest frames go to a spill file of this process (read back if
a receiver asks for them again); a restarted process starts a new one, its snapshot's residue
holding what it needs.
"""

from __future__ import annotations

import os
from collections import deque

from nosync.state.layout import pack_residue, unpack_residue


class OutputLog:
    """One worker's output log: per destination, the frames it sent in chan_seq order, in memory
    or spilled, until trimmed."""

    def __init__(self, spill_path: str, max_bytes: int) -> None:
        self.spill_path = spill_path
        self.max_bytes = max_bytes
        self.frames: dict[int, deque] = {}
        """Per destination, [chan_seq, frame] items; the frame is (offset, length) once spilled."""
        self.mem = 0
        self.peak = 0
        """The most bytes the log held in memory at once."""
        self.spilled = 0
        self.restored: dict[int, int] = {}
        """Per destination, the last chan_seq a restored residue held."""
        self.resent_from_residue = 0
        self._spill = None
        self._spill_end = 0

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
        """Drops the frames to `dest` up to chan_seq `upto` (its durable point covers them)."""
        q = self.frames.get(dest)
        while q and q[0][0] <= upto:
            _, frame = q.popleft()
            if type(frame) is bytes:
                self.mem -= len(frame)

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
        (`layout.pack_residue`)."""
        return {d: pack_residue([[seq, self._bytes(f)] for seq, f in q]) for d, q in self.frames.items()}

    def restore(self, blobs: dict) -> None:
        """The output log a snapshot's residue held (frames stay encoded)."""
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

    def _bytes(self, frame: bytes | list) -> bytes:
        if type(frame) is bytes:
            return frame
        off, n = frame
        with open(self.spill_path, "rb") as f:
            f.seek(off)
            return f.read(n)

    def _spill_oldest(self) -> None:
        """Writes the oldest frames in memory to the spill file until half the bound is left."""
        if self._spill is None:
            os.makedirs(os.path.dirname(self.spill_path), exist_ok=True)
            self._spill = open(self.spill_path, "wb")  # noqa: SIM115 - closed by close()
            self._spill_end = 0
        items = (item for q in self.frames.values() for item in q if type(item[1]) is bytes)
        for item in items:
            if self.mem <= self.max_bytes // 2:
                break
            frame = item[1]
            self._spill.write(frame)
            item[1] = [self._spill_end, len(frame)]
            self._spill_end += len(frame)
            self.mem -= len(frame)
            self.spilled += 1
        self._spill.flush()

    def close(self) -> None:
        """Closes the spill file, if one was opened."""
        if self._spill is not None:
            self._spill.close()
            self._spill = None
