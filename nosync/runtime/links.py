"""A worker's links: its control connection to the coordinator (registration, reports,
heartbeats) and its data connections to its peers, made for each membership generation,
and made again with a peer that comes back while the others run on."""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time

from nosync.errors import AuthError, FrameError, PeerLost, RunFailed
from nosync.options import HEARTBEAT_MS
from nosync.runtime import channels, control, frames

log = logging.getLogger("nosync.worker")

HEARTBEAT_S = HEARTBEAT_MS / 1000
LEASE_SHARE = 0.75
"""A worker commits only within this share of the failure timeout after sending the last beat
the coordinator answered (`Links.fence`): the coordinator suspects it no sooner than the whole
timeout after that beat, and the rest is a margin for clocks that run at slightly different
rates."""
BEATS_KEPT = 256
"""Send times of the latest beats kept to match the coordinator's answers (`Lease`)."""
SETUP_TIMEOUT_S = 120.0
CONNECT_S = 20.0
"""How long a worker tries to reach the coordinator before it gives up and says so: well
within the coordinator's own SETUP_TIMEOUT_S for every worker to register."""


class CoordinatorUnreachable(Exception):
    """The worker could not reach the coordinator at all: nothing can tell the run but the
    task's own result (`Worker.run` returns it, so that Spark does not retry the task)."""


class Rejoin(Exception):
    """The coordinator moved the run to generation `gen`: drop the data connections."""

    def __init__(self, gen: int) -> None:
        super().__init__(f"rejoin generation {gen}")
        self.gen = gen


