"""Spark as the host of workers: a session, and one long-running task per worker.

Workers are the W partitions of `parallelize(range(W), W).mapPartitionsWithIndex(worker_main)`,
so every worker is a Spark task: Spark places it, and retries it when it fails (the retry is
attempt 1, which is how a worker learns it is a restart). Speculation is off (two copies of a
worker would both register). Embedded runs use `local[W,F]`: W task slots, F attempts per task.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from nosync.errors import NosyncError

log = logging.getLogger("nosync.spark.session")

MAX_FAILURES = 100_000
"""Spark's own retry bound, set out of the way: how many restarts a run survives is the mode's
business (`--max-restarts`), and a recovering mode needs Spark to retry a lost task every time."""


def default_master(workers: int) -> str:
    """The embedded master for `workers` task slots: local[W,F], Spark's retries out of the way."""
    return f"local[{workers},{MAX_FAILURES}]"


def is_embedded(master: str | None) -> bool:
    """Whether `master` runs every executor in the driver's process (local, local[W,F], ...)."""
    return master is None or master == "local" or master.startswith("local[")


def master_address(master: str) -> tuple[str, int] | None:
    """The host and port of the first master a master URL names (spark://h:p[,h2:p2],
    k8s://https://h:p, mesos://h:p), None when it names none (yarn, local)."""
    rest = master.split("://", 1)[1] if "://" in master else ""
    if rest.startswith(("https://", "http://")):
        rest = rest.split("://", 1)[1]
    first = rest.split(",", 1)[0].split("/", 1)[0]
    host, _, port = first.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def outward_address(master: str) -> str:
    """The address of this host toward `master`'s host: where a datagram socket "connected"
    to it would send from (no packet leaves); the host's name resolved when the URL names no
    host (yarn). What executors on other hosts can reach the driver at."""
    where = master_address(master)
    if where is not None:
        try:
            family = socket.AF_INET6 if ":" in where[0] else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(where)
                return s.getsockname()[0]
        except OSError:
            pass  # a host name that does not resolve here: the host's own name below
    return socket.gethostbyname(socket.gethostname())


def driver_address(master: str | None, driver_host: str | None = None) -> str:
    """Where the executors of `master` reach the driver (Spark's and the coordinator):
    loopback embedded, else `driver_host` or this host's address toward the master."""
    if is_embedded(master):
        return driver_host or "127.0.0.1"
    return driver_host or outward_address(str(master))


def get_spark(
    master: str | None, workers: int, app: str = "nosync", driver_host: str | None = None, slots: int | None = None
) -> Any:
    """A SparkSession for `master` (default: embedded local[W,F]); reuses the active one when
    its master matches. On a master that is not embedded, the driver listens on `driver_host`
    (default: this host's address toward the master, never loopback), and on a standalone
    master the application asks for `slots` cores at most (default `workers`): the master then
    spreads them over its workers' hosts (`spark.deploy.spreadOut`), one executor a host where
    they have room, and the run leaves the rest of the cluster to others."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # lazy: pyspark costs ~1 s to import and only this path needs it

    master = master or default_master(workers)
    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext.master == master:
        return active
    if active is not None:
        active.stop()
    host = driver_address(master, driver_host)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.speculation", "false")
        .config("spark.task.maxFailures", str(MAX_FAILURES))
        .config("spark.python.worker.reuse", "true")
        # a task attempt the driver kills (a worker it suspects: `kill_task_attempt`) has its
        # Python process killed this soon when it does not end by itself (a hung one never does)
        .config("spark.python.task.killTimeout", "250ms")
        # the workers' modules are loaded before the daemon forks a task (a restart too)
        .config("spark.python.daemon.module", "nosync.driver.spark_daemon")
        .config("spark.driver.host", host)
        .config("spark.driver.bindAddress", host)
        .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
    )
    if master.startswith("spark://"):
        builder = builder.config("spark.cores.max", str(slots or workers))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def kill_task_attempt(sc: Any, embedded: bool, task_id: int, pid: int, reason: str) -> None:
    """Asks Spark to kill task attempt `task_id` (Spark's id, `TaskContext.taskAttemptId`),
    without waiting: the executor interrupts it and kills its Python process once its monitor
    sees the kill (it looks every 2 s) and spark.python.task.killTimeout has passed; Spark then
    schedules the task again (a killed task is not a failure: it counts against no
    spark.task.maxFailures). An executor Spark cannot reach gets the kill only once it is
    reachable again, or never. Embedded (`embedded`: the executors are processes of this
    host), the worker's process `pid` is also killed at once (SIGKILL), as a node's own agent
    would: what it holds (its store's lock) is free for its replacement without the monitor's
    delay."""
    if embedded and pid > 0:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill() -> None:
        try:
            sc._jsc.sc().killTaskAttempt(int(task_id), True, reason)
        except Exception as e:  # noqa: BLE001 - a stopped context: the run is ending anyway
            log.warning("could not kill task attempt %s: %s", task_id, e)

    threading.Thread(target=kill, name=f"nosync-kill-{task_id}", daemon=True).start()


def check_slots(spark: Any, workers: int, why: str = "", wait_s: float = 60.0) -> None:
    """Every worker must run at once: refuse a master with fewer task slots than workers
    (`why` says what the slots are for, when not only workers). A cluster's executors
    register after the session starts, so wait for them a while."""
    sc = spark.sparkContext
    deadline = time.monotonic() + (0 if sc.master.startswith("local") else wait_s)
    slots = sc.defaultParallelism
    while slots < workers and time.monotonic() < deadline:
        time.sleep(0.5)
        slots = sc.defaultParallelism
    if slots < workers:
        need = f"{why}: {workers}" if why else f"{workers} workers need {workers}"
        raise NosyncError(f"{need} concurrent task slots; the Spark master {spark.sparkContext.master} offers {slots}")


@contextlib.contextmanager
def spark_output_to(path: str) -> Iterator[None]:
    """Sends what is written to file descriptor 2 (Spark's JVM and its Python workers inherit
    it: WARN lines, log4j notices, stack traces of tasks that were meant to fail) to `path`
    while the block runs; the command's own output stays on stdout."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
