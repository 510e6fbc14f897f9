"""The replicated peer-memory level: a worker's store copied into the memory of R peers.

Each worker sends what its persister logs (`lsm.StoreOptions.on_logged`: the log records, as
written) to its R holders, the workers `index + 1 .. index + R` (mod W), over the data
connections it already has, in REPLICA frames that need no credit. A holder keeps a copy per
worker and store in memory - a base image and the records after it - bounded by a budget, and
acknowledges the last seq it holds. A store's seq counts as durable at level `replicated`
once every holder acknowledged it (`durable`).

A holder starts with no copy. The first thing a worker sends a holder is a base image of its
store (`lsm.Store.image`: its runs as stored and the batches not yet on its disk tier, nothing
decoded, read on a thread of its own; at the start of a run it is empty),
then the records after it; a `put` names the seq its records follow (`prev`), so a holder
whose copy does not end there (it restarted and lost its memory, or the sender recovered from
another copy) asks for a base again. A holder over its budget says so (`full`): the sender
sends a fresh base image, which replaces the records it covers; a base over the budget stops
that holder's acknowledgements (the level stops advancing, and the metrics say why).

A worker that restarts without its local store (a lost machine) asks its holders for their
copies (`fetch`), takes the one that goes furthest, and seeds its store directory from it
(`lsm.seed`) before it opens the store; its remote tier, if it has one, adds what it holds
beyond. Every other frame that arrives meanwhile is held back for after the restore. A holder
whose copy ends where the opened store does keeps it and gets the records after it, with no
base image (`add_store`).

Bodies bigger than a frame travel in parts (`CHUNK` bytes), one blob of msgpack per message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import lsm
from nosync.codec import pack, unpack
from nosync.errors import FrameError
from nosync.runtime import frames

if TYPE_CHECKING:
    from nosync.runtime.worker import Worker

log = logging.getLogger("nosync.replicas")

CHUNK = 16 << 20
"""The most bytes of a message's blob one REPLICA frame carries."""
FETCH_TIMEOUT_S = 60.0
"""How long a restarting worker waits for its holders' copies before it goes on with the ones
it got (and its remote tier)."""


def holders_of(index: int, workers: int, replicas: int) -> list[int]:
    """The workers that hold copies of worker `index`'s stores."""
    return [(index + k) % workers for k in range(1, replicas + 1)]


class Copy:
    """What a holder keeps of one store of another worker: a base image and the records after it."""

    __slots__ = ("base", "records", "nbytes", "last")

    def __init__(self, base: lsm.Image) -> None:
        self.base = base
        self.records: list[tuple[int, bytes]] = []
        self.nbytes = sum(len(a) + len(b) for a, b in base.rows) + sum(len(b) for _, b in base.records)
        self.last = base.seq

    def wire(self) -> dict:
        """The copy as a msgpack-able map (`fetch`'s answer)."""
        return {"base": image_wire(self.base), "records": [list(r) for r in self.records]}


def image_wire(img: lsm.Image) -> list:
    """An image as a msgpack-able list."""
    applied = img.seq if img.applied is None else img.applied
    return [img.seq, img.horizon, [list(r) for r in img.rows], [list(r) for r in img.records], applied]


def image_of(w: Any) -> lsm.Image:
    """The image `image_wire` made `w` of."""
    seq, horizon, rows, records, applied = w
    return lsm.Image(
        int(seq),
        int(horizon),
        [(bytes(a), bytes(b)) for a, b in rows],
        [(int(s), bytes(b)) for s, b in records],
        int(applied),
    )


def copy_of(d: dict) -> tuple[lsm.Image, list[tuple[int, bytes]]]:
    """The base image and records of a copy's wire map."""
    return image_of(d["base"]), [(int(s), bytes(b)) for s, b in d["records"]]


