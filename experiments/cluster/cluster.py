"""A running cluster, as its user sees it: where to run (`master`, `remote`), its hosts, and
what can be done to one of them.

`Cluster` is a view of the state file, frozen; it can be made again from the file in any
process (`load`), which is how `nosync chaos --cluster` gets one. The pids of the hosts'
processes are not part of it: they are found live, by namespace, since a host's processes
change with every loss and restart, whoever made them.

A lost machine is `kill_host` then `restart_host`: every process of the host killed, its
private root gone with the last of them, then a new Spark worker on the host with a fresh,
empty root, as a replaced machine at the same address. `lose_host` does both and returns
once the master counts every host's worker again.

The failures a host does not announce: `cut_host` cuts its link to the bridge (its packets are
dropped both ways, no connection is reset; its loopback works), `heal_host` restores it;
`stop_host` stops every process of the host (SIGSTOP), a machine that stopped answering, which
`kill_host` then `restart_host` replace.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from experiments.cluster import network, processes, s3, sockets
from experiments.cluster.errors import ClusterError
from experiments.cluster.layout import Host
from experiments.cluster.sockets import Socket
from experiments.cluster.state import ClusterState, read, write

RESTART_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class HostStatus:
    """A host now: the pid of its Spark worker (None: none runs), and whether the master
    counts a worker of it alive."""

    host: Host
    worker_pid: int | None
    alive: bool


@dataclass(frozen=True)
class ClusterStatus:
    """A cluster now: its hosts, the workers the master counts alive (None: the master does
    not answer), and whether the S3 server answers."""

    hosts: tuple[HostStatus, ...]
    alive_workers: int | None
    s3_reachable: bool


@dataclass(frozen=True)
class Cluster:
    """A cluster that `up` made: run on it with `--master master --remote remote`; the
    driver runs in the root namespace and is reached at `driver_address`."""

    name: str
    master: str
    remote: str
    driver_address: str
    master_host: Host
    hosts: tuple[Host, ...]
    cores: int
    memory: str
    state_dir: str
    local_root: str

    @classmethod
    def of(cls, state: ClusterState) -> Cluster:
        """The cluster the state `state` describes."""
        layout = state.layout
        return cls(
            name=state.name,
            master=state.master_url,
            remote=state.remote,
            driver_address=layout.driver_address,
            master_host=layout.master,
            hosts=layout.hosts,
            cores=state.cores,
            memory=state.memory,
            state_dir=state.state_dir,
            local_root=state.local_root,
        )

    def host(self, which: int | str) -> Host:
        """The host of index `which` (1..N) or of namespace name `which`."""
        for h in self.hosts:
            if which in (h.index, h.name):
                return h
        raise ClusterError(f"cluster {self.name} has no host {which!r}")

    def host_of_pid(self, pid: int) -> Host | None:
        """The host whose namespace the process `pid` runs in; None when it runs in none of
        them (the driver's host, the master's) or is gone."""
        ns = processes.netns_of(pid, [h.name for h in self.hosts])
        return None if ns is None else self.host(ns)

    def worker_pid(self, host: Host) -> int | None:
        """The pid of `host`'s Spark worker, if one runs."""
        return processes.spark_pid(host.name, processes.WORKER_CLASS)

    def master_state(self) -> dict[str, Any] | None:
        """The master's JSON state (`aliveworkers`, `workers`, `activeapps`, ...); None when
        it does not answer."""
        return processes.master_json(self.master_host.address)

    def kill_host(self, host: Host) -> float:
        """SIGKILLs every process of `host` (its worker, executors, their Python workers,
        anything run in its namespace) and waits until all are gone; returns `time.time()`
        then, the moment its private root was wiped."""
        self._check(host)
        return processes.kill_namespace(host.name)

    def cut_host(self, host: Host) -> float:
        """Cuts `host` off the network: the root-side end of its veth pair goes down, so what it
        sends and what is sent to it is dropped silently, as by a failed switch port; no
        connection is reset, and its loopback still works. Returns `time.time()` then."""
        self._check(host)
        network.ip("link", "set", self._state().layout.veth(host), "down")
        return time.time()

    def heal_host(self, host: Host) -> float:
        """Puts `host` back on the network (`cut_host` undone); returns `time.time()` then."""
        self._check(host)
        network.ip("link", "set", self._state().layout.veth(host), "up")
        return time.time()

    def is_cut(self, host: Host) -> bool:
        """Whether `host`'s link to the bridge is down."""
        self._check(host)
        veth = self._state().layout.veth(host)
        return "UP" not in network.link_flags(veth)

    def stop_host(self, host: Host) -> list[int]:
        """Stops every process of `host` (SIGSTOP), its Spark worker, executors and their
        Python workers: a machine that stopped answering. Returns their pids once each is
        stopped; one forked meanwhile is stopped too. `kill_host` kills stopped processes."""
        self._check(host)
        return processes.stop_namespace(host.name)

    def restart_host(self, host: Host, timeout: float = RESTART_TIMEOUT_S) -> None:
        """Starts a Spark worker on `host`, which runs nothing (`kill_host`), with a fresh,
        empty private root: a new machine in a lost one's place. Returns once the master
        counts it alive, and no worker of the host's past.

        REQUIRES: no process runs on `host`."""
        self._check(host)
        left = processes.netns_pids(host.name)
        if left:
            raise ClusterError(f"{host.name} still runs processes {left}: kill_host it first")
        state = self._state()
        old = {w["id"] for w in (self.master_state() or {}).get("workers", []) if w.get("host") == host.address}
        pid = processes.start_worker(state, host)
        write(self._state().with_pid(host.name, pid))  # read again: another host's restart may have written
        log = os.path.join(state.logs, f"{host.name}.log")
        processes.wait_for(
            lambda: processes.settled(self.master_state(), [host.address], old),
            timeout,
            f"the master to count {host.name}'s new worker alive",
            watch={pid: log},
        )

    def lose_host(self, host: Host, timeout: float = RESTART_TIMEOUT_S) -> float:
        """Loses `host` as a machine is lost and replaced: `kill_host`, then `restart_host`,
        and waits until the master counts one alive worker on every host; returns the time
        of the wipe (`kill_host`'s)."""
        wiped = self.kill_host(host)
        self.restart_host(host, timeout)
        processes.wait_for(
            lambda: processes.settled(self.master_state(), [h.address for h in self.hosts]),
            timeout,
            f"the master to count the {len(self.hosts)} workers of cluster {self.name} alive",
        )
        return wiped

    def run_in(self, host: Host, argv: list[str], private: bool = False, **kwargs: Any) -> subprocess.CompletedProcess:
        """Runs `argv` on `host` and waits for it (`kwargs` go to `subprocess.run`). It runs in
        the host's network namespace; with `private`, also in its worker's mount and UTS
        namespaces, where it sees the host's private root (ClusterError when no worker runs).
        The process counts as the host's: `kill_host` kills it too."""
        self._check(host)
        if not private:
            return subprocess.run(["ip", "netns", "exec", host.name, *argv], **kwargs)
        pid = self.worker_pid(host)
        if pid is None:
            raise ClusterError(f"{host.name} runs no worker: its private root exists only with one")
        return subprocess.run(["nsenter", "-t", str(pid), "-n", "-m", "-u", "--", *argv], **kwargs)

    def sockets(self, host: Host) -> list[Socket]:
        """Every TCP socket on `host` now, with the processes holding it."""
        self._check(host)
        return sockets.sockets(host.name)

    def listening(self, host: Host) -> list[Socket]:
        """The listening TCP sockets on `host` now."""
        return [s for s in self.sockets(host) if s.state == "LISTEN"]

    def connections(self, host: Host) -> list[Socket]:
        """The TCP connections on `host` now (every socket but the listeners)."""
        return [s for s in self.sockets(host) if s.state != "LISTEN"]

    def status(self) -> ClusterStatus:
        """The cluster now: each host's worker, the master's count, the S3 server."""
        master = self.master_state()
        alive = processes.alive_workers(master)
        hosts = tuple(HostStatus(h, self.worker_pid(h), h.address in alive) for h in self.hosts)
        state = self._state()
        return ClusterStatus(
            hosts=hosts,
            alive_workers=None if master is None else int(master.get("aliveworkers", 0)),
            s3_reachable=state.s3_port is not None and s3.answers(self.driver_address, state.s3_port),
        )

    def _state(self) -> ClusterState:
        state = read(self.state_dir)
        if state is None:
            raise ClusterError(f"cluster {self.name}: its state file in {self.state_dir} is gone (was it taken down?)")
        return state

    def _check(self, host: Host) -> None:
        if host not in self.hosts:
            raise ClusterError(f"{host.name} is not a worker host of cluster {self.name}")
