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
2. if no outgoing channel is over its backlog bound (nor a loop's head over its hold, `full`),
   read one chunk from a source partition and push it through the operators (forward edges
   are direct calls; exchange edges go to a Router, which keeps the local share and frames
   the rest per destination);
3. flush router buffers older than the linger time, write what the sockets take, let the
   mode poll (durable snapshots);
4. every HEARTBEAT_S, publish its counters (its progress) and send them to the coordinator.

No thread is started per record or per batch. Beside the loop, a heartbeat thread beats for the
worker when the loop is busy (liveness apart from progress: the coordinator's failure timeout
never takes a busy worker for a dead one), and an acceptor runs the handshakes of peers'
connections (`channels.Acceptor`), so a peer that connects and sends nothing never holds the
loop.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import selectors
import shutil
import signal
import sys
import threading
import time
from typing import Any

from nosync.api.loader import spec_pipeline
from nosync.api.plan import PhysicalPlan, plan
from nosync.api.sink_base import open_part_of
from nosync.errors import AuthError, BadRecord, FrameError, PeerLost, Replaced, RunFailed
from nosync.places import spec_places
from nosync.runtime import channels, control, frames
from nosync.runtime.dead_letters import DeadLetters
from nosync.runtime.flow import FlowBound
from nosync.runtime.graph import (
    add_edge_input,
    build_ops,
    connect_back_edge,
    exchange_sender,
    finish_loops,
    graph_edges,
)
from nosync.runtime.heap import freeze_made, thaw
from nosync.runtime.histogram import Histogram
from nosync.runtime.hooks import WorkerHooks
from nosync.runtime.links import SETUP_TIMEOUT_S, CoordinatorUnreachable, Links, Rejoin
from nosync.runtime.loops import LoopHead
from nosync.runtime.operators import EOS, Clock, Op, SinkOp
from nosync.runtime.router import FeedbackRouter, Router
from nosync.runtime.source_op import SourceOp, Stop

log = logging.getLogger("nosync.runtime.worker")

MAX_BACKLOG_FRAMES = 2 * channels.INITIAL_CREDITS


class Worker(Links):
    """One worker: the Spark task that runs an instance of every operator, with its connections to
    its peers and the coordinator and the mode's hooks."""

    router_class = Router

    def __init__(self, index: int, attempt: int, spec: dict, hooks: WorkerHooks) -> None:
        self.index = index
        self.attempt = attempt
        self.standby = index >= spec["workers"]
        """A spare process (`--standbys`): it holds no partition until it is promoted."""
        self._promote: tuple[int, int] | None = None
        self.task_id = -1
        """Spark's id of this task attempt (set by the task entry; -1 outside Spark)."""
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
        self.heads: list[LoopHead] = []
        self.sinks: list[SinkOp] = []
        self.hooks = hooks
        self.places = spec_places(spec)
        self.dead_letters = DeadLetters.of_spec(self._send_dead_letter, spec)
        self.first_read_at: float | None = None
        self.flow = FlowBound()
        self.gen = -1
        self.generations = 0
        self._parts: dict[int, Any] = {}
        self._pending_credits: dict[int, int] = {}
        self._credited_ahead: dict[int, int] = {}
        self._latency = Histogram()
        """The latency the sinks of the generations before this one recorded."""
        self._last_commit_at: float | None = None
        self._next_beat = 0.0
        self._rejoin: int | None = None
        self._finish = False
        self._done_sent = False
        self._ready_sent = False
        self.sel: selectors.BaseSelector | None = None
        self._stale_cleared = False
        self.replaced = False
        """Whether the coordinator replaced this attempt (a zombie): its stores are abandoned,
        not flushed, when it stops."""
        self.stop = Stop()
        """What the coordinator asked of a stop of the run, and what the sources did of it."""
        self.restored = False
        """Whether this generation's operators hold their restored state (its counters
        count from the restored position; before, they count nothing)."""

    # -- the coordinator ---------------------------------------------------------------

    def _handle_ctrl(self, msg: control.Message) -> None:
        match msg:
            case control.Abort(reason=reason):
                raise RunFailed(f"run aborted by the coordinator: {reason}")
            case control.Lease(beat=beat):
                self._leased(beat)
            case control.Replaced(reason=reason):
                self.replaced = True
                self._report_zombie()
                r = self.refused
                raise Replaced(
                    f"worker {self.index} (attempt {self.attempt}, pid {os.getpid()}) woke to find itself replaced: "
                    f"{reason}; it refused {r['commits']} sink commits and {r['writes']} shared-tier writes "
                    f"meanwhile, and stops without changing anything"
                )
            case control.Finish():
                self._finish = True
            case control.Stop(upto=upto):
                self.stop.ask(upto)
            case control.Standby():
                self.standby = True
            case control.Promote(worker=w, attempt=a):
                self._promote = (w, a)
            case control.Rejoin(gen=g):
                if g > self.gen and (self._rejoin is None or g > self._rejoin):
                    self._rejoin = g
            case control.Peers(gen=g):
                if g > self.gen:
                    self._peers = msg
            case control.Hold():
                # the coordinator holds the generation back (state being recomputed): keep waiting
                self._peers_deadline = time.monotonic() + SETUP_TIMEOUT_S
            case control.ModeMessage(gen=g):
                if g in (None, self.gen) and self.ops:
                    self.hooks.on_control(self, msg.as_map())
            case _:
                raise RunFailed(f"worker {self.index}: unexpected {type(msg).__name__} message from the coordinator")

    # -- a generation -----------------------------------------------------------------

    def build(self, p: PhysicalPlan) -> None:
        """Builds this worker's instance of every operator of plan `p`, with its routers and edges."""
        self.plan = p
        self.routers = []
        self.ops, self.by_id = build_ops(
            p, None, lambda n: SourceOp(n, p.source_parts[n.id][self.index], self), self._sink_op, self.hooks
        )
        self.sources = [op for op in self.ops if isinstance(op, SourceOp)]
        self.heads = [op for op in self.ops if isinstance(op, LoopHead)]
        self.sinks = [op for op in self.ops if isinstance(op, SinkOp)]
        for op in self.sinks:
            op.fence = self.fence
        for e in graph_edges(p):
            src, dst = self.by_id[e.src], self.by_id[e.dst]
            if e.feedback:
                r = FeedbackRouter(self, e.id, src, dst) if e.exchange else None
                if r is not None:
                    self.routers.append(r)
                connect_back_edge(e, src, dst, r)
            elif e.exchange:
                r = self.router_class(self, e.id, src, dst)
                self.routers.append(r)
                src.connect(r.push, r.marker, None, r.event)
            else:
                src.connect(dst.push, dst.marker, ("f", e.id), dst.event)
            add_edge_input(dst, e, self.workers)
        finish_loops(p, self.by_id, self.hooks.options.max_rounds)
        self._edge_dst = {r.edge: r.dst for r in self.routers}

    def _sink_op(self, n: Any) -> SinkOp:
        part = self._parts.get(n.id)
        if part is None:
            staging = os.path.join(self.places.local_root(self.index), "sinks")
            part = self._parts[n.id] = open_part_of(n.params["sink"], self.index, self.spec.get("run_id", ""), staging)
        op, skip = SinkOp(n, part, self.clock), self.hooks.options.latency_from_s
        op.measure_from = 0.0 if skip is None else (self.spec.get("source_t0") or 0.0) + skip
        return op

    def _drop_generation(self) -> None:
        """Closes every data connection and keeps what the metrics need of the operators."""
        thaw()  # what this generation held may be garbage now, cycles included
        if self.sel is not None:
            self.sel.close()
            self.sel = None
        for c in [*self.out.values(), *self.inc.values()]:
            c.close()
        self.out, self.inc = {}, {}
        self._pending_credits = {}
        self._credited_ahead = {}
        for s in self.sinks:
            self._latency.merge(s.latency)
            s.latency = Histogram()  # merged once, however often the generation is dropped
            if s.last_commit_at is not None:
                self._last_commit_at = max(self._last_commit_at or 0.0, s.last_commit_at)
        self.ops = []

    def _start_generation(self, peers: control.Peers, p: PhysicalPlan) -> None:
        self.gen = peers.gen
        self.generations += 1
        if (peers.extra.get("moved") or {}).get(self.index) == self.attempt and not self._stale_cleared:
            self._clear_stale_root()
        self._connect_peers(peers.addresses, self.gen)
        self.spec["source_t0"] = peers.extra.get("source_t0")  # a paced source's clock (`SourceOp.due_at`)
        self.build(p)
        self._open_selector()
        self.restored = not (peers.extra.get("restore") or self.attempt > 0)
        self._ready_sent = False
        self.stop.new_generation()
        self.hooks.on_start(self, peers.extra)
        self.restored = True
        self.report_ready()
        self.keepalive()

    def _clear_stale_root(self) -> None:
        """This attempt runs on another host than the one before it: what this host's local
        root holds of the worker is an older attempt's, behind what the worker made durable
        since (elsewhere). It goes, renamed away at once, so the stores restore from the
        levels off the host (a peer's copy, the remote tier), as on a new machine."""
        self._stale_cleared = True
        root = self.places.local_root(self.index)
        if not os.path.exists(root):
            return
        gone = f"{root}.stale-a{self.attempt}-{os.getpid()}"
        os.rename(root, gone)
        shutil.rmtree(gone, ignore_errors=True)
        log.warning("worker %s (attempt %s): removed an older attempt's local root %s", self.index, self.attempt, root)

    # -- the loop ---------------------------------------------------------------

    def dead_letter(self, op_name: str, bad: BadRecord) -> None:
        """A source could not read a record: it goes to the dead letters (or fails the run)."""
        self.dead_letters.write(op_name, bad)

    def _send_dead_letter(self, letter: dict) -> None:
        """Hands a dead letter to the coordinator, which keeps the run's; written to the socket
        at once, ahead of any snapshot that could cover its record's position."""
        self.send_ctrl(control.DeadLetter(worker=self.index, **letter))
        try:
            self.flush_ctrl()
        except OSError:
            pass  # the coordinator is gone: the loop finds out

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
        """What every heartbeat reports: records read and committed, the sinks' least frontier,
        whether the worker is idle, dead letters."""
        if not self.restored:
            # a restarting worker before its restore: no count of its own yet (the run's
            # time series keeps the last one it had, until the restored position comes)
            return {"worker": self.index, "read": None, "committed": None, "frontier": -1, "idle": False}
        out = {
            "worker": self.index,
            "read": sum(s.records_in for s in self.sources),
            "committed": sum(s.committed for s in self.sinks),
            "frontier": min([s.frontier for s in self.sinks] or [-1]),
            "idle": bool(self.ops)
            and all(s.finished or s.stopped for s in self.sources)
            and all(s.frontier >= self.stop.end_epoch for s in self.sinks),
            "dead_letters": self.dead_letters.count,
        }
        return {**out, **self.stop.report(self.sources)}

    def metrics(self) -> dict:
        """The counters with each operator's metrics, the latency histogram (`Histogram.to_wire`),
        bytes sent, process facts and the mode's metrics (a finished worker's report)."""
        lat = Histogram()
        for h in [self._latency, *(s.latency for s in self.sinks)]:
            lat.merge(h)
        commits = [s.last_commit_at for s in self.sinks if s.last_commit_at is not None]
        if self._last_commit_at is not None:
            commits.append(self._last_commit_at)
        return {
            **self.counters(),
            "operators": {op.name: op.metrics() for op in self.ops},
            "latency": lat.to_wire(),
            "bytes_sent": sum(c.bytes_sent for c in self.out.values()),
            "refused_connections": self.acceptor.refused,
            "zombie_connections_refused": self.zombie_connections,
            "pid": os.getpid(),
            "attempt": self.attempt,
            "generations": self.generations,
            "first_read_at": self.first_read_at,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "last_commit_at": max(commits, default=None),
            "mode": self.hooks.metrics(self),
        }

    def _finished_locally(self) -> bool:
        if any(op.frontier < self.stop.end_epoch for op in self.sinks):
            return False
        return all(c.backlog == 0 for c in self.out.values())

    def dump_state(self, *_: Any) -> None:
        """Writes what this worker waits on to stderr, one JSON line (`kill -USR1 PID`): for
        a run that hangs."""
        state = {
            "worker": self.index,
            "attempt": self.attempt,
            "gen": self.gen,
            "lease_left_s": round(self.lease_left(), 3),
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
        """Runs the worker, one generation after another, until the coordinator says finish; returns
        its index, attempt and records read."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, self.dump_state)
        try:
            self._register()
        except CoordinatorUnreachable as e:
            # a task that raised would be retried by Spark for ever, and the driver would hear
            # nothing: the task ends, and its result says why (the runner fails the run on it)
            log.error("%s", e)
            return {"worker": self.index, "attempt": self.attempt, "error": str(e)}
        try:
            pipeline = spec_pipeline(self.spec)
            p = plan(pipeline, self.workers)
            peers = self._await_peers()
            while not self._finish and peers is not None:
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
        except Replaced as e:
            # a zombie: the coordinator no longer listens to it, and nothing it holds is
            # written anywhere; its task ends (Spark starts another attempt if none runs yet)
            log.error("%s", e)
            raise
        except Exception as e:
            self._report_error(e)
            raise
        finally:
            thaw()  # a reused Python worker runs other tasks after this one
            for part in self._parts.values():
                part.close()
            self.hooks.close(self)
            self._stop_beats()
            for c in [*self.out.values(), *self.inc.values(), self.ctrl_conn]:
                c.close()
            self.acceptor.close()
            for s, _, _ in self._early:
                s.close()
        return {"worker": self.index, "attempt": self.attempt, "read": self.counters()["read"]}

    def _open_selector(self) -> None:
        """The selector of this generation's loop: the coordinator, the peers' connections and
        (a mode that takes peers back) the listener."""
        sel = self.sel = selectors.DefaultSelector()
        sel.register(self.ctrl_conn.sock, selectors.EVENT_READ, ("ctrl", -1, self.ctrl_conn))
        if self.hooks.accepts_peers:
            # a recovering peer connects again while this worker runs on
            sel.register(self.acceptor.wakeup, selectors.EVENT_READ, ("listen", -1, None))
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
                    control.Error(f"worker {self.index}: malformed frame from worker {j}, channel closed: {e}")
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
        # what the generation was set up with (the operators and their state, the routers'
        # caches, the modules) lives until it ends: out of the collector's full passes, which
        # would otherwise walk every key of the state about once a second
        freeze_made()
        self._done_sent = idle_sent = False
        active_sources = [s for s in self.sources if not s.finished]
        start = time.time()
        hooks = self.hooks
        peer_inputs = [
            (op, ch)
            for op in self.ops
            if not op.node.params.get("loop_internal")
            for ch in op.inputs
            if exchange_sender(ch) not in (None, self.index)
        ]
        while not self._finish:
            if self.stop.pending and hooks.may_stop(self):
                hooks.stop_sources(self, self.stop.asked)
                active_sources = [s for s in active_sources if not s.stopped]
                self._done_sent = idle_sent = False
            backlog = max((c.backlog for c in self.out.values()), default=0)
            busy = (
                bool(active_sources)
                and backlog < MAX_BACKLOG_FRAMES
                and not any(h.full for h in self.heads)
                and hooks.may_read(self)
                and not self._ahead_of_peers(active_sources, peer_inputs)
            )
            if busy:
                # a paced source is polled only once it has something due (`SourceOp.due_at`)
                now = time.time()
                ready = [s for s in active_sources if s.due_at() <= now]
                busy = bool(ready)
            self.pump(0 if busy else hooks.idle(self, 0.002))
            if busy:
                for s in ready:
                    if not hooks.poll_source(self, s):
                        active_sources.remove(s)
            hooks.flush_routers(self)
            self.flush_peers()
            hooks.poll(self)
            if not idle_sent and not active_sources and all(s.frontier >= self.stop.end_epoch for s in self.sinks):
                # the input is exhausted here: say so now, not at the next heartbeat, so that
                # a mode that commits at checkpoints can start the last one at once
                idle_sent = True
                self._next_beat = 0.0
            if not self._done_sent and not active_sources and self._finished_locally() and hooks.can_finish(self):
                for op in self.sinks:
                    op.part.sync()
                self.send_ctrl(control.Done(self.gen, self.metrics(), time.time() - start))
                self._done_sent = True
            self.keepalive()

    def stop_sources(self, upto: int | None) -> None:
        """The run stops (`Stop.carry_out`), at the point of the steps the mode logs it at."""
        self.stop.carry_out(self.sources, upto)

    def _ahead_of_peers(self, sources: list, peer_inputs: list) -> bool:
        """Whether `sources` are too far past the least epoch closed on an exchange channel from
        a peer (`peer_inputs`: operator, channel) to read now (`nosync.runtime.flow`)."""
        if not peer_inputs:
            return False
        low = min(op.inputs.get(ch, EOS) for op, ch in peer_inputs)
        return self.flow.holds(min(s.epoch for s in sources), low, lambda: self.hooks.peers_up(self))

    def inc_finished(self, j: int) -> bool:
        """Whether every exchange input from worker `j` has ended (EOS) on every operator."""
        chans = [op for op in self.ops for ch, e in op.inputs.items() if exchange_sender(ch) == j and e != EOS]
        return not chans