class Replicas:
    """Both halves of the level on one worker: the sender of its own stores' records to its
    holders, and the holder of the copies other workers send it. Lives as long as the worker's
    process (a holder's copies outlast a generation); one thread calls it, but `logged`, which
    the stores' persisters call."""

    def __init__(self, index: int, workers: int, replicas: int, budget_bytes: int) -> None:
        self.me = index
        self.holders = holders_of(index, workers, replicas)
        self.budget = budget_bytes
        # -- the sender
        self.stores: dict[str, Any] = {}
        self.inbox: deque = deque()
        """(store, seq, body) the persisters logged, for the processing thread to send."""
        self.gap_s = 0.0
        """The least time between two sends of what was logged (0: at every poll)."""
        self._sent_at = 0.0
        self.state = {j: "base" for j in self.holders}
        """Per holder: "base" (needs a base image), "basing" (one is being made), "live", "over"
        (its budget cannot take a base image: no more acknowledgements), "adopted" (its copy,
        which this worker's store was seeded from, is kept: live once its link is up)."""
        self.sent: dict[int, dict[str, int]] = {j: {} for j in self.holders}
        self.acked: dict[int, dict[str, int]] = {j: {} for j in self.holders}
        self.queued: dict[int, list] = {j: [] for j in self.holders}
        """Per holder being based: what was logged since its base image was asked for."""
        self.job: dict | None = None
        self.rebases = 0
        self.sent_bytes = 0
        self.holder_losses = 0
        self.over: dict[int, str] = {}
        # -- the holder
        self.held: dict[int, dict[str, Copy]] = {}
        self.held_peak = 0
        self.parts: dict[int, list] = {}
        self.asked: dict[int, int | None] = {}
        """Per worker that asked for its copies: its attempt, until they are sent."""
        # -- a fetch
        self.got: dict[int, dict] | None = None
        self.fetched: dict[int, dict[str, int]] = {}
        """Per holder that answered a fetch: the last seq of its copy of each store."""

    # -- the sender ---------------------------------------------------------------------

    def add_store(self, name: str, store: Any) -> None:
        """Replicates `store` under `name`. After a `fetch`, a holder whose copy ends at the
        store's last seq keeps it (adopted): it holds what the store holds, so it needs no
        base image, only the records logged from now on."""
        self.stores[name] = store
        for j, lasts in self.fetched.items():
            if lasts.get(name) == store.last_seq >= 0 and self.state.get(j) == "base":
                self.state[j] = "adopted"
                self.sent[j][name] = self.acked[j][name] = store.last_seq
                self.queued[j] = []

    def logged(self, name: str, records: list[tuple[int, bytes]]) -> None:
        """The persister of store `name` logged `records` (its thread; thread-safe)."""
        for seq, body in records:
            self.inbox.append((name, seq, body))

    def durable(self, name: str) -> int:
        """The highest seq of store `name` that every holder acknowledged (-1: none)."""
        return min((self.acked[j].get(name, -1) for j in self.holders), default=-1)

    def poll(self, worker: Worker, up: Any) -> None:
        """Sends what was logged to the holders whose link is up (`up(j)`), base images first
        where they need one, and answers fetches whose asker is connected now."""
        new: dict[str, list] = {}
        now = time.monotonic()
        if not self.gap_s or now - self._sent_at >= self.gap_s:
            # what was logged waits `gap_s` between two sends (the level fell behind:
            # `LevelPacer`), then goes in one
            self._sent_at = now
            while self.inbox:
                name, seq, body = self.inbox.popleft()
                new.setdefault(name, []).append((seq, body))
        for j in self.holders:
            st = self.state[j]
            if st == "adopted":
                # links come up after a restart: what is logged waits for them (a holder lost
                # meanwhile answers the first put with need_base)
                for name, recs in new.items():
                    self.queued[j].extend((name, seq, body) for seq, body in recs)
                if up(j):
                    self.state[j] = "live"
                    self._put_queued(worker, j)
                continue
            if not up(j):
                if st in ("live", "basing"):
                    # a holder whose link went lost its memory with its process: a base again
                    self.holder_losses += 1
                    self.state[j] = "base"
                    self.queued[j] = []
                continue
            if st == "live":
                for name, recs in new.items():
                    self._put(worker, j, name, recs)
            elif st == "basing":
                for name, recs in new.items():
                    self.queued[j].extend((name, seq, body) for seq, body in recs)
        job = self.job
        if job is not None and job["done"].is_set():
            self.job = None
            self._send_bases(worker, job, up)
        if self.job is None:
            waiting = [j for j in self.holders if self.state[j] == "base" and up(j)]
            if waiting:
                # what is logged from now on goes after the image (whose seq is at least the
                # last appended now); what was logged before is in it
                for j in waiting:
                    self.state[j] = "basing"
                    self.queued[j] = []
                self._start_images(waiting)
        self.serve(worker)

    def _start_images(self, waiting: list[int]) -> None:
        job: dict = {"done": threading.Event(), "images": {}, "error": None, "for": set(waiting)}

        def make() -> None:
            try:
                for name, store in list(self.stores.items()):
                    job["images"][name] = store.image()
            except Exception as e:  # noqa: BLE001 - reported on the processing thread
                job["error"] = e
            finally:
                job["done"].set()

        self.job = job
        threading.Thread(target=make, name="nosync-replica-image", daemon=True).start()

    def _send_bases(self, worker: Worker, job: dict, up: Any) -> None:
        if job["error"] is not None:
            log.warning("worker %s: a base image for its holders failed: %s", self.me, job["error"])
            for j in job["for"]:
                if self.state[j] == "basing":
                    self.state[j] = "base"
            return
        images: dict[str, lsm.Image] = job["images"]
        for j in self.holders:
            if j not in job["for"] or self.state[j] != "basing" or not up(j):
                continue
            for name, img in images.items():
                self._send(worker, j, {"op": "base", "store": name}, image_wire(img))
                self.sent[j][name] = img.seq
            self.state[j] = "live"
            self.rebases += 1
            self._put_queued(worker, j)

    def _put_queued(self, worker: Worker, j: int) -> None:
        """Sends holder `j` what was queued for it (`_put` skips what its copy holds)."""
        later: dict[str, list] = {}
        for name, seq, body in self.queued[j]:
            later.setdefault(name, []).append((seq, body))
        self.queued[j] = []
        for name, recs in later.items():
            self._put(worker, j, name, recs)

    def _put(self, worker: Worker, j: int, name: str, recs: list) -> None:
        prev = self.sent[j].get(name, -1)
        recs = [r for r in recs if r[0] > prev]
        if not recs:
            return
        self._send(worker, j, {"op": "put", "store": name, "prev": prev}, recs)
        self.sent[j][name] = recs[-1][0]

    def _send(self, worker: Worker, j: int, header: dict, body: Any) -> None:
        conn = worker.out.get(j)
        if conn is None or conn.closed:
            return
        blob = pack(body)
        n = max(1, -(-len(blob) // CHUNK))
        for k in range(n):
            part = blob[k * CHUNK : (k + 1) * CHUNK]
            conn.send_uncounted(frames.encode(frames.REPLICA, {**header, "part": k, "parts": n}, part))
        self.sent_bytes += len(blob)

    def _on_answer(self, j: int, h: dict) -> None:
        """A holder's acknowledgement, or its request for a base image."""
        if j not in self.state:
            return
        name = h.get("store")
        if h["op"] == "ack":
            self.acked[j][name] = max(self.acked[j].get(name, -1), int(h["seq"]))
        elif h["op"] == "need_base" and self.state[j] == "live":
            self.state[j] = "base"
        elif h["op"] == "full" and self.state[j] == "live":
            if h.get("base"):
                # not even a base image fits: this holder acknowledges nothing more
                self.state[j] = "over"
                budget = int(h.get("budget", self.budget))
                self.over[j] = f"worker {j}'s replica budget ({budget >> 20} MB) is smaller than a base image"
            else:
                self.state[j] = "base"

    # -- the holder ---------------------------------------------------------------------

    def on_frame(self, worker: Worker, j: int, f: frames.Frame) -> None:
        """A REPLICA frame from worker `j`: a part of a message, taken when it is whole."""
        h = f.header
        op = h.get("op")
        if op in ("ack", "need_base", "full"):
            self._on_answer(j, h)
            return
        if op == "fetch":
            self.asked[j] = h.get("attempt")
            self.serve(worker)
            return
        if int(h.get("part", 0)) == 0:
            # a first part starts a message: what a lost link cut short of the last one goes
            self.parts[j] = []
        parts = self.parts.setdefault(j, [])
        if not isinstance(f.body, bytes):
            raise FrameError(f"a replica frame from worker {j} has a body of {type(f.body).__name__}, not bytes")
        parts.append(f.body)
        if int(h.get("part", 0)) + 1 < int(h.get("parts", 1)):
            return
        body = unpack(b"".join(parts))
        self.parts[j] = []
        if op == "copy":
            if self.got is not None:
                self.got[j] = body
            return
        name = h.get("store")
        copies = self.held.setdefault(j, {})
        if op == "base":
            c = Copy(image_of(body))
            if self._total() - (copies[name].nbytes if name in copies else 0) + c.nbytes > self.budget:
                copies.pop(name, None)
                self._answer(worker, j, {"op": "full", "store": name, "base": True, "budget": self.budget})
                return
            copies[name] = c
        elif op == "put":
            c = copies.get(name)
            if c is None or c.last != int(h["prev"]):
                self._answer(worker, j, {"op": "need_base", "store": name})
                return
            recs = [(int(s), bytes(b)) for s, b in body]
            size = sum(len(b) for _, b in recs)
            if self._total() + size > self.budget:
                self._answer(worker, j, {"op": "full", "store": name})
                return
            c.records.extend(recs)
            c.nbytes += size
            c.last = recs[-1][0]
        else:
            raise FrameError(f"a replica frame from worker {j} has the unknown op {op!r}")
        self.held_peak = max(self.held_peak, self._total())
        self._answer(worker, j, {"op": "ack", "store": name, "seq": copies[name].last})

    def _total(self) -> int:
        return sum(c.nbytes for copies in self.held.values() for c in copies.values())

    def _answer(self, worker: Worker, j: int, header: dict) -> None:
        conn = worker.out.get(j)
        if conn is not None and not conn.closed:
            conn.send_uncounted(frames.encode(frames.REPLICA, header))

    def serve(self, worker: Worker) -> None:
        """Sends each worker that asked for its copies what this worker holds of it, once
        connected to the attempt that asked."""
        for j, attempt in list(self.asked.items()):
            conn = worker.out.get(j)
            if conn is None or conn.closed:
                continue
            if attempt is not None and getattr(conn, "attempt", None) not in (None, attempt):
                continue
            del self.asked[j]
            copies = {name: c.wire() for name, c in self.held.get(j, {}).items()}
            self._send(worker, j, {"op": "copy"}, copies)

    # -- a fetch --------------------------------------------------------------------

    def fetch(self, worker: Worker, pump: Any) -> dict[str, tuple[lsm.Image, list]]:
        """Asks every holder for its copies of this worker's stores and waits (pumping) for
        their answers; returns, per store, the copy that goes furthest (none: no holder had
        one)."""
        self.got = {}
        try:
            for j in self.holders:
                conn = worker.out.get(j)
                if conn is not None and not conn.closed:
                    conn.send_uncounted(frames.encode(frames.REPLICA, {"op": "fetch", "attempt": worker.attempt}))
            deadline = time.monotonic() + FETCH_TIMEOUT_S
            while len(self.got) < len(self.holders) and time.monotonic() < deadline:
                pump(0.02)
            best: dict[str, tuple[lsm.Image, list]] = {}
            for j, copies in sorted(self.got.items()):
                for name, d in copies.items():
                    img, recs = copy_of(d)
                    last = recs[-1][0] if recs else img.seq
                    self.fetched.setdefault(j, {})[name] = last
                    old = best.get(name)
                    if old is None or last > (old[1][-1][0] if old[1] else old[0].seq):
                        best[name] = (img, recs)
            return best
        finally:
            self.got = None

    def metrics(self) -> dict:
        """What the level sent, holds and could not do."""
        return {
            "replica_bytes_sent": self.sent_bytes,
            "replica_base_images": self.rebases,
            "replica_bytes_held_peak": self.held_peak,
            "replica_holders_over_budget": dict(self.over),
            "replica_holder_losses": self.holder_losses,
        }
