"""The worker: one long-running Spark task that runs one instance of every operator.

Start-up: connect to the coordinator (authenticated), register with the address of a listening
socket, and wait for the peers of a membership generation. A generation is one set of data
connections: for each, the worker opens one connection to every peer (and accepts one from
each, checking that it names the same generation), builds the operators afresh, and lets the
mode restore them (`on_start`). Then one thread runs the loop below until the coordinator says
finish, or says rejoin: a worker was lost, so every data connection is dropped (frames of the
old generation are never read again) and the worker registers for the next generation. A
worker that Spark started again (attempt > 0) joins the generation the coordinator is in.

The loop:

1. read what arrived: data frames go to the operator behind their edge, markers advance
   frontiers, events (barriers) go in-band to their operator, credits release queued frames,
   control messages go to the worker or the mode;
2. if no outgoing channel is over its backlog bound, read one chunk from a source partition
   and push it through the operators (forward edges are direct calls; exchange edges go to a
   Router, which keeps the local share and frames the rest per destination);
3. flush router buffers older than the linger time, write what the sockets take, let the
   mode poll (durable snapshots);
4. every HEARTBEAT_S, send counters to the coordinator.

No thread is started per record or per batch; the only extra thread accepts peer connections
while a generation is set up.
"""

from __future__ import annotations

import logging
import os
import resource
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import xxhash

from nosync.api.loader import load_pipeline
from nosync.api.plan import PhysicalPlan, plan
from nosync.errors import AuthError, BadRecord, FrameError, PeerLost, RunFailed
from nosync.modes import worker_hooks
from nosync.runtime import channels, frames
from nosync.runtime.operators import (
    EOS,
    IterateOp,
    JoinOp,
    Op,
    SinkOp,
    make_op,
)

log = logging.getLogger("nosync.runtime.worker")

HEARTBEAT_S = 0.1
MAX_BACKLOG_FRAMES = 2 * channels.INITIAL_CREDITS
SETUP_TIMEOUT_S = 120.0


class Clock:
    """The ingest time of the batch being processed (for end-to-end latency)."""

    __slots__ = ("ts",)

    def __init__(self) -> None:
        self.ts = 0.0


def key_hash(key: Any) -> int:
    """xxhash64 of the bytes of `key` (a list hashes as the tuple of its items)."""
    if type(key) is str:
        data = key.encode("utf-8", "surrogatepass")
    elif type(key) is bytes:
        data = key
    elif type(key) is int:
        data = key.to_bytes(16, "little", signed=True)
    else:
        data = msgpack.packb(key, use_bin_type=True)
    return xxhash.xxh64_intdigest(data)


def partition_of(key: Any, workers: int) -> int:
    """The worker that owns `key`: its hash modulo W."""
    return key_hash(key) % workers


def build_ops(
    p: PhysicalPlan, keep: set[int] | None, source_op: Callable, sink_op: Callable, hooks: Any
) -> tuple[list[Op], dict[int, Op]]:
    """One instance of every operator of `p` (or of the nodes in `keep`), in node order, with
    the loops wired to their iterate operators; the edges are the caller's (`graph_edges`)."""
    ops: list[Op] = []
    by_id: dict[int, Op] = {}
    for n in p.pipeline.nodes:
        if keep is not None and n.id not in keep:
            continue
        if n.kind == "source":
            op: Op = source_op(n)
        elif n.kind == "sink":
            op = sink_op(n)
        elif n.kind == "join":
            op = JoinOp(n, set())
        elif n.kind == "iterate":
            op = IterateOp(n, [])
        else:
            op = make_op(n)
        op.hooks = hooks
        op.track_dirty = hooks.tracks_dirty and hasattr(op, "dirty")
        if op.track_dirty and isinstance(op, JoinOp):
            # a join's sides only grow: what a batch appended is its update, not its sides
            op.incremental, op.track_dirty = True, False
        op.align_epochs = hooks.aligns_epochs and n.kind != "loop_entry" and not n.params.get("loop_internal")
        ops.append(op)
        by_id[n.id] = op
    for n in p.pipeline.nodes:
        if n.kind == "iterate" and n.id in by_id:
            by_id[n.id].wire(by_id[n.params["entry"]], by_id[n.params["exit"]])
    return ops, by_id


def graph_edges(p: PhysicalPlan) -> list[Any]:
    """The edges that carry records between operator instances (the entry of a loop is fed
    by its iterate operator, not by its edge)."""
    nodes = p.pipeline.nodes
    loop_nodes = {i for n in nodes if n.kind == "iterate" for i in n.params["body"]} | {
        n.params["entry"] for n in nodes if n.kind == "iterate"
    }
    return [e for e in p.edges if not (e.dst in loop_nodes and nodes[e.dst].kind == "loop_entry")]


