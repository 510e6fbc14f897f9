"""The worker: one long-running Spark task that runs one instance of every operator.

Start-up: connect to the coordinator (authenticated), register with the address of a fresh
listening socket, receive every peer's address, open one data connection to each peer (and
accept one from each), build the operators, call the mode's `on_start`. Then one thread runs
the loop below until every operator has seen the end of every input and every frame is sent:

1. read what arrived: data frames go to the operator behind their edge, markers advance
   frontiers, credits release queued frames, control messages go to the worker or the mode;
2. if no outgoing channel is over its backlog bound, read one chunk from a source partition
   and push it through the operators (forward edges are direct calls; exchange edges go to a
   Router, which keeps the local share and frames the rest per destination);
3. flush router buffers older than the linger time, write what the sockets take;
4. every HEARTBEAT_S, send counters to the coordinator.

No thread is started per record or per batch; the only extra thread accepts peer connections
during start-up.
"""

from __future__ import annotations

import logging
import os
import resource
import selectors
import socket
import threading
import time
from typing import Any

import xxhash

from nosync import channels, frames
from nosync.errors import AuthError, BadRecord, FrameError, RunFailed
from nosync.loader import load_pipeline
from nosync.modes import get_mode
from nosync.operators import (
    EOS,
    IterateOp,
    JoinOp,
    Op,
    SinkOp,
    make_op,
)
from nosync.plan import PhysicalPlan, plan

log = logging.getLogger("nosync.worker")

HEARTBEAT_S = 0.5
MAX_BACKLOG_FRAMES = 2 * channels.INITIAL_CREDITS


class Clock:
    """The ingest time of the batch being processed (for end-to-end latency)."""

    __slots__ = ("ts",)

    def __init__(self) -> None:
        self.ts = 0.0


def partition_of(key: Any, workers: int) -> int:
    """The worker that owns `key`: xxhash64 of its bytes, modulo W."""
    if type(key) is str:
        data = key.encode("utf-8", "surrogatepass")
    elif type(key) is bytes:
        data = key
    elif type(key) is int:
        data = key.to_bytes(16, "little", signed=True)
    else:
        import msgpack

        data = msgpack.packb(key, use_bin_type=True)
    return xxhash.xxh64_intdigest(data) % workers


class Router:
    """The sending end of one exchange edge on one worker."""

    def __init__(self, worker: Worker, edge: int, dst: Op) -> None:
        self.w = worker
        self.edge = edge
        self.dst = dst
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
            self.dst.push(records, epoch, self.local_chan)
            return
        cache = self.cache
        if len(cache) > 1_000_000:
            cache.clear()
        get = cache.get
        buckets: list[list] = [[] for _ in range(n)]
        for rec in records:
            k = rec[0]
            d = get(k)
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
                self.dst.push(b, epoch, self.local_chan)
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
        self.w.out[d].send(
            frames.encode(frames.DATA, {"edge": self.edge, "epoch": self.buffer_epoch[d], "ts": self.w.clock.ts}, recs)
        )

    def flush(self, older_than: float | None = None) -> None:
        now = time.monotonic()
        for d in range(self.n):
            if self.buffers[d] and (older_than is None or now - self.buffer_since[d] >= older_than):
                self._send(d)

    def marker(self, _chan: Any, epoch: int, wm: Any, eos: bool) -> None:
        self.flush()
        if self.n > 1:
            body = frames.encode(frames.MARKER, {"edge": self.edge, "epoch": epoch, "wm": wm, "eos": eos})
            for d in range(self.n):
                if d != self.me:
                    self.w.out[d].send(body)
        self.dst.marker(self.local_chan, epoch, wm, eos)


