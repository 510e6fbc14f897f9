"""The hosts' processes: how one is started on a host, found, and killed with all the host's.

A host's process is started as

    ip netns exec <ns> unshare --mount --uts --propagation private -- sh -c \\
        'hostname <ns> && mount -t tmpfs ... <ROOT> && exec spark-class ...'

`ip netns exec` puts it in the host's network namespace (and mounts the host's
`/etc/netns/<ns>/hosts`); `unshare` gives it a mount namespace of its own, whose mounts
propagate nowhere, and a hostname of its own; in it a fresh tmpfs is mounted at ROOT, the same
path on every host, where its Spark dirs (`SPARK_LOCAL_DIRS`, `SPARK_WORKER_DIR`) and its
`TMPDIR` are. Every exec keeps the pid, so the pid the launcher gets is the Spark JVM's. What
it starts (executors, their Python workers) inherits both namespaces: they see the host's
root and nobody else does, the driver in the root namespace included, where ROOT is an empty
directory. A mount namespace lives as long as a process in it, so when every process of the
host is gone (`kill_namespace`), its tmpfs is gone with them: that is the wipe of a lost
machine, at the moment the last one exits.

Processes are found by their network namespace, as `ip netns pids` and `ip netns identify`
find them (the inode of `/proc/<pid>/ns/net` against `/run/netns/<ns>`), read here straight
from /proc: the kill loop polls it every few milliseconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection
from typing import Any

from experiments.cluster.errors import ClusterError
from experiments.cluster.layout import MASTER_PORT, MASTER_UI_PORT, WORKER_UI_PORT, Host
from experiments.cluster.state import ACCESS_KEY, SECRET_KEY, ClusterState

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

# $0 the private root, $1 the hostname, $2 the tmpfs's size; the rest is the command
_LAUNCH = (
    'hostname "$1" && mount -t tmpfs -o "size=$2,mode=0755" nosync-local "$0" '
    '&& mkdir -p "$0/spark" "$0/work" "$0/tmp" && shift 2 && exec "$@"'
)

_started: dict[int, subprocess.Popen] = {}
"""Processes this process started, kept to be reaped once killed (a zombie is not gone)."""


def spark_home() -> str:
    """The installed pyspark package's folder, which is a SPARK_HOME (its bin/spark-class)."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


def spark_env(host: Host, python: str, home: str, private_root: str) -> dict[str, str]:
    """The environment of a Spark process on `host`: it binds to the host's address, runs
    Python tasks with `python`, keeps its files in the host's private root, and reaches the
    S3 server with the credentials of the cluster's remote URI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
    env.update(
        SPARK_HOME=home,
        SPARK_LOCAL_IP=host.address,
        PYSPARK_PYTHON=python,
        SPARK_LOCAL_DIRS=os.path.join(private_root, "spark"),
        SPARK_WORKER_DIR=os.path.join(private_root, "work"),
        TMPDIR=os.path.join(private_root, "tmp"),
        AWS_ACCESS_KEY_ID=ACCESS_KEY,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_EC2_METADATA_DISABLED="true",
    )
    return env


def master_argv(home: str, master: Host) -> list[str]:
    """The Spark standalone master on `master`, at fixed ports (the namespace is its own)."""
    return [
        os.path.join(home, "bin", "spark-class"),
        MASTER_CLASS,
        "--host",
        master.address,
        "--port",
        str(MASTER_PORT),
        "--webui-port",
        str(MASTER_UI_PORT),
    ]


def worker_argv(home: str, host: Host, master_url: str, cores: int, memory: str) -> list[str]:
    """A Spark standalone worker on `host` (its RPC port left to the system, so that a new
    worker in a lost one's place never collides with the master's record of the old one)."""
    return [
        os.path.join(home, "bin", "spark-class"),
        WORKER_CLASS,
        "--cores",
        str(cores),
        "--memory",
        memory,
        "--host",
        host.address,
        "--webui-port",
        str(WORKER_UI_PORT),
        master_url,
    ]


def launch(host: Host, argv: list[str], env: dict[str, str], private_root: str, disk: str, log: str) -> int:
    """Starts `argv` on `host` in a mount namespace of its own with a fresh tmpfs of size
    `disk` at `private_root`; its output appended to `log`. Returns its pid (the pid of
    `argv[0]` once it runs).

    REQUIRES: `private_root` is a directory (the mount point) and `host`'s namespace exists."""
    cmd = ["ip", "netns", "exec", host.name, "unshare", "--mount", "--uts", "--propagation", "private", "--"]
    cmd += ["sh", "-c", _LAUNCH, private_root, host.name, disk, *argv]
    return _spawn(cmd, env, log, f"on {host.name}: {' '.join(argv)}")


def start_master(state: ClusterState) -> int:
    """Starts the cluster's Spark master on its host; returns its pid."""
    master = state.layout.master
    env = spark_env(master, state.python, state.spark_home, state.local_root)
    log = os.path.join(state.logs, f"{master.name}.log")
    return launch(master, master_argv(state.spark_home, master), env, state.local_root, state.disk, log)


def start_worker(state: ClusterState, host: Host) -> int:
    """Starts a Spark worker on `host` with a fresh, empty private root; returns its pid."""
    env = spark_env(host, state.python, state.spark_home, state.local_root)
    argv = worker_argv(state.spark_home, host, state.master_url, state.cores, state.memory)
    log = os.path.join(state.logs, f"{host.name}.log")
    return launch(host, argv, env, state.local_root, state.disk, log)


def start_local(argv: list[str], env: dict[str, str], log: str) -> int:
    """Starts `argv` in the root namespace (the driver's host), in a session of its own, its
    output appended to `log`; returns its pid."""
    return _spawn(argv, env, log, " ".join(argv))