def edge_channels(e: Any, workers: int) -> list[Any]:
    """The input channels edge `e` gives its consumer: one per sending worker on an exchange."""
    return [("x", e.id, w) for w in range(workers)] if e.exchange else [("f", e.id)]


def add_edge_input(dst: Op, e: Any, workers: int) -> None:
    left = isinstance(dst, JoinOp) and e.port == 0
    for chan in edge_channels(e, workers):
        dst.add_input(chan)
        if left:
            dst.left_channels.add(chan)


def finish_loops(p: PhysicalPlan, by_id: dict[int, Op]) -> None:
    for n in p.pipeline.nodes:
        if n.kind == "loop_entry" and n.id in by_id:
            by_id[n.id].add_input("loop")


class Rejoin(Exception):
    """The coordinator moved the run to generation `gen`: drop the data connections."""

    def __init__(self, gen: int) -> None:
        super().__init__(f"rejoin generation {gen}")
        self.gen = gen


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
                self._send(d)
            if not bufs[d]:
                self.buffer_since[d] = time.monotonic()
            bufs[d].extend(b)
            self.buffer_epoch[d] = epoch
            if len(bufs[d]) >= self.w.batch_size:
                self._send(d)

    def _send(self, d: int) -> None:
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
        now = time.monotonic()
        for d in range(self.n):
            if self.buffers[d] and (older_than is None or now - self.buffer_since[d] >= older_than):
                self._send(d)

    def _broadcast(self, kind: int, header: dict, body: Any = None) -> None:
        self.flush()
        w = self.w
        data = msgpack.packb(body, use_bin_type=True)
        for d in range(self.n):
            if d != self.me:
                w.hooks.send_frame(w, d, kind, header, data)

    def marker(self, _chan: Any, epoch: int, wm: Any, eos: bool) -> None:
        self._broadcast(frames.MARKER, {"edge": self.edge, "epoch": epoch, "wm": wm, "eos": eos})
        self.dst.marker(self.local_chan, epoch, wm, eos)

    def event(self, _chan: Any, ev: dict) -> None:
        self._broadcast(frames.EVENT, {"edge": self.edge}, ev)
        self.dst.event(self.local_chan, ev)