class Links:
    """The connections half of `Worker` (`nosync.runtime.worker`), which holds their state."""

    def _register(self) -> None:
        """Connects to the coordinator, then listens for peers on the address that connection
        leaves from: the executor's own address on the network the driver is reached through
        (loopback only when the coordinator is on loopback, an embedded run), which every peer
        reaches as the driver does. Registers with it."""
        address = tuple(self.spec["coordinator"])
        sock = self._dial_coordinator(address)
        host = sock.getsockname()[0]
        self.listener = channels.listen(host, 0)
        self.address = [host, self.listener.getsockname()[1]]
        self.acceptor = channels.Acceptor(self.listener, self.secret, f"nosync-w{self.index}")
        self._early: list[tuple[socket.socket, object, dict]] = []
        """Peers' connections for a generation this worker has not reached yet."""
        self.ctrl_conn = channels.Connection(sock, "coordinator")
        self._ctrl_lock = threading.Lock()
        self._last_beat_sent = 0.0
        self._progress: dict = self.counters()
        self._beat_no = 0
        self._beats_sent: dict[int, float] = {}
        self._lease_from = -float("inf")
        self.lease_s = self.hooks.options.failure_timeout_ms / 1000 * LEASE_SHARE
        self.refused = {"commits": 0, "writes": 0}
        """What this attempt refused to do because its lease had lapsed (`fence`), or to take
        reported if it learns it was replaced."""
        self.fenced_attempts: dict[int, int] = {}
        """Per peer, its newest attempt the coordinator said was lost: a connection from it or
        an earlier one is refused (`zombie_connections`), as one of an earlier generation is."""
        self.zombie_connections = 0
        self._send_register(-1)
        self._beats_stop = threading.Event()
        self._beats = threading.Thread(target=self._beat, name=f"nosync-w{self.index}-heartbeat", daemon=True)
        self._beats.start()

    def _beat(self) -> None:
        """The heartbeat thread: the worker is alive as long as its process runs, whatever its
        loop is busy with. A beat it sends carries the progress the loop last published; the
        loop's own beats (`keepalive`) carry fresh progress, and this thread sends one only
        when the loop has not for HEARTBEAT_S."""
        while not self._beats_stop.wait(HEARTBEAT_S / 2):
            if time.monotonic() - self._last_beat_sent < HEARTBEAT_S:
                continue
            with self._ctrl_lock:
                if self.ctrl_conn.closed:
                    return
                self._last_beat_sent = time.monotonic()
                self.ctrl_conn.send(frames.encode(frames.CONTROL, {}, control.to_wire(self._heartbeat())))
                try:
                    self.ctrl_conn.flush()
                except OSError:
                    return  # the loop finds the coordinator gone

    def _heartbeat(self) -> control.Heartbeat:
        """The next beat, its send time noted. REQUIRES: `_ctrl_lock` held, and the beat sent."""
        self._beat_no += 1
        sent = self._beats_sent
        sent[self._beat_no] = time.monotonic()
        if len(sent) > BEATS_KEPT:
            del sent[next(iter(sent))]
        return control.Heartbeat(self.gen, self._progress, self._beat_no)

    def _leased(self, beat: int) -> None:
        """The coordinator heard beat `beat`: the lease runs from when it was sent."""
        t = self._beats_sent.get(beat)
        if t is not None and t > self._lease_from:
            self._lease_from = t

    def lease_left(self) -> float:
        """Seconds this attempt's lease has left (<= 0: lapsed)."""
        return self._lease_from + self.lease_s - time.monotonic()

    def fence(self, what: str = "commits") -> str | None:
        """None while this attempt may change what outlives it (commit a sink's output, write
        the shared tier): the last beat the coordinator answered was sent less than `lease_s`
        ago, so the coordinator cannot have suspected and replaced it. Otherwise why not, and
        the refusal is counted under `what` ("commits" or "writes"). A process that paused
        past the failure timeout wakes with a lapsed lease, and what it would do before it
        reads that it was replaced is refused. Called from the loop and the stores' threads."""
        if self.lease_left() > 0:
            return None
        age = time.monotonic() - self._lease_from
        self.refused[what] += 1
        return (
            f"worker {self.index} (attempt {self.attempt}) holds no lease: the coordinator answered no beat "
            f"sent in the last {age:.2f} s (lease {self.lease_s:.2f} s)"
        )

    def _stop_beats(self) -> None:
        self._beats_stop.set()
        self._beats.join(timeout=1)

    def _dial_coordinator(self, address: tuple) -> socket.socket:
        """An authenticated connection to the coordinator, tried again for CONNECT_S (its
        listener is up before any task starts, so a refusal is not expected to last); raises
        CoordinatorUnreachable naming the address and what went wrong."""
        deadline = time.monotonic() + CONNECT_S
        ident = {"role": "worker", "worker": self.index, "attempt": self.attempt, "run": self.spec["run_id"]}
        while True:
            left = deadline - time.monotonic()
            try:
                return channels.connect(address, self.secret, ident, timeout=max(1.0, min(10.0, left)))
            except (OSError, AuthError) as e:
                if time.monotonic() + 0.5 >= deadline:
                    host = socket.gethostname()
                    raise CoordinatorUnreachable(
                        f"worker {self.index} (attempt {self.attempt}, on host {host}) could not reach the coordinator "
                        f"at {address[0]}:{address[1]} within {CONNECT_S:.0f} s: {e}; that address must be reachable "
                        f"from every executor (give the driver's address with --driver-host)"
                    ) from e
                time.sleep(0.5)

    def _send_register(self, gen: int) -> None:
        """Registers for generation `gen` (-1: whichever the coordinator is in). The coordinator
        counts its silence from the registration: the lease runs from it too."""
        self._lease_from = max(self._lease_from, time.monotonic())
        self.send_ctrl(
            control.Register(
                worker=self.index,
                attempt=self.attempt,
                gen=gen,
                addr=list(self.address),
                pid=os.getpid(),
                # records read when the last generation ended: exact, where heartbeats lag
                read=sum(s.records_in for s in self.sources),
                task=self.task_id,
            )
        )

    def _become(self, worker: int, attempt: int) -> None:
        """A standby promoted: from now on this process is attempt `attempt` of worker
        `worker`, and registers as it; it restores that worker as a Spark retry would."""
        log.warning(
            "standby (task %s, pid %s) promoted: now worker %s, attempt %s", self.task_id, os.getpid(), worker, attempt
        )
        self._promote = None
        self.index, self.attempt, self.standby = worker, attempt, False
        slow = self.spec.get("slow_worker")
        self.slow_s = slow[1] / 1000 if slow and slow[0] == worker else 0.0
        self._peers_deadline = time.monotonic() + SETUP_TIMEOUT_S
        self._send_register(-1)

    def send_ctrl(self, msg: control.Message) -> None:
        """Queues a control message to the coordinator (written by the loop, or by keepalive)."""
        data = frames.encode(frames.CONTROL, {}, control.to_wire(msg))
        with self._ctrl_lock:
            self.ctrl_conn.send(data)

    def flush_ctrl(self) -> None:
        """Writes what the coordinator's connection takes now (the heartbeat thread writes to
        it too)."""
        with self._ctrl_lock:
            self.ctrl_conn.flush()

    def report_ready(self) -> None:
        """Tells the coordinator this generation runs here (once): the operators are built and
        restored, and the worker executes (a mode may say so before its replay is done)."""
        if not self._ready_sent:
            self._ready_sent = True
            self.send_ctrl(control.Ready(self.gen))

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
            self._progress = self.counters()
            with self._ctrl_lock:
                self._last_beat_sent = now
                self.ctrl_conn.send(frames.encode(frames.CONTROL, {}, control.to_wire(self._heartbeat())))
        if self.ctrl_conn.out_bytes:
            self.flush_ctrl()

    def _read_ctrl(self) -> None:
        try:
            got = self.ctrl_conn.receive()
        except FrameError as e:
            raise RunFailed(f"malformed frame from the coordinator: {e}") from e
        except ConnectionError as e:
            raise RunFailed(f"lost the coordinator: {e}") from e
        for f in got:
            try:
                msg = control.from_wire(f.body)
            except FrameError as e:
                raise RunFailed(f"malformed message from the coordinator: {e}") from e
            self._handle_ctrl(msg)

    def _await_peers(self) -> control.Peers | None:
        """Waits for the peers of a generation newer than the current one (answering rejoins
        by registering for them), with heartbeats."""
        self._peers = None
        self._peers_deadline = time.monotonic() + SETUP_TIMEOUT_S
        sel = selectors.DefaultSelector()
        sel.register(self.ctrl_conn.sock, selectors.EVENT_READ)
        try:
            while True:
                if self._finish:
                    return None
                if self._promote is not None:
                    self._become(*self._promote)
                if self._rejoin is not None:
                    g, self._rejoin = self._rejoin, None
                    self._send_register(g)
                peers = self._peers
                if peers is not None and (self._rejoin is None or peers.gen >= self._rejoin):
                    self._peers = None
                    return peers
                self.keepalive()
                if self.standby:
                    self._peers_deadline = time.monotonic() + SETUP_TIMEOUT_S  # a standby waits as long as it must
                elif time.monotonic() > self._peers_deadline:
                    raise RunFailed(f"worker {self.index}: no peers from the coordinator in {SETUP_TIMEOUT_S:.0f}s")
                if sel.select(0.05):
                    self._read_ctrl()
        finally:
            sel.close()

    def _accepted(self, gen: int, wait: float = 0.0) -> list[tuple[int, socket.socket, dict]]:
        """The peers' connections for generation `gen` that passed the handshake, as (peer,
        socket, identity), waiting up to `wait` for one: those for a later generation are kept
        for it, the rest refused."""
        got = []
        early, self._early = self._early, []
        for s, addr, ident in early + self.acceptor.take(0.0 if early else wait):
            try:
                j = ident.get("from")
                if ident.get("role") != "data" or ident.get("to") != self.index or not isinstance(j, int):
                    raise AuthError(f"unexpected identity {ident}")
                if not 0 <= j < self.workers or j == self.index:
                    raise AuthError(f"unexpected identity {ident}")
                g = ident.get("gen")
                if not isinstance(g, int) or g < gen:
                    self.zombie_connections += 1
                    raise AuthError(f"identity {ident} of a generation before {gen}")
                a = ident.get("attempt")
                if not isinstance(a, int) or a <= self.fenced_attempts.get(j, -1):
                    self.zombie_connections += 1
                    raise AuthError(f"identity {ident} of an attempt of worker {j} that was replaced")
            except AuthError as e:
                channels.refuse(s, addr, e)
                continue
            if g > gen:
                self._early.append((s, addr, ident))
            else:
                got.append((j, s, ident))
        return got

    def _connect_peers(self, peers: list, gen: int) -> None:
        expected = self.workers - 1
        accepted: dict[int, socket.socket] = {}
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
            while len(accepted) < expected and time.monotonic() < deadline:
                for j, s, _ in self._accepted(gen, wait=0.1):
                    old = accepted.pop(j, None)
                    if old is not None:
                        old.close()
                    accepted[j] = s
                self.keepalive()
                self._poll_ctrl_nowait()
                if self._rejoin is not None:
                    raise Rejoin(self._rejoin)
        finally:
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

    def fence_peer(self, j: int, attempt: int) -> None:
        """The coordinator took attempt `attempt` of worker `j` for lost: neither it nor an
        earlier attempt connects to this worker again (a process that only paused wakes to
        find itself refused). Its connections go (`peer_down`)."""
        if attempt > self.fenced_attempts.get(j, -1):
            self.fenced_attempts[j] = attempt
        self.peer_down(j, attempt)

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
        conn = channels.Connection(s, f"worker {j}", credits=channels.INITIAL_CREDITS)
        conn.attempt = attempt
        self.attach(j, conn, "out")
        return conn

    def _accept_peer(self) -> None:
        """A peer that came back connects to this running worker (its handshake ran on the
        acceptor's thread, never on this loop)."""
        for j, s, ident in self._accepted(self.gen):
            conn = channels.Connection(s, f"worker {j}")
            conn.attempt = int(ident.get("attempt", 0))
            self.attach(j, conn, "in")
            self.hooks.on_peer_connected(self, j, conn, "in")

    def _report_zombie(self) -> None:
        """Tells the coordinator, which keeps reading a replaced attempt's connection, what this
        attempt's fence refused: its last words, written at once."""
        self._stop_beats()
        try:
            with self._ctrl_lock:
                self.ctrl_conn.sock.setblocking(True)
                self.ctrl_conn.sock.settimeout(1.0)
                self.ctrl_conn.flush()
                self.ctrl_conn.sock.sendall(
                    frames.encode(frames.CONTROL, {}, control.to_wire(control.Zombie(**self.refused)))
                )
        except OSError:
            pass

    def _report_error(self, e: BaseException) -> None:
        """Tells the coordinator why this worker stops, before its connection drops."""
        msg = str(e) if isinstance(e, RunFailed) else f"{type(e).__name__}: {e}"
        if isinstance(e, RunFailed) and "channel with worker" in msg:
            return  # a consequence of another worker's end, which that worker reports
        self._stop_beats()
        try:
            self.ctrl_conn.sock.setblocking(True)
            self.ctrl_conn.flush()
            self.ctrl_conn.sock.sendall(frames.encode(frames.CONTROL, {}, control.to_wire(control.Error(msg))))
        except OSError:
            pass
