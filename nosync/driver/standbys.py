"""The standbys half of the coordinator (`--standbys S`), and the attempts it replaced.

S spare tasks start with the run (Spark's task indexes W to W + S - 1). Each registers, holds no
partition and waits, beating. When a worker is lost or suspected, its index goes at once to a
standby (`Promote`), on another host than the lost attempt's where there is one: it registers
as that worker with the next attempt number and restores it as Spark's retry would. Spark's
retry of the killed task, when it comes, finds the index taken and stands by in its place.

The coordinator numbers attempts: a process that registers with an attempt a promotion already
used (Spark counts its own) is given the next one, so a restart is always attempt > 0 and
newer than every earlier attempt of that worker, whichever process runs it.

A replaced attempt's connection is still read (`_read_zombie`): a process that wakes reports
what its fence refused before it stops, and its connection's end is its exit (`fencing`).
"""

from __future__ import annotations

import selectors
import time

from nosync.errors import FrameError
from nosync.runtime import channels, control

PLACE_TIMEOUT_S = 120.0
"""How long a lost worker may wait for a process to take its place (a standby, or Spark's
retry) before the run fails naming it: Spark notices an executor it cannot reach only after
spark.network.timeout (120 s by default)."""


class Standbys:
    """The standbys half of `Coordinator` (`nosync.driver.coordinator`), which holds their state."""

    def _init_standbys(self, workers: int, standbys: int) -> None:
        self.standby_tasks = standbys
        """Spare tasks the run started (`--standbys`): task indexes W to W + S - 1."""
        self.standbys: dict[int, dict] = {}
        """Per standby waiting (an id of its own): its connection, host, task, pid, last beat."""
        self._next_standby = workers
        self.promoted: dict[int, channels.Connection] = {}
        """Per worker, the connection of the standby last promoted to it."""
        self._promised: dict[channels.Connection, tuple[int, int]] = {}
        """Connections told to register as (worker, attempt), not registered yet."""
        self._known: set[channels.Connection] = set()
        """Connections registered as a worker."""
        self.max_attempt: dict[int, int] = {}
        """Per worker, the highest attempt number it registered with or was given."""
        self.awaiting: set[int] = set()
        """Workers lost and not registered again yet."""
        self._awaiting_since: dict[int, float] = {}
        self.promotions: list[dict] = []

    def _admit(self, w: int, conn: channels.Connection, msg: control.Register) -> bool:
        """Whether the registration `msg` on `conn` goes on as worker `w`'s. A new process may
        instead be a standby (a spare task, or Spark's retry of a worker a standby replaced) or
        have its attempt renumbered (one a promotion used already): then it is told so, and
        False."""
        promised = self._promised.pop(conn, None)
        if promised is None and conn not in self._known:
            if w >= self.workers or self._held(w, conn):
                self._stand_by(conn, msg)
                return False
            if msg.attempt <= self.max_attempt.get(w, -1):
                attempt = self.max_attempt[w] + 1
                self.max_attempt[w] = attempt
                self._promised[conn] = (w, attempt)
                self._send(conn, control.Promote(w, attempt))
                return False
        elif promised is not None and promised != (w, msg.attempt):
            self.fail(f"worker {w} registered as attempt {msg.attempt}, not as the {promised} it was given")
            return False
        self._known.add(conn)
        self.max_attempt[w] = max(self.max_attempt.get(w, -1), msg.attempt)
        self.awaiting.discard(w)
        return True

    def _check_standbys(self, now: float) -> None:
        """A standby silent past the failure timeout is dropped, and its task killed (Spark's
        retry of it comes back a standby). Workers lost and not placed again within
        PLACE_TIMEOUT_S (no standby left, no retry from Spark) fail the run, named."""
        for w in list(self._awaiting_since):
            if w not in self.awaiting:
                del self._awaiting_since[w]
        for w in self.awaiting:
            self._awaiting_since.setdefault(w, now)
        late = sorted(w for w, t in self._awaiting_since.items() if now - t > PLACE_TIMEOUT_S)
        if late and self.failure is None and not self.finished:
            names = ", ".join(map(str, late))
            self.fail(
                f"worker{'s' if len(late) > 1 else ''} {names} lost and not placed again within "
                f"{PLACE_TIMEOUT_S:g} s: no standby was left and Spark started no new attempt (no free slot, or "
                f"an executor it cannot reach); --standbys S starts spare tasks that take a lost worker's place"
            )
        for sid, info in list(self.standbys.items()):
            if now - info["beat"] > self.failure_timeout_s and not self.finished:
                self._sel.unregister(info["conn"].sock)
                info["conn"].close()
                self._standby_lost(sid, f"no heartbeat for {now - info['beat']:.1f} s")
                if self.kill_task is not None and info["task"] >= 0:
                    self.kill_task(info["task"], info["pid"], f"nosync: standby {sid} suspected")

    def _stand_by(self, conn: channels.Connection, msg: control.Register) -> None:
        """Takes the process on `conn` as a standby: a spare task, or Spark's retry of a worker
        a standby already replaced. It is promoted at once if a worker waits for one."""
        sid = self._next_standby
        self._next_standby += 1
        self.standbys[sid] = {
            "conn": conn,
            "host": msg.addr[0],
            "task": msg.task,
            "pid": msg.pid,
            "beat": time.monotonic(),
        }
        self._sel.modify(conn.sock, selectors.EVENT_READ, ("standby", sid, conn))
        self.event("standby", standby=sid, host=msg.addr[0], pid=msg.pid, task_index=msg.worker)
        if self.finished:
            self._send(conn, control.Finish())
            return
        self._send(conn, control.Standby())
        for w in sorted(self.awaiting):
            if w not in self.conns and not self._held(w, None):
                self._replace(w)
                break

    def _handle_standby(self, sid: int, msg: control.Message) -> None:
        info = self.standbys.get(sid)
        if info is None:
            return
        match msg:
            case control.Heartbeat():
                info["beat"] = time.monotonic()
            case control.Error(message=message):
                self.event("standby_failed", standby=sid, reason=message)
            case _:
                pass  # a standby has nothing else to say

    def _standby_lost(self, sid: int, reason: str) -> None:
        """A standby whose connection dropped or who went silent: Spark retries its task,
        which comes back a standby."""
        if self.standbys.pop(sid, None) is not None:
            self.event("standby_lost", standby=sid, reason=reason)

    def _held(self, w: int, conn: channels.Connection | None) -> bool:
        """Whether a standby other than `conn` was promoted to worker `w` and is alive."""
        c = self.promoted.get(w)
        return c is not None and c is not conn and not c.closed and (self.conns.get(w) is c or c in self._promised)

    def _replace(self, w: int) -> None:
        """Promotes a standby to worker `w`, lost: one on another host than the lost attempt's
        where there is one, and on a host that runs no other worker where there is one. Without
        a standby, Spark's retry of the task is waited for."""
        if not self.standbys or self.failure is not None or self.finished:
            return
        lost_host = self.addresses.get(w, [None])[0]
        busy = {self.addresses[x][0] for x in self.conns if x != w and x in self.addresses}
        # off the lost attempt's host, then off the hosts running another worker
        hosts = {k: self.standbys[k]["host"] for k in self.standbys}
        sid = min(hosts, key=lambda k: (hosts[k] == lost_host, hosts[k] in busy, k))
        info = self.standbys.pop(sid)
        conn = info["conn"]
        attempt = self.max_attempt.get(w, -1) + 1
        self.max_attempt[w] = attempt
        self._promised[conn] = (w, attempt)
        self.promoted[w] = conn
        self._sel.modify(conn.sock, selectors.EVENT_READ, ("worker", w, conn))
        self.promotions.append({"t": time.time(), "worker": w, "attempt": attempt, "host": info["host"]})
        self.event("promoted", worker=w, attempt=attempt, standby=sid, host=info["host"], pid=info["pid"])
        self._send(conn, control.Promote(w, attempt))

    def _promise_broken(self, w: int, conn: channels.Connection) -> None:
        """A standby promoted to `w` went away before it registered: another one is promoted."""
        if self._promised.pop(conn, None) is not None and w in self.awaiting:
            self._replace(w)

    # -- replaced attempts ----------------------------------------------------------------

    def _read_zombie(self, conn: channels.Connection) -> None:
        """What a replaced attempt sent: its `Zombie` report once it read `Replaced` (anything
        else, a beat sent as it woke, changes nothing); its connection's end is its exit."""
        z = self.zombies[conn]
        try:
            got = conn.receive()
        except (FrameError, ConnectionError):
            got = None
        for f in got or ():
            try:
                msg = control.from_wire(f.body)
            except FrameError:
                continue
            if isinstance(msg, control.Zombie):
                z.update(woke=True, commits=msg.commits, writes=msg.writes)
                self.event("zombie", worker=z["worker"], attempt=z["attempt"], commits=msg.commits, writes=msg.writes)
        if got is None:
            self._sel.unregister(conn.sock)
            conn.close()
            z["gone"] = True

    def fencing(self) -> dict:
        """The run's replaced attempts: how many there were, how many woke (they read that they
        were replaced), what their fences refused, and how many have ended."""
        zs = list(self.zombies.values())
        return {
            "zombies": len(zs),
            "zombies_woke": sum(z["woke"] for z in zs),
            "zombie_commits_refused": sum(z["commits"] for z in zs),
            "zombie_writes_refused": sum(z["writes"] for z in zs),
            "zombies_gone": sum(z["gone"] for z in zs),
        }

    def zombies_alive(self) -> list[int]:
        """The workers of the replaced attempts whose connections have not ended: their tasks
        may never end by themselves (a host stopped or cut off)."""
        return sorted(z["worker"] for z in list(self.zombies.values()) if not z["gone"])
