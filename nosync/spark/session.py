"""Spark as the host of workers: a session, and one long-running task per worker.

Workers are the W partitions of `parallelize(range(W), W).mapPartitionsWithIndex(worker_main)`,
so every worker is a Spark task: Spark places it, and retries it when it fails (the retry is
attempt 1, which is how a worker learns it is a restart). Speculation is off (two copies of a
worker would both register). Embedded runs use `local[W,F]`: W task slots, F attempts per task.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from nosync.errors import NosyncError

MAX_FAILURES = 100_000
"""Spark's own retry bound, set out of the way: how many restarts a run survives is the mode's
business (`--max-restarts`), and a recovering mode needs Spark to retry a lost task every time."""


def default_master(workers: int) -> str:
    """The embedded master for `workers` task slots: local[W,F], Spark's retries out of the way."""
    return f"local[{workers},{MAX_FAILURES}]"


def get_spark(master: str | None, workers: int, app: str = "nosync") -> Any:
    """A SparkSession for `master` (default: embedded local[W,F]); reuses the active one when
    its master matches."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # lazy: pyspark costs ~1 s to import and only this path needs it

    master = master or default_master(workers)
    active = SparkSession.getActiveSession()
    if active is not None and active.sparkContext.master == master:
        return active
    if active is not None:
        active.stop()
    spark = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.speculation", "false")
        .config("spark.task.maxFailures", str(MAX_FAILURES))
        .config("spark.python.worker.reuse", "true")
        # the workers' modules are loaded before the daemon forks a task (a restart too)
        .config("spark.python.daemon.module", "nosync.driver.spark_daemon")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


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
