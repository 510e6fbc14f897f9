"""Test pipeline that fails in a process started after the run's first ones.

Every Spark task that builds it leaves a file named by its process's pid and start time in
`starts/`, beside the output directory (in the run directory, under `nosync chaos`); a task
that finds more such files than `workers` raises. A failure-free run passes; once a worker is
killed, the task that takes its place fails the run as it starts, whether or not it has records
left to process (a worker killed after its input ended has none). `-p workers` must be the
run's `--workers`. Parameters: records, keys, workers, output.
"""

import os

import nosync as ns


def _me() -> str:
    """This process: its pid and its start time (field 22 of /proc/self/stat), so that a pid
    used again names another process."""
    with open("/proc/self/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return f"{os.getpid()}-{fields[19]}"


def _in_a_task() -> bool:
    """Whether this is a Spark task (a worker), not the driver, which builds the pipeline too."""
    from pyspark import TaskContext

    return TaskContext.get() is not None


def build(args):
    workers = int(args["workers"])
    if workers < 1:
        raise ValueError(f"-p workers={workers}: give the run's --workers")
    if _in_a_task():
        me = _me()
        starts = os.path.join(os.path.dirname(os.path.abspath(args["output"])), "starts")
        os.makedirs(starts, exist_ok=True)
        open(os.path.join(starts, me), "w").close()
        if len(os.listdir(starts)) > workers:
            raise RuntimeError(f"process {me} took the place of a killed worker: this pipeline stops")

    p = ns.Pipeline("fails_after_a_restart")
    src = p.source(ns.sources.Generator(records=int(args.get("records", 1_000_000)), keys=int(args.get("keys", 1000))))
    counts = src.key_by(lambda k: k).aggregate(int, lambda n, _: n + 1)
    counts.sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
