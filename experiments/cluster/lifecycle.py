"""Bringing a cluster up, taking it down, and finding the one that is up.

`up` checks everything it can before it makes anything (root, the tools, the names, the
subnet: `ClusterRefused`), then makes the network, starts the master and the S3 server,
waits for the master's port, starts the workers (so that none spends its first
registration attempt on a master not yet listening and waits out Spark's back-off), and
returns only when the master counts one alive worker per host and a file can be written to
the remote URI and deleted. Any failure on the way, an interrupt included, takes down
everything made so far before the error goes on; the logs stay, and the error names them.

`down` trusts nothing but names: it kills every process of every namespace named after
the cluster, stops the S3 server (the pid in the state file, if its command line is still
the server's; else whatever S3 server runs on the bridge's address), deletes veths,
namespaces and bridge, and removes the state directory. It is idempotent, and finishes the
job after an `up` that failed half-way or a state file that is gone.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable

from experiments.cluster import network, processes, s3
from experiments.cluster.cluster import Cluster
from experiments.cluster.errors import ClusterError, ClusterRefused
from experiments.cluster.layout import DEFAULT_NAME, DEFAULT_SUBNET, MASTER_PORT, check_name, owns_namespace, plan
from experiments.cluster.state import ClusterState, default_state_dir, read, write

UP_TIMEOUT_S = 180.0
_MEMORY = re.compile(r"[1-9][0-9]*[mgtMGT]")
_DISK = re.compile(r"[1-9][0-9]*[kmgtKMGT]?")
_TOOLS = {"ip": "iproute2", "ss": "iproute2", "unshare": "util-linux", "nsenter": "util-linux", "mount": "util-linux"}
_STATE_ENTRIES = ("cluster.json", "cluster.json.tmp", "logs", "local")


def check_root() -> None:
    """Raises ClusterRefused unless this process runs as root."""
    if os.geteuid() != 0:
        raise ClusterRefused(
            "a cluster of hosts needs root: network namespaces, veths and mounts can only be made as root"
        )


def check_prerequisites() -> None:
    """Raises ClusterRefused naming what to install (or to be) for `up`: root, iproute2,
    util-linux, `hostname`, Java, moto's S3 server."""
    check_root()
    missing = [tool for tool in (*_TOOLS, "hostname") if shutil.which(tool) is None]
    if missing:
        packages = sorted({_TOOLS.get(tool, tool) for tool in missing})
        raise ClusterRefused(f"{', '.join(missing)} not found: install the packages {', '.join(packages)}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ClusterRefused("java not found: Spark needs Java 17 or later (`make java` installs it)")
    if not s3.available():
        raise ClusterRefused("moto's S3 server is not installed: pip install 'nosync[cluster]'")


def up(
    hosts: int = 3,
    cores: int = 2,
    memory: str = "1g",
    name: str = DEFAULT_NAME,
    subnet: str = DEFAULT_SUBNET,
    *,
    disk: str = "4g",
    state_dir: str | None = None,
    timeout: float = UP_TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
) -> Cluster:
    """Makes cluster `name`: `hosts` hosts, each a Spark worker of `cores` cores and
    `memory` memory with a private local root (a tmpfs of at most `disk`), a master, an S3
    server on the driver's host; returns it once it is ready. `progress` hears each step.

    Raises ClusterRefused before anything is made (not root, a tool missing, a name taken,
    the subnet in use, a bad option), ClusterError when a step fails (everything made taken
    down again, the logs kept in `<state dir>/logs`)."""
    say = progress or (lambda _msg: None)
    layout = plan(name, hosts, subnet)
    if cores < 1:
        raise ClusterRefused(f"--cores {cores}: a worker needs at least one core")
    for option, value, pattern in (("--memory", memory, _MEMORY), ("--disk", disk, _DISK)):
        if not pattern.fullmatch(value):
            raise ClusterRefused(f"{option} {value}: a size such as 512m or 2g")
    check_prerequisites()
    network.check_free(layout)
    state_dir = os.path.abspath(state_dir or default_state_dir(name))
    _clear_state_dir(state_dir)
    state = ClusterState(
        name=name,
        subnet=layout.subnet,
        hosts=hosts,
        cores=cores,
        memory=memory,
        disk=disk,
        state_dir=state_dir,
        python=sys.executable,
        spark_home=processes.spark_home(),
    )
    os.makedirs(state.logs)
    os.makedirs(state.local_root)
    write(state)
    try:
        say(f"network: bridge {layout.bridge} at {layout.driver_address}, {len(layout.namespaces())} namespaces")
        network.make(layout)
        state = state.with_pid(layout.master.name, processes.start_master(state))
        write(state)
        port = s3.free_port(layout.driver_address)
        s3_log = os.path.join(state.logs, "s3.log")
        s3_pid = s3.start(state.python, layout.driver_address, port, s3_log)
        state = dataclasses.replace(state, s3_port=port, s3_pid=s3_pid)
        write(state)
        master_log = os.path.join(state.logs, f"{layout.master.name}.log")
        say(f"the master on {layout.master.name} ({layout.master.address}) and S3 on {layout.driver_address}:{port}")
        processes.wait_for(
            lambda: _listens(layout.master.address, MASTER_PORT),
            timeout,
            f"the master to listen on {layout.master.address}:{MASTER_PORT}",
            watch={state.pids[layout.master.name]: master_log},
        )
        for host in layout.hosts:
            state = state.with_pid(host.name, processes.start_worker(state, host))
        write(state)
        say(f"{hosts} workers started ({cores} cores, {memory} each)")
        processes.wait_for(
            lambda: _bucket_made(layout.driver_address, port),
            timeout,
            f"the S3 server on {layout.driver_address}:{port}",
            watch={state.s3_pid: s3_log},
        )
        _check_remote(state.remote)
        watch = {pid: os.path.join(state.logs, f"{ns}.log") for ns, pid in state.pids.items()}
        processes.wait_for(
            lambda: processes.settled(processes.master_json(layout.master.address), [h.address for h in layout.hosts]),
            timeout,
            f"the master to count {hosts} alive workers, one per host",
            watch=watch,
        )
        state = dataclasses.replace(state, complete=True)
        write(state)
    except BaseException as e:
        say("failed: taking down what was made")
        also = ""
        try:
            down(name, state_dir, keep_logs=True)
        except ClusterError as again:
            also = f"; taking it down failed too, `nosync cluster down --name {name}` may finish it: {again}"
        if isinstance(e, ClusterError):
            raise ClusterError(f"{e} (logs in {state.logs}){also}") from e
        if also:
            e.add_note(also)
        raise
    return Cluster.of(state)


def _clear_state_dir(state_dir: str) -> None:
    """Removes what a cluster left in `state_dir` (the logs of a failed `up`), refusing a
    directory with anything else in it: it is not a cluster's."""
    if not os.path.isdir(state_dir):
        return
    other = sorted(set(os.listdir(state_dir)) - set(_STATE_ENTRIES))
    if other:
        raise ClusterRefused(f"{state_dir} holds {', '.join(other[:3])}: not a cluster's state directory")
    local = os.path.join(state_dir, "local")
    if os.path.isdir(local) and os.listdir(local):
        raise ClusterRefused(f"{local} is not empty: the hosts' private roots are mounted there; empty it")
    shutil.rmtree(state_dir)


def _listens(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=1).close()
    except OSError:
        return False
    return True


def _bucket_made(address: str, port: int) -> bool:
    try:
        s3.make_bucket(address, port)
    except OSError:
        return False
    return True


def _check_remote(remote: str) -> None:
    from nosync.errors import NosyncError
    from nosync.storage import check_writable

    try:
        check_writable(remote, "the cluster's remote URI")
    except NosyncError as e:
        raise ClusterError(str(e)) from None


def down(name: str = DEFAULT_NAME, state_dir: str | None = None, keep_logs: bool = False) -> list[str]:
    """Takes cluster `name` down, whatever of it there is: every process of its namespaces
    killed, its S3 server stopped, its veths, namespaces and bridge deleted, its state
    directory removed (but its logs, with `keep_logs`). Returns what it removed, by name;
    empty when nothing of it was there."""
    check_name(name)
    check_root()
    state_dir = os.path.abspath(state_dir or default_state_dir(name))
    state = read(state_dir)
    removed: list[str] = []
    owned = [ns for ns in network.namespaces() if owns_namespace(name, ns)]
    for ns in owned:
        if processes.netns_pids(ns):
            processes.kill_namespace(ns)
            removed.append(f"the processes of {ns}")
    address = _bridge_address(name) or (state.layout.driver_address if state else None)
    if address is not None:
        pids = set(s3.find(address))
        if state is not None and state.s3_pid is not None:
            pids.add(state.s3_pid)
        for pid in sorted(pids):
            if s3.stop_server(pid, address):
                removed.append(f"the S3 server (pid {pid})")
    removed += network.remove(name)
    if os.path.isdir(state_dir) and set(os.listdir(state_dir)) <= set(_STATE_ENTRIES):
        if keep_logs:
            for entry in ("cluster.json", "cluster.json.tmp"):
                _unlink(os.path.join(state_dir, entry))
            shutil.rmtree(os.path.join(state_dir, "local"), ignore_errors=True)
        else:
            shutil.rmtree(state_dir)
            removed.append(state_dir)
            if state_dir == default_state_dir(name):
                try:
                    os.rmdir(os.path.dirname(state_dir))  # the state root, when no other cluster's is in it
                except OSError:
                    pass
    return removed


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _bridge_address(name: str) -> str | None:
    """The IPv4 address of cluster `name`'s bridge, if the bridge is there."""
    bridge = f"{name}-br"
    if bridge not in network.links():
        return None
    found = network.addresses(bridge)
    return found[0] if found else None


def load(name: str = DEFAULT_NAME, state_dir: str | None = None) -> Cluster | None:
    """The cluster `name` that `up` made and that is still up (its state file complete, its
    master's namespace there); None otherwise."""
    check_name(name)
    state = read(os.path.abspath(state_dir or default_state_dir(name)))
    if state is None or not state.complete:
        return None
    if not os.path.exists(f"/run/netns/{state.layout.master.name}"):
        return None  # a state file the machine's restart left behind, say
    return Cluster.of(state)