class SourceOp(Op):
    """Reads this worker's partitions of one source, epoch by epoch, round robin.

    A partition's position names exactly the next record to read: `[offset, skip]`, where
    `offset` is where `source.read` starts the chunk being consumed and `skip` counts the
    records of it already emitted. Every source reads the same chunks again from the same
    offset, so a restart from a position emits exactly the records after it.
    """

    def __init__(self, node: Any, parts: list[dict], worker: Worker) -> None:
        super().__init__(node)
        self.source = node.params["source"]
        self.w = worker
        self.parts = [
            {"part": p, "iter": None, "offset": None, "skip": 0, "chunk": None, "next": None, "read": 0, "done": False}
            for p in parts
        ]
        self.epoch = 0
        self.started = time.monotonic()
        self.finished = False
        self._mute = False

    def _on_bad(self, bad: BadRecord) -> None:
        if not self._mute:
            self.w.dead_letter(self.name, bad)

    def _next_chunk(self, st: dict, limit: int) -> list:
        """Up to `limit` records of the partition, from its position on."""
        chunk = st["chunk"]
        while chunk is None or st["skip"] >= len(chunk):
            drop = 0
            if chunk is not None:
                # consumed whole: the next chunk starts where this one said
                st["offset"], st["skip"], st["chunk"] = st["next"], 0, None
            if st["iter"] is None:
                # (re)opened at a position: the records of its first chunk already emitted go
                st["iter"] = self.source.read(st["part"], st["offset"], self.w.batch_size, self._on_bad)
                drop = st["skip"]
            # a chunk read again from a position inside it was read whole before: its bad
            # records went to the dead letters then
            self._mute = drop > 0
            try:
                recs, st["next"] = next(st["iter"])
            except StopIteration:
                st["done"] = True
                return []
            finally:
                self._mute = False
            chunk = st["chunk"] = recs
            st["skip"] = drop
        i = st["skip"]
        recs = chunk[i : i + limit]
        st["skip"] = i + len(recs)
        return recs

    def time_epoch(self) -> int:
        """The epoch the clock says (sources cut by --epoch-ms)."""
        return int((time.monotonic() - self.started) * 1000 // self.w.epoch_ms)

    def poll(self, now_epoch: int | None = None) -> bool:
        """Reads and pushes one chunk; returns False once the source is exhausted. With
        --epoch-ms, `now_epoch` is the clock's epoch to use (a replay repeats the one logged)."""
        if self.finished:
            return False
        w = self.w
        per_epoch = w.epoch_records
        if w.epoch_ms:
            e = self.time_epoch() if now_epoch is None else now_epoch
            if e > self.epoch:
                self._close_epoch(e - 1)
                self.epoch = e
        for st in self.parts:
            if st["done"]:
                continue
            limit = w.batch_size
            if not w.epoch_ms:
                room = (self.epoch + 1) * per_epoch - st["read"]
                if room <= 0:
                    continue
                limit = min(limit, room)
            recs = self._next_chunk(st, limit)
            if recs:
                st["read"] += len(recs)
                w.clock.ts = time.time()
                if w.first_read_at is None:
                    w.first_read_at = w.clock.ts
                self.records_in += len(recs)
                self.emit(recs, self.epoch)
                if w.slow_s:
                    time.sleep(w.slow_s)
                return True
            if not st["done"]:
                return True
        if all(st["done"] for st in self.parts):
            self.finished = True
            self._close_epoch(EOS)
            return False
        if not w.epoch_ms:
            self._close_epoch(self.epoch)
            self.epoch += 1
        return True

    def _close_epoch(self, epoch: int) -> None:
        self.frontier = epoch
        for _, mark, _, chan in self.targets:
            mark(chan, epoch, None, epoch == EOS)

    def snapshot_meta(self) -> dict:
        return {
            **super().snapshot_meta(),
            "epoch": self.epoch,
            "finished": self.finished,
            "records_in": self.records_in,
            "parts": [[st["offset"], st["skip"], st["read"], st["done"]] for st in self.parts],
        }

    def restore_meta(self, meta: dict) -> None:
        super().restore_meta(meta)
        self.epoch = meta["epoch"]
        self.finished = meta["finished"]
        self.records_in = meta["records_in"]
        if len(meta["parts"]) != len(self.parts):
            raise RunFailed(
                f"source '{self.name}': the checkpoint has {len(meta['parts'])} partitions on this worker, "
                f"the pipeline now has {len(self.parts)}"
            )
        for st, (offset, skip, read, done) in zip(self.parts, meta["parts"], strict=True):
            st.update(offset=offset, skip=skip, read=read, done=done, iter=None, chunk=None, next=None)


class Worker:
    router_class = Router

    def __init__(self, index: int, attempt: int, spec: dict) -> None:
        self.index = index
        self.attempt = attempt
        self.spec = spec
        self.workers = spec["workers"]
        self.secret = spec["secret"]
        self.batch_size = spec.get("batch_size", 1024)
        self.linger_s = spec.get("linger_ms", 5) / 1000
        self.epoch_records = spec.get("epoch_records") or 10_000
        self.epoch_ms = spec.get("epoch_ms") or 0
        slow = spec.get("slow_worker")
        self.slow_s = slow[1] / 1000 if slow and slow[0] == index else 0.0
        """A straggler for benchmarks: this worker's sources wait after every batch."""
        self.clock = Clock()
        self.out: dict[int, channels.Connection] = {}
        self.inc: dict[int, channels.Connection] = {}
        self.ops: list[Op] = []
        self.by_id: dict[int, Op] = {}
        self.routers: list[Router] = []
        self.sources: list[SourceOp] = []
        self.sinks: list[SinkOp] = []
        self.hooks = worker_hooks(spec["mode"], spec.get("mode_options") or {})
        self.dead_letters = 0
        self.first_read_at: float | None = None
        self.gen = -1
        self.generations = 0
        self._parts: dict[int, Any] = {}
        self._dl_file = None
        self._pending_credits: dict[int, int] = {}
        self._credited_ahead: dict[int, int] = {}
        self._latencies: list = []
        self._last_commit_at: float | None = None
        self._next_beat = 0.0
        self._rejoin: int | None = None
        self._finish = False
        self._done_sent = False
        self._ready_sent = False
        self.sel: selectors.BaseSelector | None = None
        self.restored = False
        """Whether this generation's operators hold their restored state (its counters
        count from the restored position; before, they count nothing)."""

    # -- the coordinator ---------------------------------------------------------------

    def _register(self) -> None:
        host = self.spec.get("bind_host", "127.0.0.1")
        self.listener = channels.listen(host, 0)
        self.address = [host, self.listener.getsockname()[1]]
        sock = channels.connect(
            tuple(self.spec["coordinator"]),
            self.secret,
            {"role": "worker", "worker": self.index, "attempt": self.attempt, "run": self.spec["run_id"]},
        )
        self.ctrl_conn = channels.Connection(sock, "coordinator")
        self._send_register(-1)

    def _send_register(self, gen: int) -> None:
        """Registers for generation `gen` (-1: whichever the coordinator is in)."""
        self.send_ctrl(
            {
                "type": "register",
                "worker": self.index,
                "attempt": self.attempt,
                "gen": gen,
                "addr": self.address,
                "pid": os.getpid(),
                # records read when the last generation ended: exact, where heartbeats lag
                "read": sum(s.records_in for s in self.sources),
            }
        )

    def send_ctrl(self, msg: dict) -> None:
        """Queues a control message to the coordinator (written by the loop, or by keepalive)."""
        self.ctrl_conn.send(frames.encode(frames.CONTROL, {}, msg))

    def report_ready(self) -> None:
        """Tells the coordinator this generation runs here (once): the operators are built and
        restored, and the worker executes (a mode may say so before its replay is done)."""
        if not self._ready_sent:
            self._ready_sent = True
            self.send_ctrl({"type": "ready", "gen": self.gen})

    def report_restored(self) -> None:
        """This generation's operators hold their restored state: the counters count from the
        restored position from now on, and say so to the coordinator at once."""
        self.restored = True
        self._next_beat = 0.0
        self.keepalive()

    def keepalive(self) -> None:
        """Sends a heartbeat when one is due and writes queued control messages: called by
        the loop, and by long work outside it (a restore), so the coordinator never takes a
        busy worker for a dead one."""
        now = time.monotonic()
        if now >= self._next_beat:
            self._next_beat = now + HEARTBEAT_S
            self.send_ctrl({"type": "heartbeat", "gen": self.gen, **self.counters()})
        if self.ctrl_conn.out_bytes:
            self.ctrl_conn.flush()

    def _read_ctrl(self) -> None:
        try:
            got = self.ctrl_conn.receive()
        except FrameError as e:
            raise RunFailed(f"malformed frame from the coordinator: {e}") from e
        except ConnectionError as e:
            raise RunFailed(f"lost the coordinator: {e}") from e
        for f in got:
            self._handle_ctrl(f.body)

    def _handle_ctrl(self, msg: dict) -> None:
        t = msg.get("type")
        if t == "abort":
            raise RunFailed(f"run aborted by the coordinator: {msg.get('reason')}")
        if t == "finish":
            self._finish = True
        elif t == "rejoin":
            g = int(msg["gen"])
            if g > self.gen and (self._rejoin is None or g > self._rejoin):
                self._rejoin = g
        elif t == "peers":
            if int(msg["gen"]) > self.gen:
                self._peers = msg
        elif t == "hold":
            # the coordinator holds the generation back (state being recomputed): keep waiting
            self._peers_deadline = time.monotonic() + SETUP_TIMEOUT_S
        elif t == "mode":
            if msg.get("gen", self.gen) == self.gen and self.ops:
                self.hooks.on_control(self, msg)

    def _await_peers(self) -> dict:
        """Waits for the peers of a generation newer than the current one (answering rejoins
        by registering for them), with heartbeats."""
        self._peers = None
        self._peers_deadline = time.monotonic() + SETUP_TIMEOUT_S
        sel = selectors.DefaultSelector()
        sel.register(self.ctrl_conn.sock, selectors.EVENT_READ)
        try:
            while True:
                if self._finish:
                    return {}
                if self._rejoin is not None:
                    g, self._rejoin = self._rejoin, None
                    self._send_register(g)
                peers = self._peers
                if peers is not None and (self._rejoin is None or int(peers["gen"]) >= self._rejoin):
                    self._peers = None
                    return peers
                self.keepalive()
                if time.monotonic() > self._peers_deadline:
                    raise RunFailed(f"worker {self.index}: no peers from the coordinator in {SETUP_TIMEOUT_S:.0f}s")
                if sel.select(0.05):
                    self._read_ctrl()
        finally:
            sel.close()

    # -- a generation -----------------------------------------------------------------

    def _connect_peers(self, peers: list, gen: int) -> None:
        expected = self.workers - 1
        accepted: dict[int, socket.socket] = {}
        stop = threading.Event()

        def accept() -> None:
            self.listener.settimeout(0.2)
            while len(accepted) < expected and not stop.is_set():
                try:
                    s, addr = self.listener.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                try:
                    ident = channels.accept_handshake(s, self.secret)
                    if ident.get("role") != "data" or ident.get("to") != self.index or ident.get("gen") != gen:
                        raise AuthError(f"unexpected identity {ident} (generation {gen})")
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    accepted[int(ident["from"])] = s
                except AuthError as e:
                    channels.refuse(s, addr, e)

        t = threading.Thread(target=accept, name="nosync-accept", daemon=True)
        t.start()
        try:
            for j in range(self.workers):
                if j != self.index:
                    s = channels.connect(
                        tuple(peers[j]),
                        self.secret,
                        {"role": "data", "from": self.index, "to": j, "gen": gen, "attempt": self.attempt},
                    )
                    self.out[j] = channels.Connection(s, f"worker {j}", credits=channels.INITIAL_CREDITS)
            deadline = time.monotonic() + 60
            while t.is_alive() and time.monotonic() < deadline:
                t.join(0.1)
                self.keepalive()
                self._poll_ctrl_nowait()
                if self._rejoin is not None:
                    raise Rejoin(self._rejoin)
        finally:
            stop.set()
            t.join()
            if len(accepted) < expected:
                for s in accepted.values():
                    s.close()
        if len(accepted) < expected:
            raise PeerLost(f"worker {self.index}: only {len(accepted)} of {expected} peers connected")
        for j, s in accepted.items():
            self.inc[j] = channels.Connection(s, f"worker {j}")

    def _poll_ctrl_nowait(self) -> None:
        sel = selectors.DefaultSelector()
        try:
            sel.register(self.ctrl_conn.sock, selectors.EVENT_READ)
            if sel.select(0):
                self._read_ctrl()
        finally:
            sel.close()

    def _build(self, p: PhysicalPlan) -> None:
        self.plan = p
        self.routers = []
        self.ops, self.by_id = build_ops(
            p, None, lambda n: SourceOp(n, p.source_parts[n.id][self.index], self), self._sink_op, self.hooks
        )
        self.sources = [op for op in self.ops if isinstance(op, SourceOp)]
        self.sinks = [op for op in self.ops if isinstance(op, SinkOp)]
        for e in graph_edges(p):
            src, dst = self.by_id[e.src], self.by_id[e.dst]
            if e.exchange:
                r = self.router_class(self, e.id, src, dst)
                self.routers.append(r)
                src.connect(r.push, r.marker, None, r.event)
            else:
                src.connect(dst.push, dst.marker, ("f", e.id), dst.event)
            add_edge_input(dst, e, self.workers)
        finish_loops(p, self.by_id)
        self._edge_dst = {r.edge: r.dst for r in self.routers}

    def _sink_op(self, n: Any) -> SinkOp:
        part = self._parts.get(n.id)
        if part is None:
            part = self._parts[n.id] = n.params["sink"].open_part(self.index, self.spec.get("run_id", ""))
        return SinkOp(n, part, self.clock)

    def _drop_generation(self) -> None:
        """Closes every data connection and keeps what the metrics need of the operators."""
        if self.sel is not None:
            self.sel.close()
            self.sel = None
        for c in [*self.out.values(), *self.inc.values()]:
            c.close()
        self.out, self.inc = {}, {}
        self._pending_credits = {}
        self._credited_ahead = {}
        for s in self.sinks:
            self._latencies.extend(s.latencies)
            if s.last_commit_at is not None:
                self._last_commit_at = max(self._last_commit_at or 0.0, s.last_commit_at)
        self.ops = []

    def _start_generation(self, peers: dict, p: PhysicalPlan) -> None:
        self.gen = int(peers["gen"])
        self.generations += 1
        self._connect_peers(peers["addresses"], self.gen)
        self._build(p)
        self._open_selector()
        self.restored = not (peers.get("restore") or self.attempt > 0)
        self._ready_sent = False
        self.hooks.on_start(self, peers)
        self.restored = True
        self.report_ready()
        self.keepalive()

    # -- the loop ---------------------------------------------------------------

    def dead_letter(self, op_name: str, bad: BadRecord) -> None:
        if self.spec.get("on_bad_record", "deadletter") == "fail":
            raise RunFailed(f"bad record in source '{op_name}': {bad}")
        import json

        if self._dl_file is None:
            path = os.path.join(self.spec["run_dir"], f"dead-letter-w{self.index}.jsonl")
            self._dl_file, self._dl_seen = open_dead_letters(path)
        key = _dead_letter_key(op_name, bad.source, bad.position)
        if key in self._dl_seen:
            return
        self._dl_seen.add(key)
        self._dl_file.write(
            json.dumps(
                {"source": op_name, "file": bad.source, "position": bad.position, "error": str(bad)}, default=str
            )
            + "\n"
        )
        self._dl_file.flush()
        self.dead_letters += 1

    def _handle_data(self, j: int, f: frames.Frame) -> None:
        if self.hooks.accept_frame(self, j, f):
            self.process_frame(j, f)

    def process_frame(self, j: int, f: frames.Frame) -> None:
        """Hands a data, marker or event frame from worker `j` to its operator, then credits it."""
        h = f.header
        dst = self._edge_dst.get(h.get("edge"))
        if dst is None:
            raise FrameError(f"frame for unknown edge {h.get('edge')!r}")
        if f.kind == frames.DATA:
            self.clock.ts = h.get("ts") or 0.0
            dst.push(f.body, h["epoch"], ("x", h["edge"], j))
        elif f.kind == frames.MARKER:
            dst.marker(("x", h["edge"], j), h["epoch"], h.get("wm"), bool(h.get("eos")))
        elif f.kind == frames.EVENT:
            if not isinstance(f.body, dict):
                raise FrameError(f"event body is a {type(f.body).__name__}, not a map")
            dst.event(("x", h["edge"], j), f.body)
        else:
            raise FrameError(f"unexpected frame kind {f.kind} on a data channel")
        self.credit(j)

    def credit(self, j: int) -> None:
        """One more frame from worker `j` was processed (or dropped): return credits in bulk."""
        ahead = self._credited_ahead.get(j)
        if ahead:
            # its credit went back when it arrived (`credit_ahead`)
            self._credited_ahead[j] = ahead - 1
            return
        self._return_credit(j)

    def credit_ahead(self, j: int) -> None:
        """Credits a frame from worker `j` that is held, not yet processed: its sender goes on
        (a worker that replays holds what its peers send meanwhile). Its own `credit`, once
        it is processed, returns nothing."""
        self._return_credit(j)
        self._credited_ahead[j] = self._credited_ahead.get(j, 0) + 1

    def _return_credit(self, j: int) -> None:
        n = self._pending_credits.get(j, 0) + 1
        if n >= channels.INITIAL_CREDITS // 4:
            c = self.inc.get(j)
            if c is not None and not c.closed:
                c.send_uncounted(frames.encode(frames.CREDIT, {"frames": n}))
            n = 0
        self._pending_credits[j] = n

    def counters(self) -> dict:
        if not self.restored:
            # a restarting worker before its restore: no count of its own yet (the run's
            # time series keeps the last one it had, until the restored position comes)
            return {"worker": self.index, "read": None, "committed": None, "frontier": -1, "idle": False}
        return {
            "worker": self.index,
            "read": sum(s.records_in for s in self.sources),
            "committed": sum(s.committed for s in self.sinks),
            "frontier": min([s.frontier for s in self.sinks] or [-1]),
            "idle": bool(self.ops)
            and all(s.finished for s in self.sources)
            and all(s.frontier == EOS for s in self.sinks),
            "dead_letters": self.dead_letters,
        }

    def metrics(self) -> dict:
        lat = self._latencies + [x for s in self.sinks for x in s.latencies]
        commits = [s.last_commit_at for s in self.sinks if s.last_commit_at is not None]
        if self._last_commit_at is not None:
            commits.append(self._last_commit_at)
        return {
            **self.counters(),
            "operators": {op.name: op.metrics() for op in self.ops},
            "latencies": lat,
            "bytes_sent": sum(c.bytes_sent for c in self.out.values()),
            "pid": os.getpid(),
            "attempt": self.attempt,
            "generations": self.generations,
            "first_read_at": self.first_read_at,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "last_commit_at": max(commits, default=None),
            "mode": self.hooks.metrics(self),
        }

    def _finished_locally(self) -> bool:
        if any(op.frontier != EOS for op in self.sinks):
            return False
        return all(c.backlog == 0 for c in self.out.values())

    def dump_state(self, *_: Any) -> None:
        """Writes what this worker waits on to stderr, one JSON line (`kill -USR1 PID`): for
        a run that hangs."""
        import json
        import sys

        state = {
            "worker": self.index,
            "attempt": self.attempt,
            "gen": self.gen,
            "operators": {
                op.name: {"frontier": op.frontier, "blocked": len(op.blocked), "held": op.held_records}
                for op in self.ops
            },
            "out": {
                j: {"credits": c.credits, "waiting": len(c._waiting), "backlog": c.backlog, "closed": c.closed}
                for j, c in self.out.items()
            },
            "in": {j: {"closed": c.closed} for j, c in self.inc.items()},
            "mode": self.hooks.debug_state(self),
        }
        sys.stderr.write(f"nosync-state {json.dumps(state, default=str)}\n")
        sys.stderr.flush()

    def run(self) -> dict:
        import signal

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self.dump_state)
        self._register()
        try:
            pipeline = load_pipeline(self.spec["pipeline_file"], self.spec.get("params"))
            p = plan(pipeline, self.workers)
            peers = self._await_peers()
            while not self._finish:
                try:
                    self._start_generation(peers, p)
                    self._loop()
                except Rejoin:
                    pass
                except (OSError, AuthError, PeerLost) as e:
                    # a peer that died while this generation was set up: the coordinator
                    # starts the next one; in a mode that cannot recover, the run fails
                    if not self.hooks.recovers:
                        raise RunFailed(f"worker {self.index}: {e}") from e
                    log.warning("worker %s: generation %s ended: %s", self.index, self.gen, e)
                self._drop_generation()
                if self._finish:
                    break
                peers = self._await_peers()
        except Exception as e:
            self._report_error(e)
            raise
        finally:
            if self._dl_file is not None:
                self._dl_file.close()
            for part in self._parts.values():
                part.close()
            self.hooks.close(self)
            for c in [*self.out.values(), *self.inc.values(), self.ctrl_conn]:
                c.close()
            self.listener.close()
        return {"worker": self.index, "attempt": self.attempt, "read": self.counters()["read"]}

    def _open_selector(self) -> None:
        """The selector of this generation's loop: the coordinator, the peers' connections and
        (a mode that takes peers back) the listener."""
        sel = self.sel = selectors.DefaultSelector()
        sel.register(self.ctrl_conn.sock, selectors.EVENT_READ, ("ctrl", -1, self.ctrl_conn))
        if self.hooks.accepts_peers:
            # a recovering peer connects again while this worker runs on
            sel.register(self.listener, selectors.EVENT_READ, ("listen", -1, None))
        for j, c in self.inc.items():
            sel.register(c.sock, selectors.EVENT_READ, ("in", j, c))
        for j, c in self.out.items():
            sel.register(c.sock, selectors.EVENT_READ, ("out", j, c))

    def pump(self, wait: float, strict: bool = False) -> None:
        """Reads what arrived within `wait` seconds and hands it on: data frames to the mode and
        their operators, credits to their channels, control messages to the worker or the mode.
        With `strict` (a replay), a peer whose connection drops raises PeerLost; otherwise the
        mode decides what its loss means. Raises Rejoin when the coordinator moved the run to
        another generation."""
        if self._rejoin is not None:
            raise Rejoin(self._rejoin)
        hooks = self.hooks
        for key, _ in self.sel.select(wait):
            kind, j, conn = key.data
            if kind == "ctrl":
                self._read_ctrl()
                continue
            if kind == "listen":
                self._accept_peer()
                continue
            if conn.closed:
                continue
            try:
                for f in conn.receive():
                    if kind == "in":
                        self._handle_data(j, f)
                    elif f.kind == frames.CREDIT:
                        conn.grant(int(f.header.get("frames", 0)))
                    else:
                        raise FrameError(f"unexpected frame kind {f.kind} on the channel to worker {j}")
            except FrameError as e:
                # never executes or crashes on bad input: the channel goes, the coordinator
                # hears why, and the mode decides what becomes of the run
                self._detach(conn)
                log.error("worker %s closed its channel with worker %s: %s", self.index, j, e)
                self.send_ctrl(
                    {
                        "type": "error",
                        "message": f"worker {self.index}: malformed frame from worker {j}, channel closed: {e}",
                    }
                )
            except ConnectionError as e:
                self._detach(conn)
                if strict:
                    raise PeerLost(f"worker {self.index}: worker {j} went away: {e}") from e
                if kind == "in" and self.inc_finished(j):
                    continue
                if kind == "out" and self._done_sent:
                    continue
                if hooks.recovers:
                    # the coordinator sees the peer's end and says what follows: a mode that
                    # recovers the peer alone goes on without it meanwhile
                    if hooks.accepts_peers:
                        # only this connection's attempt (and older) is gone: a newer attempt
                        # of the peer may be connected already
                        self.peer_down(j, getattr(conn, "attempt", -1))
                    continue
                raise RunFailed(f"worker {self.index}: channel with worker {j} closed: {e}") from e
        if self._rejoin is not None:
            raise Rejoin(self._rejoin)

    def _loop(self) -> None:
        """Runs the current generation until finish (returns) or a rejoin (raises Rejoin)."""
        self._done_sent = idle_sent = False
        active_sources = [s for s in self.sources if not s.finished]
        start = time.time()
        hooks = self.hooks
        while not self._finish:
            backlog = max((c.backlog for c in self.out.values()), default=0)
            busy = bool(active_sources) and backlog < MAX_BACKLOG_FRAMES and hooks.may_read(self)
            self.pump(0 if busy else 0.002)
            if busy:
                for s in list(active_sources):
                    if not hooks.poll_source(self, s):
                        active_sources.remove(s)
            hooks.flush_routers(self)
            self.flush_peers()
            hooks.poll(self)
            if not idle_sent and not active_sources and all(s.frontier == EOS for s in self.sinks):
                # the input is exhausted here: say so now, not at the next heartbeat, so that
                # a mode that commits at checkpoints can start the last one at once
                idle_sent = True
                self._next_beat = 0.0
            if not self._done_sent and not active_sources and self._finished_locally() and hooks.can_finish(self):
                self.send_ctrl(
                    {"type": "done", "gen": self.gen, "metrics": self.metrics(), "seconds": time.time() - start}
                )
                self._done_sent = True
            self.keepalive()

    def flush_peers(self) -> None:
        """Writes what the data connections can take; a peer that went away is down."""
        for conns in (self.out, self.inc):
            for j, c in list(conns.items()):
                if c.out_bytes and not c.closed:
                    try:
                        c.flush()
                    except OSError:
                        if not self.hooks.recovers:
                            raise
                        self._detach(c)
                        if self.hooks.accepts_peers:
                            self.peer_down(j, getattr(c, "attempt", -1))

    def _detach(self, conn: channels.Connection) -> None:
        if self.sel is not None:
            try:
                self.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                pass
        conn.close()

    def peer_down(self, j: int, attempt: int | None = None) -> None:
        """Worker `j` is gone: both connections with it go (with `attempt`, only those opened
        with that attempt or an earlier one); the mode keeps what it sends it."""
        for conns in (self.out, self.inc):
            c = conns.get(j)
            if c is not None and (attempt is None or getattr(c, "attempt", -1) <= attempt):
                del conns[j]
                self._detach(c)
        if j not in self.inc:
            self._pending_credits.pop(j, None)
            self._credited_ahead.pop(j, None)
        self.hooks.on_peer_down(self, j, attempt)

    def attach(self, j: int, conn: channels.Connection, direction: str) -> None:
        """Adds a data connection with worker `j` ("in" or "out") to the running loop."""
        conns = self.inc if direction == "in" else self.out
        old = conns.get(j)
        if old is not None:
            self._detach(old)
        conns[j] = conn
        if direction == "in":
            self._pending_credits.pop(j, None)
            self._credited_ahead.pop(j, None)
        if self.sel is not None:
            self.sel.register(conn.sock, selectors.EVENT_READ, (direction, j, conn))

    def connect_peer(self, j: int, address: list, attempt: int) -> channels.Connection:
        """Opens this worker's sending connection to attempt `attempt` of worker `j` (a peer
        that came back)."""
        s = channels.connect(
            tuple(address),
            self.secret,
            {"role": "data", "from": self.index, "to": j, "gen": self.gen, "attempt": self.attempt},
        )
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = channels.Connection(s, f"worker {j}", credits=channels.INITIAL_CREDITS)
        conn.attempt = attempt
        self.attach(j, conn, "out")
        return conn

    def _accept_peer(self) -> None:
        """A peer that came back connects to this running worker."""
        try:
            s, addr = self.listener.accept()
        except (BlockingIOError, OSError):
            return
        try:
            s.settimeout(10.0)
            ident = channels.accept_handshake(s, self.secret)
            if ident.get("role") != "data" or ident.get("to") != self.index or ident.get("gen") != self.gen:
                raise AuthError(f"unexpected identity {ident} (generation {self.gen})")
            j = int(ident["from"])
            if not 0 <= j < self.workers or j == self.index:
                raise AuthError(f"unexpected identity {ident}")
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (AuthError, OSError) as e:
            channels.refuse(s, addr, e)
            return
        conn = channels.Connection(s, f"worker {j}")
        conn.attempt = int(ident.get("attempt", 0))
        self.attach(j, conn, "in")
        self.hooks.on_peer_connected(self, j, conn, "in")

    def _report_error(self, e: BaseException) -> None:
        """Tells the coordinator why this worker stops, before its connection drops."""
        msg = str(e) if isinstance(e, RunFailed) else f"{type(e).__name__}: {e}"
        if isinstance(e, RunFailed) and "channel with worker" in msg:
            return  # a consequence of another worker's end, which that worker reports
        try:
            self.ctrl_conn.sock.setblocking(True)
            self.ctrl_conn.flush()
            self.ctrl_conn.sock.sendall(frames.encode(frames.CONTROL, {}, {"type": "error", "message": msg}))
        except OSError:
            pass

    def inc_finished(self, j: int) -> bool:
        chans = [
            op
            for op in self.ops
            for ch, e in op.inputs.items()
            if isinstance(ch, tuple) and ch[0] == "x" and ch[2] == j and e != EOS
        ]
        return not chans