def _spawn(cmd: list[str], env: dict[str, str], log: str, what: str) -> int:
    # a session of its own: a ^C to the shell that ran `up` does not reach the cluster
    with open(log, "a") as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} started {what}\n")
        out.flush()
        proc = subprocess.Popen(
            cmd, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    _started[proc.pid] = proc
    return proc.pid


def _reap(pid: int) -> None:
    proc = _started.get(pid)
    if proc is not None and proc.poll() is not None:
        del _started[pid]


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat from the third on (state, parent pid, ...: `fields[k - 3]`
    is field k of proc(5)); None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(")") + 2 :].split()


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie is not: it holds no namespace any more)."""
    _reap(pid)
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def cmdline(pid: int) -> list[str]:
    """The command line of `pid`; empty when it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _ns_key(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return st.st_dev, st.st_ino


def netns_pids(namespace: str) -> list[int]:
    """The live processes in the named network namespace (`ip netns pids`)."""
    key = _ns_key(f"/run/netns/{namespace}")
    if key is None:
        return []
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _ns_key(f"/proc/{entry.name}/ns/net") == key:
            pids.append(int(entry.name))
    return pids


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped (state T in /proc/PID/stat); False when it is gone."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] in ("T", "t")


def netns_of(pid: int, namespaces: list[str]) -> str | None:
    """Which of `namespaces` the process `pid` is in (`ip netns identify`); None when it is
    in none of them or gone."""
    key = _ns_key(f"/proc/{pid}/ns/net")
    if key is None:
        return None
    for ns in namespaces:
        if _ns_key(f"/run/netns/{ns}") == key:
            return ns
    return None


def spark_pid(namespace: str, main_class: str) -> int | None:
    """The pid of the Spark daemon running `main_class` in `namespace`, if one runs."""
    for pid in netns_pids(namespace):
        if main_class in cmdline(pid):
            return pid
    return None


def kill_namespace(namespace: str, timeout: float = 30.0) -> float:
    """SIGKILLs every process in `namespace` until none is left (one forked meanwhile too);
    returns `time.time()` when the last was gone, with it the mount namespaces (and their
    tmpfs) only those processes held. ClusterError if some survive `timeout` seconds."""
    _signal_namespace(namespace, signal.SIGKILL, lambda pid: False, timeout, "alive")
    return time.time()


def stop_namespace(namespace: str, timeout: float = 30.0) -> list[int]:
    """SIGSTOPs every process in `namespace` until each is stopped (one forked meanwhile too);
    returns their pids. ClusterError if some are not stopped within `timeout` seconds."""
    return sorted(_signal_namespace(namespace, signal.SIGSTOP, is_stopped, timeout, "not stopped"))


def _signal_namespace(
    namespace: str, sig: signal.Signals, done: Callable[[int], bool], timeout: float, what: str
) -> set[int]:
    """Sends `sig` to every process in `namespace` that is not `done`, again until every one
    left is; returns the pids signalled."""
    deadline = time.monotonic() + timeout
    signalled: set[int] = set()
    while pids := [pid for pid in netns_pids(namespace) if not done(pid)]:
        if time.monotonic() > deadline:
            raise ClusterError(f"{namespace}: processes {pids} still {what} {timeout:.0f} s after {sig.name}")
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                continue
            signalled.add(pid)
            if sig == signal.SIGKILL:
                _reap(pid)
        time.sleep(0.002)
    return signalled


def stop(pid: int, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds, and waits until `pid` is gone."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 30.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while running(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not running(pid):
            return
    raise ClusterError(f"process {pid} ({' '.join(cmdline(pid))}) still alive after SIGKILL")


def master_json(address: str) -> dict[str, Any] | None:
    """The master's state (`http://<address>:8080/json/`: `aliveworkers`, `workers`, each
    with `id`, `host`, `state`, ...); None while it does not answer with it."""
    try:
        with urllib.request.urlopen(f"http://{address}:{MASTER_UI_PORT}/json/", timeout=2) as r:
            return json.loads(r.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None  # the UI answering before it serves its JSON: an empty body


def alive_workers(master: dict[str, Any] | None) -> dict[str, list[str]]:
    """The ids of the ALIVE workers in the master's state `master`, by host address."""
    out: dict[str, list[str]] = {}
    for w in (master or {}).get("workers", []):
        if w.get("state") == "ALIVE":
            out.setdefault(w["host"], []).append(w["id"])
    return out


def settled(master: dict[str, Any] | None, addresses: list[str], old: Collection[str] = ()) -> bool:
    """Whether the master's state `master` has exactly one ALIVE worker at each of
    `addresses`, none of them one of the `old` worker ids (workers of a lost host's past)."""
    alive = alive_workers(master)
    return all(len(alive.get(a, [])) == 1 and alive[a][0] not in old for a in addresses)


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, watch: dict[int, str] | None = None) -> Any:
    """Polls `predicate` until it returns something true, and returns it; ClusterError after
    `timeout` seconds, or as soon as a process of `watch` (pid -> its log) has exited, naming
    its log and its last line."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for pid, log in (watch or {}).items():
            if not running(pid):
                raise ClusterError(f"waiting for {what}: process {pid} exited; its log {log} says: {last_line(log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.1)


def last_line(path: str) -> str:
    """The line of the log `path` that says why its process ended: the last one naming an
    exception or error (a Java stack trace ends with frames), else the last one ('' when
    none)."""
    try:
        with open(path, errors="replace") as f:
            lines = [line.strip() for line in f.read()[-8000:].splitlines() if line.strip()]
    except OSError:
        return ""
    telling = [x for x in lines if not x.startswith("at ") and ("Exception" in x or "Error" in x or "error" in x)]
    return (telling or lines or [""])[-1]
