"""The coordinator: the driver's side of a run.

It listens on one TCP port; every worker connects to it first (authenticated like every
channel), registers with its data address, and gets all peers' addresses once W workers have
registered. It then watches: a worker whose control connection drops or whose heartbeats stop
for HEARTBEAT_TIMEOUT_S is lost, and the mode decides what that means (mode none: the run
fails). When every worker reports done, it tells them all to finish. Connections that fail the
handshake are closed and logged; they never reach the run.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from typing import Any

from nosync import channels, frames
from nosync.errors import AuthError, FrameError, RunFailed

log = logging.getLogger("nosync.coordinator")

HEARTBEAT_TIMEOUT_S = 5.0


class Coordinator:
    def __init__(self, workers: int, secret: bytes, mode: Any, run_id: str, host: str = "127.0.0.1") -> None:
        self.workers = workers
        self.secret = secret
        self.mode = mode
        self.run_id = run_id
        self.listener = channels.listen(host, 0)
        self.address = (host, self.listener.getsockname()[1])
        self.conns: dict[int, channels.Connection] = {}
        self.addresses: dict[int, list] = {}
        self.attempts: dict[int, int] = {}
        self.pids: dict[int, int] = {}
        self.last_beat: dict[int, float] = {}
        self.counters: dict[int, dict] = {}
        self.done: dict[int, dict] = {}
        self.refused = 0
        self.failure: str | None = None
        self.finished = False
        self.started_at = time.time()
        self.first_record_at: float | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.listener, selectors.EVENT_READ, None)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="nosync-coordinator", daemon=True)
        self._thread.start()

    # -- API for the runner ----------------------------------------------------------

    def fail(self, reason: str) -> None:
        with self._changed:
            if self.failure is None and not self.finished:
                self.failure = reason
                log.info("run failed: %s", reason)
            self._changed.notify_all()
        for c in list(self.conns.values()):
            try:
                c.send(frames.encode(frames.CONTROL, {}, {"type": "abort", "reason": reason}))
                c.flush()
            except OSError:
                pass

    def wait(self, timeout: float) -> bool:
        """Waits up to `timeout`; True once the run finished or failed."""
        with self._changed:
            self._changed.wait_for(lambda: self.finished or self.failure is not None, timeout)
            return self.finished or self.failure is not None

    def progress(self) -> dict:
        with self._lock:
            c = list(self.counters.values())
        return {
            "workers": len(self.conns),
            "read": sum(x.get("read", 0) for x in c),
            "committed": sum(x.get("committed", 0) for x in c),
            "frontier": min([x.get("frontier", -1) for x in c] or [-1]) if len(c) == self.workers else -1,
            "dead_letters": sum(x.get("dead_letters", 0) for x in c),
        }

    def workers_info(self) -> dict:
        """Per registered worker: its attempt and process id."""
        return {w: {"attempt": self.attempts.get(w, 0), "pid": pid} for w, pid in sorted(self.pids.items())}

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=5)
        for c in list(self.conns.values()):
            c.close()
        self.listener.close()
        self._sel.close()

    # -- the loop ------------------------------------------------------------------

    def _accept(self) -> None:
        try:
            sock, addr = self.listener.accept()
        except OSError:
            return
        threading.Thread(target=self._handshake, args=(sock, addr), daemon=True).start()

    def _handshake(self, sock: socket.socket, addr: Any) -> None:
        try:
            ident = channels.accept_handshake(sock, self.secret)
            if ident.get("role") != "worker" or ident.get("run") != self.run_id:
                raise AuthError(f"unexpected identity {ident}")
        except AuthError as e:
            self.refused += 1
            channels.refuse(sock, addr, e)
            return
        conn = channels.Connection(sock, f"worker {ident['worker']}")
        with self._lock:
            self._sel.register(sock, selectors.EVENT_READ, ("worker", int(ident["worker"]), conn))

    def _loop(self) -> None:
        while not self._stop:
            try:
                events = self._sel.select(0.1)
            except (OSError, ValueError):
                return
            for key, _ in events:
                if key.data is None:
                    self._accept()
                    continue
                _, w, conn = key.data
                try:
                    got = conn.receive()
                except (FrameError, ConnectionError) as e:
                    self._sel.unregister(conn.sock)
                    conn.close()
                    self._lost(w, conn, str(e))
                    continue
                for f in got:
                    self._handle(w, conn, f.body)
            now = time.monotonic()
            for w, t in list(self.last_beat.items()):
                if w not in self.done and now - t > HEARTBEAT_TIMEOUT_S and not self.finished:
                    self.last_beat.pop(w)
                    self.mode.on_worker_lost(
                        self, w, self.attempts.get(w, 0), f"no heartbeat for {HEARTBEAT_TIMEOUT_S}s"
                    )
            for c in list(self.conns.values()):
                if c.out_bytes and not c.closed:
                    try:
                        c.flush()
                    except OSError:
                        pass

    def _lost(self, w: int, conn: channels.Connection, reason: str) -> None:
        if self.conns.get(w) is not conn:
            return
        del self.conns[w]
        self.last_beat.pop(w, None)
        if self.finished or w in self.done or self.failure is not None:
            return
        self.mode.on_worker_lost(self, w, self.attempts.get(w, 0), reason)

    def _send(self, conn: channels.Connection, msg: dict) -> None:
        conn.send(frames.encode(frames.CONTROL, {}, msg))
        conn.flush()

    def _handle(self, w: int, conn: channels.Connection, msg: Any) -> None:
        if not isinstance(msg, dict):
            return
        t = msg.get("type")
        if t == "register":
            attempt = int(msg.get("attempt", 0))
            self.conns[w] = conn
            self.attempts[w] = attempt
            self.addresses[w] = list(msg["addr"])
            self.pids[w] = int(msg.get("pid", 0))
            self.last_beat[w] = time.monotonic()
            self.mode.on_worker_registered(self, w, attempt)
            if self.failure is not None:
                self._send(conn, {"type": "abort", "reason": self.failure})
                return
            if len(self.addresses) == self.workers and all(x in self.conns for x in range(self.workers)):
                peers = [self.addresses[i] for i in range(self.workers)]
                for c in self.conns.values():
                    self._send(c, {"type": "peers", "addresses": peers})
        elif t == "heartbeat":
            self.last_beat[w] = time.monotonic()
            with self._lock:
                self.counters[w] = msg
                if self.first_record_at is None and msg.get("read"):
                    self.first_record_at = time.time()
        elif t == "done":
            self.last_beat[w] = time.monotonic()
            with self._changed:
                self.done[w] = msg
                self.counters[w] = msg["metrics"]
                if len(self.done) == self.workers:
                    for c in self.conns.values():
                        self._send(c, {"type": "finish"})
                    self.finished = True
                    self._changed.notify_all()
        elif t == "error":
            self.fail(f"worker {w}: {msg.get('message')}")


__all__ = ["Coordinator", "RunFailed"]
