"""The coordinator: the driver's side of a run.

It listens on one TCP port; every worker connects to it first (authenticated like every
channel) and registers with its data address. Membership comes in generations: once all W
workers have registered for the current generation, each gets every peer's address (and what
the mode adds: which checkpoint to restore), connects to them, and reports ready. The
coordinator then watches: a worker whose control connection drops is lost; one silent for the
failure timeout (`--failure-timeout-ms`; workers beat from a thread of their own, so a busy
worker is never silent) is suspected: cut off, taken for lost, and its Spark task attempt
killed (`kill_task`), so that Spark starts the next attempt without waiting to find the
executor gone. The mode decides what a loss means (mode none: the run fails;
abs: `regroup`, a new generation that every worker joins after dropping its data connections,
with Spark's retry of the lost task among them). When every worker reports done in the current
generation, it tells them all to finish. Connections that fail the handshake are closed and
logged; they never reach the run. What happens to the run (generations, checkpoints, losses)
is appended to `events.jsonl` in the run directory as it happens, and so, every
PROGRESS_EVENT_S at most while the run goes on, is how many records it has read (`progress`):
an outside observer (`nosync chaos`) measures how far a run has got by it. The per-worker
progress rows go to `progress.jsonl` as they are taken; of both, only the newest few are kept
in memory (`rows.RowLog`), so that a run of any length holds the same.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from typing import Any

from nosync.driver.rows import RowLog
from nosync.driver.standbys import Standbys
from nosync.driver.stopping import SourceClock, Stopping
from nosync.errors import AuthError, FrameError, RunFailed
from nosync.runtime import channels, control, frames
from nosync.runtime.dead_letters import MAX_DEAD_LETTERS, DeadLetterFile, dead_letter_path

log = logging.getLogger("nosync.driver.coordinator")

TICK_S = 0.05
"""The longest the coordinator's loop waits for a message before it ticks the mode (a mode
whose tick is due sooner says so: `Mode.due_in`)."""
PROGRESS_S = 0.1
"""How often the per-worker progress is sampled (the workers' counters come with their
heartbeats, every `worker.HEARTBEAT_S`)."""
PROGRESS_EVENT_S = 0.2
"""How often, at most, a `progress` event (the records the workers have read, summed) goes to
events.jsonl; only when the sum changed, so an idle or finished run writes none."""


class Coordinator(Standbys):
    """The driver's side of a run: the workers' control connections, membership by generation, loss
    detection and the run's events, its loop on a thread of its own."""

    def __init__(
        self,
        workers: int,
        secret: bytes,
        mode: Any,
        run_id: str,
        host: str = "127.0.0.1",
        run_dir: str | None = None,
        max_restarts: int | None = None,
        failure_timeout_s: float = 1.5,
        kill_task: Any = None,
        standbys: int = 0,
        max_dead_letters: int | None = MAX_DEAD_LETTERS,
    ) -> None:
        self.workers = workers
        self.secret = secret
        self.mode = mode
        self.run_id = run_id
        self.run_dir = run_dir
        self.max_restarts = max_restarts
        self.failure_timeout_s = failure_timeout_s
        self.kill_task = kill_task
        """Called with (task attempt id, pid, reason) for a worker suspected: has it killed."""
        self._init_standbys(workers, standbys)
        self.listener = channels.listen(host, 0)
        self.address = (host, self.listener.getsockname()[1])
        self.acceptor = channels.Acceptor(self.listener, secret, "nosync-coordinator")
        self.conns: dict[int, channels.Connection] = {}
        self.addresses: dict[int, list] = {}
        """Per worker, the data address its newest attempt registered with (host, port)."""
        self.moved: dict[int, int] = {}
        """Per worker whose newest attempt runs on another host than the attempt before it:
        that attempt (`Peers` carries it: the local stores it finds are an older attempt's)."""
        self.attempts: dict[int, int] = {}
        self.pids: dict[int, int] = {}
        self.tasks: dict[int, int] = {}
        """Per worker, Spark's id of its newest task attempt."""
        self.longest_silence_s = 0.0
        """The longest a live worker went between two messages that count as beats."""
        self.suspicions: list[dict] = []
        """Per suspicion: the worker, its attempt, how long it had been silent."""
        self.zombies: dict[channels.Connection, dict] = {}
        """The replaced attempts' connections, still read: what each said if it woke (`Zombie`),
        and whether its connection ended."""
        self.last_beat: dict[int, float] = {}
        self.counters: dict[int, dict] = {}
        self.done: dict[int, dict] = {}
        self.gen = 0
        self.members: dict[int, list] = {}
        self.read_at_rejoin: dict[int, int] = {}
        """Records each surviving worker had read when it rejoined the current generation."""
        self.ready: set[int] = set()
        self.peers_sent = -1
        self.regroups = 0
        self.silent_s: float | None = None
        """How long the worker lost last had been silent (since its last heartbeat)."""
        self._refused_idents = 0
        self.failure: str | None = None
        self.finished = False
        self.stopping = Stopping(workers)
        """A stop of the run (`Stopping.request`) and how far it went."""
        self.source_clock = SourceClock()
        self.started_at = time.time()
        self.running_since: float | None = None
        """When every worker first ran (monotonic)."""
        self.first_record_at: float | None = None
        self._dead_letters: dict[int, DeadLetterFile] = {}
        self.max_dead_letters = max_dead_letters
        """The dead letters each worker's file may hold (--max-dead-letters; None: no bound)."""
        self._dead_count = 0
        self.events = RowLog(None if run_dir is None else os.path.join(run_dir, "events.jsonl"), append=True)
        """What happened to the run: events.jsonl, the newest in memory (iterating reads the file)."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._sample_now = False
        self.progress_rows = RowLog(None if run_dir is None else os.path.join(run_dir, "progress.jsonl"))
        """Per worker, every PROGRESS_S: records read and committed (progress.jsonl, at the end
        `progress.parquet`), the newest in memory (iterating reads the file)."""
        self._last_progress = 0.0
        self._last_progress_event = 0.0
        self._read_reported = -1
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.acceptor.wakeup, selectors.EVENT_READ, None)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="nosync-coordinator", daemon=True)
        self._thread.start()

    # -- API for the runner and the mode ----------------------------------------------

    def fail(self, reason: str) -> None:
        """Marks the run failed with `reason` (the first reason stays) and tells every worker to
        abort."""
        with self._changed:
            if self.failure is None and not self.finished:
                self.failure = reason
                log.info("run failed: %s", reason)
                self.event("failed", reason=reason)
            self._changed.notify_all()
        for c in [*self.conns.values(), *(info["conn"] for info in self.standbys.values())]:
            try:
                c.send(frames.encode(frames.CONTROL, {}, control.to_wire(control.Abort(reason))))
                c.flush()
            except OSError:
                pass

    def wait(self, timeout: float) -> bool:
        """Waits up to `timeout`, or until a worker's counts drop (a restored position, which
        the progress samples must show); True once the run finished or failed."""
        with self._changed:
            self._changed.wait_for(lambda: self.finished or self.failure is not None or self._sample_now, timeout)
            self._sample_now = False
            return self.finished or self.failure is not None

    def event(self, kind: str, **fields: Any) -> dict:
        """Records what happened to the run (appended to events.jsonl)."""
        ev = {"t": time.time(), "event": kind, "gen": self.gen, **fields}
        self.events.append(ev)
        return ev

    def ran_for(self) -> float:
        """Seconds since every worker first ran (0 before)."""
        return 0.0 if self.running_since is None else time.monotonic() - self.running_since

    def send(self, worker: int, msg: control.Message) -> None:
        """Sends a control message to worker `worker`, if it is connected."""
        conn = self.conns.get(worker)
        if conn is not None and not conn.closed:
            self._send(conn, msg)

    def broadcast(self, msg: control.Message) -> None:
        """Sends a control message to every connected worker."""
        data = frames.encode(frames.CONTROL, {}, control.to_wire(msg))
        for c in list(self.conns.values()):
            if not c.closed:
                c.send(data)
                try:
                    c.flush()
                except OSError:
                    pass

    def regroup(self, reason: str) -> None:
        """Starts a new generation: every worker drops its data connections and registers
        again; the retry of a lost worker joins it. Counted against --max-restarts."""
        self.regroups += 1
        if self.max_restarts is not None and self.regroups > self.max_restarts:
            self.fail(f"{reason}; the run already recovered {self.max_restarts} times (--max-restarts)")
            return
        self.gen += 1
        self.read_at_rejoin = {}
        self.members = {}
        self.ready = set()
        self.done = {}
        self.event("regroup", reason=reason)
        self.broadcast(control.Rejoin(self.gen))

    @property
    def all_ready(self) -> bool:
        """Whether every worker reported ready in the current generation."""
        return len(self.ready) == self.workers

    def progress(self) -> dict:
        """The run's progress from the workers' last counters: records read and committed, the
        least frontier, dead letters."""
        with self._lock:
            c = list(self.counters.values())
        return {
            "workers": len(self.conns),
            "gen": self.gen,
            "read": sum(x.get("read", 0) for x in c),
            "committed": sum(x.get("committed", 0) for x in c),
            "frontier": min([x.get("frontier", -1) for x in c] or [-1]) if len(c) == self.workers else -1,
            "dead_letters": sum(x.get("dead_letters", 0) for x in c),
        }

    def workers_info(self) -> dict:
        """Per registered worker: its attempt, process id, host and data address."""
        return {
            w: {
                "attempt": self.attempts.get(w, 0),
                "pid": pid,
                "host": self.addresses.get(w, [None])[0],
                "address": self.addresses.get(w),
            }
            for w, pid in sorted(self.pids.items())
        }

    def silent_workers(self) -> list[int]:
        """The workers still connected but silent past the failure timeout (after the run
        finished, nothing suspects them: their work is done)."""
        now = time.monotonic()
        return sorted(w for w, t in list(self.last_beat.items()) if now - t > self.failure_timeout_s)

    @property
    def refused(self) -> int:
        """Connections refused: failing the handshake, over the cap of pending ones, or naming
        another run."""
        return self._refused_idents + self.acceptor.refused

    @property
    def dead_letters_written(self) -> int:
        """Dead letters written to the run's files by this run (each record once)."""
        return self._dead_count

    def close(self) -> None:
        """Stops the loop thread, lets the mode close, and closes the connections, the
        listener, the events and progress files."""
        self._stop = True
        self._thread.join(timeout=5)
        try:
            self.mode.close(self)
        finally:
            for c in [*self.conns.values(), *(info["conn"] for info in self.standbys.values()), *self.zombies]:
                c.close()
            self.acceptor.close()
            self._sel.close()
            for f in self._dead_letters.values():
                f.close()
            self.events.close()
            self.progress_rows.close()

    # -- the loop ------------------------------------------------------------------

    def _accept(self) -> None:
        """Takes the workers' connections whose handshake the acceptor's threads passed."""
        for sock, addr, ident in self.acceptor.take():
            w = ident.get("worker")
            if (
                ident.get("role") != "worker"
                or ident.get("run") != self.run_id
                or not isinstance(w, int)
                or not 0 <= w < self.workers + self.standby_tasks
            ):
                self._refused_idents += 1
                channels.refuse(sock, addr, AuthError(f"unexpected identity {ident}"))
                continue
            conn = channels.Connection(sock, f"worker {w}")
            self._sel.register(sock, selectors.EVENT_READ, ("worker", w, conn))

    def _loop(self) -> None:
        while not self._stop:
            due = self.mode.due_in(self)
            try:
                events = self._sel.select(TICK_S if due is None else max(0.0, min(TICK_S, due)))
            except (OSError, ValueError):
                return
            for key, _ in events:
                if key.data is None:
                    self._accept()
                    continue
                kind, w, conn = key.data
                if kind == "zombie":
                    self._read_zombie(conn)
                    continue
                try:
                    got = conn.receive()
                except (FrameError, ConnectionError) as e:
                    self._sel.unregister(conn.sock)
                    conn.close()
                    if kind == "standby":
                        self._standby_lost(w, str(e))
                    else:
                        self._lost(w, conn, str(e))
                        self._promise_broken(w, conn)
                    continue
                for f in got:
                    try:
                        msg = control.from_wire(f.body)
                    except FrameError as e:
                        self.fail(f"worker {w} sent a malformed control message: {e}")
                        continue
                    if kind == "standby":
                        self._handle_standby(w, msg)
                        continue
                    try:
                        self._handle(w, conn, msg)
                    except Exception as e:  # noqa: BLE001 - a bug in a mode must fail the run, not hang it
                        log.exception("coordinator: handling %s from worker %s", type(msg).__name__, w)
                        self.fail(f"coordinator error on a message of worker {w}: {type(e).__name__}: {e}")
            now = time.monotonic()
            self._check_standbys(now)
            for w, t in list(self.last_beat.items()):
                if w not in self.done and now - t > self.failure_timeout_s and not self.finished:
                    conn = self.conns.get(w)
                    if conn is not None:
                        self._suspect(w, conn, now - t)
                    else:
                        self.last_beat.pop(w)
            if now - self._last_progress >= PROGRESS_S:
                # per-worker progress over time: what a loss cost each worker, the lost one
                # and the ones that did not fail
                self._last_progress = now
                t = time.time()
                with self._lock:
                    counts = sorted(self.counters.items())
                self.progress_rows.extend(_progress_row(t, w, c) for w, c in counts)
                if now - self._last_progress_event >= PROGRESS_EVENT_S and not self.finished and self.failure is None:
                    self._last_progress_event = now
                    read = sum(int(c.get("read") or 0) for _, c in counts)
                    if read != self._read_reported:
                        # the whole run's records read: after a restore a worker counts again
                        # from its restored position, so this sum can go down
                        self._read_reported = read
                        self.event("progress", read=read)
            if not self.finished and self.failure is None:
                try:
                    self.mode.tick(self)
                    self.stopping.tick(self)
                except Exception as e:  # noqa: BLE001
                    log.exception("coordinator: mode tick")
                    self.fail(f"coordinator error in mode {self.mode.name}: {type(e).__name__}: {e}")
            for c in list(self.conns.values()):
                if c.out_bytes and not c.closed:
                    try:
                        c.flush()
                    except OSError:
                        pass

    def _suspect(self, w: int, conn: channels.Connection, silent_s: float) -> None:
        """Worker `w` has been silent for `silent_s`: it hangs, its host is cut off, or it is
        paused. It is cut off and taken for lost (the mode recovers it), and Spark is told to
        kill its task attempt, so that the attempt's slot comes back and Spark starts the next
        one (a process that only paused wakes to a closed connection: a zombie, refused)."""
        self._sel.unregister(conn.sock)
        reason = f"no heartbeat for {silent_s:.1f} s (--failure-timeout-ms {self.failure_timeout_s * 1000:.0f})"
        # read by the process if it ever wakes: it stops instead of going on as a zombie
        self._send(conn, control.Replaced(reason))
        attempt = self.attempts.get(w, 0)
        task = self.tasks.get(w, -1)
        # its connection is still read: a process that wakes says what its fence refused
        self.zombies[conn] = {"worker": w, "attempt": attempt, "woke": False, "commits": 0, "writes": 0, "gone": False}
        self._sel.register(conn.sock, selectors.EVENT_READ, ("zombie", w, conn))
        self.suspicions.append({"t": time.time(), "worker": w, "attempt": attempt, "silent_s": silent_s})
        self.event("suspected", worker=w, attempt=attempt, task=task, silent_s=round(silent_s, 3))
        if self.kill_task is not None and task >= 0 and not self.finished:
            self.kill_task(task, self.pids.get(w, 0), f"nosync: worker {w} (attempt {attempt}) suspected: {reason}")
        self._lost(w, conn, reason)

    def _lost(self, w: int, conn: channels.Connection, reason: str, replace: bool = True) -> None:
        """Worker `w`'s attempt on `conn` is gone: the mode decides what follows, and a
        standby takes its place (`replace`: not when a new attempt is registering already)."""
        if self.conns.get(w) is not conn:
            return
        del self.conns[w]
        beat = self.last_beat.pop(w, None)
        self.silent_s = None if beat is None else time.monotonic() - beat
        if self.finished or self.failure is not None:
            return
        self.event("worker_lost", worker=w, attempt=self.attempts.get(w, 0), reason=reason)
        with self._lock:
            last = dict(self.counters.get(w, {}))
        if last:
            # its position at the loss, as the recovery's read_at_loss counts it: the series
            # sampled every PROGRESS_S may not have caught its last report
            self.progress_rows.append(_progress_row(time.time(), w, last))
        self.mode.on_worker_lost(self, w, self.attempts.get(w, 0), reason)
        self.awaiting.add(w)
        if replace:
            self._replace(w)

    def _send(self, conn: channels.Connection, msg: control.Message) -> None:
        conn.send(frames.encode(frames.CONTROL, {}, control.to_wire(msg)))
        try:
            conn.flush()
        except OSError:
            pass

    def _handle(self, w: int, conn: channels.Connection, msg: control.Message) -> None:
        match msg:
            case control.Register():
                self._register(w, conn, msg)
            case control.Heartbeat(counters=counters):
                if self.conns.get(w) is not conn:
                    return  # a promoted standby before its registration, or a connection replaced
                now = time.monotonic()
                prev = self.last_beat.get(w)
                if prev is not None and now - prev > self.longest_silence_s:
                    self.longest_silence_s = now - prev
                self.last_beat[w] = now
                if msg.beat >= 0:
                    # the worker's lease: it may commit for a while from when it sent this beat
                    conn.send(frames.encode(frames.CONTROL, {}, control.to_wire(control.Lease(msg.beat))))
                with self._lock:
                    self.counters[w] = self._counted(w, {**counters, "gen": msg.gen})
                    if self.first_record_at is None and counters.get("read"):
                        self.first_record_at = time.time()
            case control.Ready(gen=g):
                if g == self.gen:
                    self.ready.add(w)
                    self.mode.on_ready(self, w, self.gen)
                    if self.all_ready:
                        self.event("running")
                        self.running_since = self.running_since or time.monotonic()
            case control.ModeMessage():
                self.mode.on_message(self, w, msg.as_map())
            case control.Done(gen=g):
                self.last_beat[w] = time.monotonic()
                if g != self.gen or not self.stopping.accepts_done(msg.metrics):
                    return
                with self._changed:
                    self.done[w] = {"gen": msg.gen, "metrics": msg.metrics, "seconds": msg.seconds}
                    self.counters[w] = msg.metrics
                    if len(self.done) == self.workers:
                        self.broadcast(control.Finish())
                        for info in self.standbys.values():
                            self._send(info["conn"], control.Finish())
                        self.finished = True
                        self.event("finished")
                        self._changed.notify_all()
            case control.Error(message=message):
                self.fail(f"worker {w}: {message}")
            case control.DeadLetter():
                self._dead_letter(w, msg)
            case _:
                self.fail(f"worker {w} sent a {type(msg).__name__} message, which only the coordinator sends")

    def _dead_letter(self, w: int, msg: control.DeadLetter) -> None:
        """Appends a worker's dead letter to its file in the run directory, once; one past
        `max_dead_letters` fails the run."""
        if self.run_dir is None:
            self._dead_count += 1
            return
        f = self._dead_letters.get(w)
        if f is None:
            f = self._dead_letters[w] = DeadLetterFile(dead_letter_path(self.run_dir, w), self.max_dead_letters)
        letter = {"source": msg.source, "file": msg.file, "position": msg.position, "error": msg.error}
        try:
            if f.add(letter):
                self._dead_count += 1
        except RunFailed as e:
            self.fail(f"worker {w}: {e}")

    def _counted(self, w: int, msg: dict) -> dict:
        """A worker's heartbeat as the run's counters take it. A restarting worker counts from
        its restored position: until it has one (its read is None) its last counts stand.
        Committed output never shrinks, so neither does its count: a restored worker's count
        climbs back through what its lost attempt had committed (its commits are idempotent)."""
        prev = self.counters.get(w) or {}
        own = {"attempt": self.attempts.get(w, 0), "positioned": msg.get("read") is not None}
        if msg.get("read") is None:
            return {**msg, **own, "read": prev.get("read", 0), "committed": prev.get("committed", 0)}
        out = {**msg, **own}
        if msg.get("committed", 0) < prev.get("committed", 0):
            out["committed"] = prev["committed"]
        if msg["read"] < prev.get("read", 0):
            # a restored position: the run's progress is sampled at once, and the per-worker
            # series takes it now (the next heartbeat, as due as the next sample, may already
            # count records read on), so that both show the drop whole. REQUIRES: _lock held
            self._sample_now = True
            self._changed.notify_all()
            self.progress_rows.append(_progress_row(time.time(), w, out))
        return out

    def _register(self, w: int, conn: channels.Connection, msg: control.Register) -> None:
        if not self._admit(w, conn, msg):
            return
        attempt = msg.attempt
        gen = msg.gen
        prev = self.conns.get(w)
        if prev is not None and prev is not conn:
            # a new attempt of a worker whose old connection has not dropped yet: it is gone
            self._lost(w, prev, f"replaced by attempt {attempt}", replace=False)
            prev.close()
        self.conns[w] = conn
        new_attempt = attempt != self.attempts.get(w)
        before = self.addresses.get(w)
        if new_attempt:
            # an attempt on another host than the last one's: what its host holds of the
            # worker (an older attempt's stores) is stale
            if before is not None and before[0] != msg.addr[0]:
                self.moved[w] = attempt
            else:
                self.moved.pop(w, None)
        self.addresses[w] = list(msg.addr)
        self.attempts[w] = attempt
        self.pids[w] = msg.pid
        self.tasks[w] = msg.task
        self.last_beat[w] = time.monotonic()
        if not new_attempt and msg.read is not None:
            self.read_at_rejoin[w] = msg.read
        if new_attempt:
            self.event("registered", worker=w, attempt=attempt, pid=self.pids[w], host=msg.addr[0])
            self.mode.on_worker_registered(self, w, attempt)
        if self.finished:
            self._send(conn, control.Finish())
            return
        if self.failure is not None:
            self._send(conn, control.Abort(self.failure))
            return
        if gen == -1 or gen == self.gen:
            self.members[w] = list(msg.addr)
        elif gen < self.gen:
            self._send(conn, control.Rejoin(self.gen))
            return
        if len(self.members) == self.workers and all(x in self.conns for x in range(self.workers)):
            if self.peers_sent == self.gen:
                if new_attempt and gen == -1:
                    # a retried task joins a generation already running
                    self.mode.on_rejoin(self, w, attempt, self.members[w])
                return
            self.peers_sent = self.gen
            extra = self.mode.on_generation(self, self.gen)
            if extra is not None:
                self.release_generation(extra)

    def release_generation(self, extra: dict) -> None:
        """Sends every worker the peers of the current generation, with what the mode adds."""
        peers = [self.members[i] for i in range(self.workers)]
        self.event("generation", workers=len(peers))
        extra = {**extra, "moved": dict(self.moved), "source_t0": self.source_clock.t0()}
        self.broadcast(control.Peers(self.gen, peers, extra))


def _progress_row(t: float, worker: int, c: dict) -> dict:
    """One row of progress.parquet: a worker's records read and committed at time t."""
    return {
        "t": t,
        "worker": worker,
        "attempt": int(c.get("attempt", 0)),
        "positioned": bool(c.get("positioned", True)),
        "read": int(c.get("read", 0)),
        "committed": int(c.get("committed", 0)),
    }


__all__ = ["Coordinator", "RunFailed"]