class SourceOp(Op):
    """Reads this worker's partitions of one source, epoch by epoch, round robin."""

    def __init__(self, node: Any, parts: list[dict], worker: Worker) -> None:
        super().__init__(node)
        self.source = node.params["source"]
        self.w = worker
        self.parts = [{"part": p, "iter": None, "offset": None, "read": 0, "done": False, "left": []} for p in parts]
        self.epoch = 0
        self.started = time.monotonic()
        self.finished = False

    def _on_bad(self, bad: BadRecord) -> None:
        self.w.dead_letter(self.name, bad)

    def _next_chunk(self, st: dict, limit: int) -> list:
        if st["left"]:
            recs = st["left"][:limit]
            st["left"] = st["left"][limit:]
            return recs
        if st["iter"] is None:
            st["iter"] = self.source.read(st["part"], st["offset"], self.w.batch_size, self._on_bad)
        try:
            recs, st["offset"] = next(st["iter"])
        except StopIteration:
            st["done"] = True
            return []
        if len(recs) > limit:
            st["left"] = recs[limit:]
            recs = recs[:limit]
        return recs

    def poll(self) -> bool:
        """Reads and pushes one chunk; returns False once the source is exhausted."""
        if self.finished:
            return False
        w = self.w
        per_epoch = w.epoch_records
        if w.epoch_ms:
            e = int((time.monotonic() - self.started) * 1000 // w.epoch_ms)
            if e > self.epoch:
                self._close_epoch(e - 1)
                self.epoch = e
        for st in self.parts:
            if st["done"] and not st["left"]:
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
                return True
            if not st["done"]:
                return True
        if all(st["done"] and not st["left"] for st in self.parts):
            self.finished = True
            self._close_epoch(EOS)
            return False
        if not w.epoch_ms:
            self._close_epoch(self.epoch)
            self.epoch += 1
        return True

    def _close_epoch(self, epoch: int) -> None:
        self.frontier = epoch
        for _, mark, chan in self.targets:
            mark(chan, epoch, None, epoch == EOS)


class Worker:
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
        self.clock = Clock()
        self.out: dict[int, channels.Connection] = {}
        self.inc: dict[int, channels.Connection] = {}
        self.ops: list[Op] = []
        self.by_id: dict[int, Op] = {}
        self.routers: list[Router] = []
        self.sources: list[SourceOp] = []
        self.sinks: list[SinkOp] = []
        self.hooks = get_mode(spec["mode"]).worker_hooks()
        self.dead_letters = 0
        self.first_read_at: float | None = None
        self._dl_file = None
        self._pending_credits: dict[int, int] = {}

    # -- start-up ---------------------------------------------------------------

    def _register(self) -> dict:
        host = self.spec.get("bind_host", "127.0.0.1")
        self.listener = channels.listen(host, 0)
        sock = channels.connect(
            tuple(self.spec["coordinator"]),
            self.secret,
            {"role": "worker", "worker": self.index, "attempt": self.attempt, "run": self.spec["run_id"]},
        )
        self.ctrl = sock
        sock.sendall(
            frames.encode(
                frames.CONTROL,
                {},
                {
                    "type": "register",
                    "worker": self.index,
                    "attempt": self.attempt,
                    "addr": [host, self.listener.getsockname()[1]],
                    "pid": os.getpid(),
                },
            )
        )
        reader = frames.FrameReader()
        sock.settimeout(120)
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise RunFailed("the coordinator closed the connection during start-up")
            for f in reader.feed(data):
                msg = f.body
                if msg.get("type") == "peers":
                    sock.settimeout(None)
                    self._ctrl_reader = reader
                    return msg
                if msg.get("type") == "abort":
                    raise RunFailed(f"run aborted by the coordinator: {msg.get('reason')}")

    def _connect_peers(self, peers: list) -> None:
        expected = self.workers - 1
        accepted: dict[int, socket.socket] = {}
        errors: list[BaseException] = []

        def accept() -> None:
            self.listener.settimeout(60)
            while len(accepted) < expected:
                try:
                    s, addr = self.listener.accept()
                except OSError as e:
                    errors.append(e)
                    return
                try:
                    ident = channels.accept_handshake(s, self.secret)
                    if ident.get("role") != "data" or ident.get("to") != self.index:
                        raise AuthError(f"unexpected identity {ident}")
                    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    accepted[int(ident["from"])] = s
                except AuthError as e:
                    channels.refuse(s, addr, e)

        t = threading.Thread(target=accept, name="nosync-accept", daemon=True)
        t.start()
        for j in range(self.workers):
            if j != self.index:
                s = channels.connect(tuple(peers[j]), self.secret, {"role": "data", "from": self.index, "to": j})
                self.out[j] = channels.Connection(s, f"worker {j}", credits=channels.INITIAL_CREDITS)
        t.join()
        self.listener.close()
        if len(accepted) < expected:
            raise RunFailed(f"worker {self.index}: only {len(accepted)} of {expected} peers connected ({errors})")
        for j, s in accepted.items():
            self.inc[j] = channels.Connection(s, f"worker {j}")

    def _build(self, p: PhysicalPlan) -> None:
        nodes = p.pipeline.nodes
        run_id = self.spec["run_id"]
        loop_nodes = {i for n in nodes if n.kind == "iterate" for i in n.params["body"]} | {
            n.params["entry"] for n in nodes if n.kind == "iterate"
        }
        for n in nodes:
            if n.kind == "source":
                op: Op = SourceOp(n, p.source_parts[n.id][self.index], self)
                self.sources.append(op)
            elif n.kind == "sink":
                op = SinkOp(n, n.params["sink"].open_part(self.index, run_id), self.clock)
                self.sinks.append(op)
            elif n.kind == "join":
                op = JoinOp(n, set())
            elif n.kind == "iterate":
                op = IterateOp(n, [])
            else:
                op = make_op(n)
            op.hooks = self.hooks
            if hasattr(op, "track_dirty"):
                op.track_dirty = self.hooks.tracks_dirty
            self.ops.append(op)
            self.by_id[n.id] = op
        for n in nodes:
            if n.kind == "iterate":
                it = self.by_id[n.id]
                it.wire(self.by_id[n.params["entry"]], self.by_id[n.params["exit"]])
        for e in p.edges:
            src, dst = self.by_id[e.src], self.by_id[e.dst]
            if e.dst in loop_nodes and nodes[e.dst].kind == "loop_entry":
                continue  # the entry of a loop is fed by its iterate operator
            left = isinstance(dst, JoinOp) and e.port == 0
            if e.exchange:
                r = Router(self, e.id, dst)
                self.routers.append(r)
                src.connect(r.push, r.marker, None)
                for w in range(self.workers):
                    dst.add_input(("x", e.id, w))
                    if left:
                        dst.left_channels.add(("x", e.id, w))
            else:
                chan = ("f", e.id)
                src.connect(dst.push, dst.marker, chan)
                dst.add_input(chan)
                if left:
                    dst.left_channels.add(chan)
        for n in nodes:
            if n.kind == "loop_entry":
                self.by_id[n.id].add_input("loop")

    # -- the loop ---------------------------------------------------------------

    def dead_letter(self, op_name: str, bad: BadRecord) -> None:
        if self.spec.get("on_bad_record", "deadletter") == "fail":
            raise RunFailed(f"bad record in source '{op_name}': {bad}")
        import json

        if self._dl_file is None:
            path = os.path.join(self.spec["run_dir"], f"dead-letter-w{self.index}.jsonl")
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._dl_file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed in run()
        self._dl_file.write(
            json.dumps(
                {"source": op_name, "file": bad.source, "position": bad.position, "error": str(bad)}, default=str
            )
            + "\n"
        )
        self._dl_file.flush()
        self.dead_letters += 1

    def _send_ctrl(self, msg: dict) -> None:
        self.ctrl_conn.send(frames.encode(frames.CONTROL, {}, msg))

    def _handle_data(self, j: int, f: frames.Frame) -> None:
        h = f.header
        if f.kind == frames.DATA:
            dst = self._edge_dst.get(h.get("edge"))
            if dst is None:
                raise FrameError(f"data frame for unknown edge {h.get('edge')!r}")
            self.clock.ts = h.get("ts") or 0.0
            dst.push(f.body, h["epoch"], ("x", h["edge"], j))
        elif f.kind == frames.MARKER:
            dst = self._edge_dst.get(h.get("edge"))
            if dst is None:
                raise FrameError(f"marker for unknown edge {h.get('edge')!r}")
            dst.marker(("x", h["edge"], j), h["epoch"], h.get("wm"), bool(h.get("eos")))
        else:
            raise FrameError(f"unexpected frame kind {f.kind} on a data channel")
        n = self._pending_credits.get(j, 0) + 1
        if n >= channels.INITIAL_CREDITS // 4:
            self.inc[j].send_uncounted(frames.encode(frames.CREDIT, {"frames": n}))
            n = 0
        self._pending_credits[j] = n

    def _handle_ctrl(self, msg: dict) -> None:
        t = msg.get("type")
        if t == "abort":
            raise RunFailed(f"run aborted by the coordinator: {msg.get('reason')}")
        if t == "finish":
            self._finish = True
        elif t == "mode":
            self.hooks.on_control(self, msg)

    def counters(self) -> dict:
        return {
            "worker": self.index,
            "read": sum(s.records_in for s in self.sources),
            "committed": sum(s.committed for s in self.sinks),
            "frontier": min([s.frontier for s in self.sinks] or [-1]),
            "dead_letters": self.dead_letters,
        }

    def metrics(self) -> dict:
        lat = [x for s in self.sinks for x in s.latencies]
        return {
            **self.counters(),
            "operators": {op.name: op.metrics() for op in self.ops},
            "latencies": lat,
            "bytes_sent": sum(c.bytes_sent for c in self.out.values()),
            "pid": os.getpid(),
            "attempt": self.attempt,
            "first_read_at": self.first_read_at,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "last_commit_at": max((s.last_commit_at for s in self.sinks), default=None),
        }

    def _finished_locally(self) -> bool:
        if any(op.frontier != EOS for op in self.sinks):
            return False
        return all(c.backlog == 0 for c in self.out.values())

    def run(self) -> dict:
        peers = self._register()
        self.ctrl_conn = channels.Connection(self.ctrl, "coordinator")
        self.ctrl_conn.reader = self._ctrl_reader
        try:
            pipeline = load_pipeline(self.spec["pipeline_file"], self.spec.get("params"))
            p = plan(pipeline, self.workers)
            self._build(p)
            self._edge_dst = {r.edge: r.dst for r in self.routers}
            self._connect_peers(peers["addresses"])
            self.hooks.on_start(self)
        except Exception as e:
            self._report_error(e)
            self.ctrl_conn.close()
            raise
        sel = selectors.DefaultSelector()
        sel.register(self.ctrl_conn.sock, selectors.EVENT_READ, ("ctrl", -1, self.ctrl_conn))
        for j, c in self.inc.items():
            sel.register(c.sock, selectors.EVENT_READ, ("in", j, c))
        for j, c in self.out.items():
            sel.register(c.sock, selectors.EVENT_READ, ("out", j, c))
        self._finish = False
        done_sent = False
        next_beat = 0.0
        active_sources = list(self.sources)
        start = time.time()
        try:
            while not self._finish:
                backlog = max((c.backlog for c in self.out.values()), default=0)
                busy = bool(active_sources) and backlog < MAX_BACKLOG_FRAMES
                for key, _ in sel.select(0 if busy else 0.002):
                    kind, j, conn = key.data
                    try:
                        got = conn.receive()
                        for f in got:
                            if kind == "ctrl":
                                self._handle_ctrl(f.body)
                            elif kind == "in":
                                self._handle_data(j, f)
                            elif f.kind == frames.CREDIT:
                                conn.grant(int(f.header.get("frames", 0)))
                            else:
                                raise FrameError(f"unexpected frame kind {f.kind} on the channel to worker {j}")
                    except FrameError as e:
                        # never executes or crashes on bad input: the channel goes, the
                        # coordinator hears why, and the mode decides what becomes of the run
                        sel.unregister(conn.sock)
                        conn.close()
                        if kind == "ctrl":
                            raise RunFailed(f"malformed frame from the coordinator: {e}") from e
                        log.error("worker %s closed its channel with worker %s: %s", self.index, j, e)
                        self._send_ctrl(
                            {
                                "type": "error",
                                "message": f"worker {self.index}: malformed frame from worker {j}, channel closed: {e}",
                            }
                        )
                    except ConnectionError as e:
                        sel.unregister(conn.sock)
                        conn.close()
                        if kind == "ctrl":
                            raise RunFailed(f"lost the coordinator: {e}") from e
                        if kind == "in" and self.inc_finished(j):
                            continue
                        if kind == "out" and done_sent:
                            continue
                        raise RunFailed(f"worker {self.index}: channel with worker {j} closed: {e}") from e
                if busy:
                    for s in list(active_sources):
                        if not s.poll():
                            active_sources.remove(s)
                for r in self.routers:
                    r.flush(self.linger_s)
                for c in self.out.values():
                    if c.out_bytes:
                        c.flush()
                for c in self.inc.values():
                    if c.out_bytes and not c.closed:
                        c.flush()
                now = time.monotonic()
                if now >= next_beat:
                    next_beat = now + HEARTBEAT_S
                    self._send_ctrl({"type": "heartbeat", **self.counters()})
                if not done_sent and not active_sources and self._finished_locally():
                    self._send_ctrl({"type": "done", "metrics": self.metrics(), "seconds": time.time() - start})
                    done_sent = True
                if self.ctrl_conn.out_bytes:
                    self.ctrl_conn.flush()
        except Exception as e:
            self._report_error(e)
            raise
        finally:
            if self._dl_file is not None:
                self._dl_file.close()
            for op in self.sinks:
                op.part.close()
            for c in [*self.out.values(), *self.inc.values(), self.ctrl_conn]:
                c.close()
            sel.close()
        return {"worker": self.index, "attempt": self.attempt, "read": self.counters()["read"]}

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
