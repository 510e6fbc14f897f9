"""The sending end of an exchange edge: records to their key's worker, in frames."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from nosync import codec
from nosync.errors import RunFailed
from nosync.runtime import frames
from nosync.runtime.graph import partition_of
from nosync.runtime.operators import Op

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker


class Router:
    """The sending end of one exchange edge on one worker: each record goes to its key's worker,
    in frames; the share that stays here is passed on decoded from the same encoding
    (`frames.wire_records`), so that the operator gets the same records either way."""

    def __init__(self, worker: Worker, edge: int, src: Op, dst: Op) -> None:
        self.w = worker
        self.edge = edge
        self.dst = dst
        self.sender = f"operator '{src.name}' (declared at {src.node.where})"
        self.n = worker.workers
        self.me = worker.index
        self.local_chan = ("x", edge, self.me)
        self.cache: dict = {}
        self.buffers: list[list] = [[] for _ in range(self.n)]
        self.buffer_epoch = [-1] * self.n
        self.buffer_since = [0.0] * self.n

    def push(self, records: list, epoch: int, _chan: Any) -> None:
        """Sends each record to its key's worker: the local share to the operator at once, the rest
        buffered per destination and framed when a buffer is full or its epoch changes."""
        n = self.n
        if n == 1:
            self.dst.push(frames.wire_records(records, self.sender), epoch, self.local_chan)
            return
        cache = self.cache
        if len(cache) > 1_000_000:
            cache.clear()
        get = cache.get
        buckets: list[list] = [[] for _ in range(n)]
        for rec in records:
            k = rec[0]
            try:
                d = get(k)
            except TypeError:  # a key holding a list: it goes where its tuple form goes
                d = partition_of(k, n)
            if d is None:
                d = cache[k] = partition_of(k, n)
            buckets[d].append(rec)
        me = self.me
        bufs = self.buffers
        for d in range(n):
            b = buckets[d]
            if not b:
                continue
            if d == me:
                self.dst.push(frames.wire_records(b, self.sender), epoch, self.local_chan)
                continue
            if self.buffer_epoch[d] != epoch and bufs[d]:
                self.send_buffer(d)
            if not bufs[d]:
                self.buffer_since[d] = time.monotonic()
            bufs[d].extend(b)
            self.buffer_epoch[d] = epoch
            if len(bufs[d]) >= self.w.batch_size:
                self.send_buffer(d)

    def send_buffer(self, d: int) -> None:
        """Sends what the buffer for worker `d` holds, in frames (nothing when it is empty)."""
        recs = self.buffers[d]
        if not recs:
            return
        self.buffers[d] = []
        self._send_records(d, recs, frames.pack_records(recs, self.sender))

    def _send_records(self, d: int, recs: list, data: bytes) -> None:
        """One frame of `recs` (packed: `data`), or, when they do not fit in one, the frames of
        each half (large records: the buffer counts records, not bytes)."""
        if len(data) > frames.MAX_BODY:
            if len(recs) == 1:
                raise RunFailed(
                    f"a record of {len(data):,} bytes on its way to operator '{self.dst.name}' does not fit "
                    f"in a frame ({frames.MAX_BODY:,} bytes at most)"
                )
            half = len(recs) // 2
            for part in (recs[:half], recs[half:]):
                self._send_records(d, part, frames.pack_records(part, self.sender))
            return
        w = self.w
        w.hooks.send_frame(
            w, d, frames.DATA, {"edge": self.edge, "epoch": self.buffer_epoch[d], "ts": w.clock.ts}, data
        )

    def due(self, older_than: float) -> list[int]:
        """The destinations whose buffer is older than `older_than` seconds."""
        now = time.monotonic()
        return [d for d in range(self.n) if self.buffers[d] and now - self.buffer_since[d] >= older_than]

    def flush(self, older_than: float | None = None) -> None:
        """Sends the buffers older than `older_than` seconds (None: every buffer)."""
        now = time.monotonic()
        for d in range(self.n):
            if self.buffers[d] and (older_than is None or now - self.buffer_since[d] >= older_than):
                self.send_buffer(d)

    def _broadcast(self, kind: int, header: dict, body: Any = None) -> None:
        self.flush()
        w = self.w
        data = codec.pack(body)
        for d in range(self.n):
            if d != self.me:
                w.hooks.send_frame(w, d, kind, header, data)

    def marker(self, _chan: Any, epoch: int, wm: Any, eos: bool) -> None:
        """Sends a marker to every other worker, after the buffers, and passes
        it to the local operator."""
        self._broadcast(frames.MARKER, {"edge": self.edge, "epoch": epoch, "wm": wm, "eos": eos})
        self.dst.marker(self.local_chan, epoch, wm, eos)

    def event(self, _chan: Any, ev: dict) -> None:
        """Sends an in-band event to every other worker, after the buffers, and passes
        it to the local operator."""
        self._broadcast(frames.EVENT, {"edge": self.edge}, ev)
        self.dst.event(self.local_chan, ev)


class FeedbackRouter(Router):
    """A loop's back edge on one worker: the records its tail keeps go to the head of the same
    worker (decoded from their wire form, as an exchange's local share is); its reports on
    each wave and its in-band events go to every worker's head (`marker`, `event`)."""

    def push(self, records: list, epoch: int, _chan: Any) -> None:
        """The records kept, to this worker's head."""
        self.dst.push(frames.wire_records(records, self.sender), epoch, self.local_chan)