def _dead_letter_key(source: str, file: str, position: Any) -> tuple:
    import json

    return source, file, json.dumps(position, sort_keys=True, default=str)


def open_dead_letters(path: str) -> tuple[Any, set]:
    """Opens a worker's dead-letter file for appending, and the keys of the records it holds.

    A restarted worker, or one that rolled back, reads some input again: a record already in
    the file is not written twice. A last line that a crash left without its newline is ended
    if it holds a whole record, and cut off otherwise (its record is in the input the worker
    reads again), so that the next record starts a line of its own."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    seen: set = set()
    with open(path, "a+b") as f:
        f.seek(0)
        lines = f.read().split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        if tail:
            if dead_letter_record(tail) is None:
                f.truncate(f.tell() - len(tail))
            else:
                f.write(b"\n")
                lines.append(tail)
    for line in lines:
        d = dead_letter_record(line)
        if d is not None:
            seen.add(_dead_letter_key(d["source"], d["file"], d["position"]))
    return open(path, "a", encoding="utf-8"), seen  # noqa: SIM115 - the caller closes it


def dead_letter_record(line: bytes | str) -> dict | None:
    """The record a line of a dead-letter file holds; None for a line that holds no whole one."""
    import json

    try:
        d = json.loads(line)
    except ValueError:
        return None
    return d if isinstance(d, dict) and {"source", "file", "position"} <= d.keys() else None


def worker_main(spec: dict, index: int, _iterator: Any) -> list:
    """The Spark task: run worker `index` of the run described by `spec`."""
    attempt = 0
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None:
            attempt = ctx.attemptNumber()
    except ImportError:
        pass
    logging.basicConfig(level=logging.WARNING)
    return [Worker(index, attempt, spec).run()]
