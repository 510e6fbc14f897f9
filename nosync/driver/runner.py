"""Running a pipeline: the driver's whole job, from pipeline file to summary.

`run()` checks the pipeline in the driver (so a bad pipeline is reported before Spark starts),
starts the coordinator, launches the W worker tasks as one Spark job on a thread of its own,
and waits: for every worker to finish, for the mode to declare the run failed, or for the job
to fail. A failed run cancels the job (Spark would otherwise retry the lost task) and raises
RunFailed with the reason. Progress is reported through a callback twice a second.

The run directory holds `run.json` (what was run), the mode's state and checkpoints, events and
metrics. A run directory that already holds checkpoints is refused unless `resume` is given:
then the run continues from its last completed checkpoint, and must be the same pipeline, mode
and number of workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from nosync import storage
from nosync.api.loader import load_pipeline, pipeline_source
from nosync.api.pipeline import require_replayable
from nosync.api.plan import plan
from nosync.driver import metrics
from nosync.driver.coordinator import Coordinator
from nosync.driver.rows import RowLog
from nosync.driver.stopping import SourceClock, check_requests, stop_file, stop_signals
from nosync.driver.task import worker_main
from nosync.errors import NosyncError, RunFailed
from nosync.modes import get_mode
from nosync.options import RunOptions
from nosync.places import SHARED_STORES, Places, places_of
from nosync.runtime.links import SETUP_TIMEOUT_S
from nosync.spark.session import (
    check_slots,
    driver_address,
    get_spark,
    is_embedded,
    kill_task_attempt,
    spark_output_to,
)
from nosync.state import checkpoints

SAMPLE_S = 0.25
"""How often the run's progress is sampled (throughput.parquet, the progress callback)."""


@dataclass
class RunResult:
    """What a finished run gives back: its summary and its run directory."""

    summary: dict
    run_dir: str


def run(
    pipeline_file: str,
    options: RunOptions | None = None,
    *,
    progress: Callable[[dict], None] | None = None,
    spark: Any = None,
    log_spark: bool = False,
    **changes: Any,
) -> RunResult:
    """Runs the pipeline of `pipeline_file` with `options` (default: `RunOptions()`), changed
    by `changes` (option names as keywords), on `options.workers` Spark tasks until it
    finishes, and writes its metrics; raises RunFailed if it fails. `progress` gets the run's
    progress every SAMPLE_S; `spark`: a session to run on instead of one for the options;
    `log_spark`: Spark's own output (of a session this run starts) goes to the run directory's
    spark.log, not to stderr."""
    opts = (options or RunOptions()).but(**changes)
    mode, workers, run_dir, params = opts.mode, opts.workers, opts.run_dir, opts.params
    pipeline_file = os.path.abspath(pipeline_file)
    pipeline = load_pipeline(pipeline_file, params)
    plan(pipeline, workers)
    run_id = uuid.uuid4().hex[:12]
    run_dir = os.path.abspath(
        run_dir or os.path.join("runs", f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}-{run_id[:4]}")
    )
    if opts.resume:
        opts = _resumed_places(run_dir, opts)
    embedded = is_embedded(spark.sparkContext.master if spark is not None else opts.master)
    places = places_of(run_dir, opts.remote, opts.local_dir, embedded)
    _check_places(pipeline, opts, places, embedded)
    _check_run_dir(
        run_dir,
        places if embedded else replace(places, local=""),
        {"pipeline": pipeline.name, "mode": mode, "workers": workers, "batch_size": opts.batch_size},
        opts.resume,
    )
    opts = opts.but(run_dir=run_dir)
    driver_mode = get_mode(mode, opts, pipeline.name)
    if driver_mode.requires_replayable_sources:
        require_replayable(pipeline, f"mode {mode}", "only mode nosync logs its input to make it replayable")
    os.makedirs(run_dir, exist_ok=True)
    # the run resumed says where its clock was: read before this run's run.json replaces its
    clock = SourceClock.resumed(run_dir) if opts.resume else SourceClock(run_dir)
    with contextlib.suppress(FileNotFoundError):
        os.remove(stop_file(run_dir))  # a request a stopped run left
    _write_json(
        os.path.join(run_dir, "run.json"),
        {
            "pipeline": pipeline.name,
            "pipeline_file": pipeline_file,
            "params": dict(params or {}),
            "mode": mode,
            "workers": workers,
            "batch_size": opts.batch_size,
            "epoch_records": opts.epoch_records,
            "epoch_ms": opts.epoch_ms,
            "run_id": run_id,
            "resumed": opts.resume,
            "checkpoint_tier": opts.checkpoint_tier,
            "remote": opts.remote,
            "local_dir": opts.local_dir,
            "master": spark.sparkContext.master if spark is not None else opts.master,
            "embedded": embedded,
            "places": places.to_wire(),
            # `nosync stop --wait` ends its wait when this process is gone without a summary
            "driver": {"host": socket.gethostname(), "pid": os.getpid()},
        },
    )

    with contextlib.ExitStack() as quiet:
        if log_spark:
            quiet.enter_context(spark_output_to(os.path.join(run_dir, "spark.log")))
        t0 = time.time()
        # mode replay, and mode nosync with a replay threshold, run batch jobs beside the W
        # streaming tasks: W more slots
        why = ""
        if mode == "replay":
            why = f"mode replay: {workers} streaming tasks and {workers} for batch recomputation"
        elif opts.replay_threshold_records is not None:
            why = f"--replay-threshold-records: {workers} streaming tasks and {workers} for the span job"
        slots = 2 * workers if why else workers
        if opts.standbys:
            why = (why + "; " if why else f"{workers} workers") + f" and --standbys {opts.standbys}"
            slots += opts.standbys
        spark = spark or get_spark(opts.master, slots, driver_host=opts.driver_host, slots=slots)
        check_slots(spark, slots, why)
        startup_s = time.time() - t0
        secret = secrets.token_bytes(32)
        host = driver_address(spark.sparkContext.master, opts.driver_host)
        coord = Coordinator(
            workers,
            secret,
            driver_mode,
            run_id,
            host=host,
            run_dir=run_dir,
            max_restarts=opts.max_restarts,
            failure_timeout_s=opts.failure_timeout_ms / 1000,
            kill_task=partial(
                kill_task_attempt,
                spark.sparkContext,
                is_embedded(spark.sparkContext.master) and opts.suspect_kill == "process",
            ),
            standbys=opts.standbys,
            max_dead_letters=opts.max_dead_letters,
        )
        coord.event("coordinator", address=list(coord.address))
        coord.source_clock = clock
        spec = {
            "run_id": run_id,
            "pipeline_file": pipeline_file,
            "pipeline_source": pipeline_source(pipeline_file),
            "places": places.to_wire(),
            "params": dict(params or {}),
            "mode": mode,
            "options": opts.to_wire(),
            "workers": workers,
            "coordinator": list(coord.address),
            "secret": secret,
            "epoch_records": opts.epoch_records,
            "epoch_ms": opts.epoch_ms,
            "batch_size": opts.batch_size,
            "linger_ms": opts.linger_ms,
            "run_dir": run_dir,
            "on_bad_record": opts.on_bad_record,
            "max_dead_letters": opts.max_dead_letters,
            "slow_worker": list(opts.slow_worker) if opts.slow_worker else None,
        }
        driver_mode.attach(spark, spec)
        job_error: list[BaseException] = []
        job_results: list[dict] = []
        sc = spark.sparkContext

        def job() -> None:
            sc.setJobGroup(run_id, f"nosync {pipeline.name} ({mode})", interruptOnCancel=True)
            try:
                # tasks W and up are the standbys
                tasks = workers + opts.standbys
                got = sc.parallelize(range(tasks), tasks).mapPartitionsWithIndex(partial(worker_main, spec))
                job_results.extend(got.collect())
            except BaseException as e:  # noqa: BLE001 - reported to the caller below
                job_error.append(e)

        thread = threading.Thread(target=job, name="nosync-job", daemon=True)
        launched = time.time()
        thread.start()
        # the progress samples go to throughput.jsonl as they are taken, not to memory
        samples = RowLog(os.path.join(run_dir, "throughput.jsonl"))
        workers_seen: dict = {}
        quiet.enter_context(stop_signals(coord))
        try:
            while True:
                if coord.wait(SAMPLE_S):
                    break
                check_requests(coord, run_dir, opts.duration)
                info = coord.workers_info()
                if info != workers_seen:
                    workers_seen = info
                    _write_json(os.path.join(run_dir, "workers.json"), info)
                p = coord.progress()
                p["t"] = time.time() - launched
                samples.append(p)
                if progress:
                    progress(p)
                if job_error and not coord.finished:
                    coord.fail(f"the Spark job failed: {_first_line(job_error[0])}")
                if len(coord.attempts) < workers and time.time() - launched > SETUP_TIMEOUT_S and not coord.finished:
                    coord.fail(
                        f"only {len(coord.attempts)} of {workers} workers registered with the coordinator at "
                        f"{coord.address[0]}:{coord.address[1]} within {SETUP_TIMEOUT_S:.0f} s of the job's start: "
                        f"every executor must reach that address (--driver-host)"
                    )
                said = [r["error"] for r in job_results if r.get("error")]
                if said and not coord.finished:
                    # a worker that could not reach the coordinator ends its task saying why
                    coord.fail(said[0])
                if opts.timeout_s is not None and time.time() - launched > opts.timeout_s:
                    coord.fail(f"timed out after {opts.timeout_s}s")
            if coord.failure is not None:
                sc.cancelJobGroup(run_id)
                thread.join(timeout=5)
                raise RunFailed(coord.failure, run_dir=run_dir)
            # every worker was told to finish; a task Spark retries after that is told so too.
            # A worker that hangs after its work was done never ends its task: once it is
            # silent past the failure timeout, the job is cancelled (its output is committed);
            # so is it at once when a replaced attempt is still there (a host stopped or cut off)
            deadline = time.monotonic() + 60
            while (
                thread.is_alive()
                and time.monotonic() < deadline
                and not coord.silent_workers()
                and not coord.zombies_alive()
            ):
                thread.join(0.1)
            if thread.is_alive():
                sc.cancelJobGroup(run_id)
                thread.join(timeout=5)
            elif job_error:
                raise RunFailed(f"the Spark job failed: {_first_line(job_error[0])}", run_dir=run_dir)
        finally:
            coord.close()
            samples.close()
        end = time.time()
        first = min(d["metrics"].get("first_read_at") or end for d in coord.done.values())
        last_commit = max(d["metrics"].get("last_commit_at") or end for d in coord.done.values())
        info = {
            "pipeline": pipeline.name,
            "mode": mode,
            "workers": workers,
            "master": sc.master,
            "driver_host": host,
            "worker_hosts": {str(w): a[0] for w, a in sorted(coord.addresses.items())},
            "run_id": run_id,
            "startup_s": startup_s + max(0.0, first - launched),
            "processing_s": max(1e-9, last_commit - first),
            "wall_s": end - t0,
            "refused_connections": coord.refused,
            "suspicions": len(coord.suspicions),
            "standbys": opts.standbys,
            "promotions": len(coord.promotions),
            "longest_silence_s": round(coord.longest_silence_s, 3),
        }
        summary = metrics.summarize(info, coord.done)
        summary["dead_letters"] = coord.dead_letters_written
        # the workers' own refusals too (strangers at their data listeners)
        summary["refused_connections"] += sum(
            int(d["metrics"].get("refused_connections") or 0) for d in coord.done.values()
        )
        # replaced attempts, what their fences refused, and their connections the others refused
        summary.update(coord.fencing())
        summary["zombie_connections_refused"] = sum(
            int(d["metrics"].get("zombie_connections_refused") or 0) for d in coord.done.values()
        )
        summary["records_per_s"] = summary["records_read"] / info["processing_s"]
        summary["generations"] = coord.gen + 1
        summary["stopped"] = coord.stopping.summary(end)
        summary["source_t0"] = coord.source_clock.start
        summary["source_clock_s"] = coord.source_clock.read(end)
        summary.update(driver_mode.summary(coord))
        p = coord.progress()
        p["t"] = end - launched
        samples.append(p)
        if summary.get("recoveries"):
            metrics.add_recovery_times(summary["recoveries"], samples, launched, coord.progress_rows)
        metrics.write(run_dir, summary, samples, coord.done, {**driver_mode.tables(), "progress": coord.progress_rows})
        return RunResult(summary, run_dir)


def _resumed_places(run_dir: str, opts: RunOptions) -> RunOptions:
    """A resumed run's options with the shared tier and local directory of the run it
    continues, where they are not given again: its checkpoints and stores are there."""
    path = os.path.join(run_dir, "run.json")
    if not os.path.exists(path):
        return opts
    with open(path, encoding="utf-8") as f:
        before = json.load(f)
    changes = {k: before[k] for k in ("remote", "local_dir") if getattr(opts, k) is None and before.get(k)}
    return opts.but(**changes) if changes else opts


def _check_places(pipeline: Any, opts: RunOptions, places: Places, embedded: bool) -> None:
    """Refuses, before Spark starts, a shared tier or a sink that cannot be written, and a run
    on a cluster that needs a shared tier every host reaches but has only the driver's run
    directory."""
    if opts.remote:
        storage.check_writable(places.shared, "--remote")
    if not embedded and not opts.remote:
        needs = []
        if opts.mode == "replay":
            needs.append("mode replay (its batch jobs hand the recomputed state to the workers)")
        if opts.checkpoint_tier == "remote":
            needs.append("--checkpoint-tier remote (the stores' remote tier)")
        if opts.replay_threshold_records is not None:
            needs.append("--replay-threshold-records (the span job's files)")
        if needs:
            raise NosyncError(
                f"{'; '.join(needs)} on the cluster at --master {opts.master} needs a shared tier every host "
                f"reaches: give --remote URI (s3://bucket/prefix, hdfs://..., or a path every host mounts); "
                f"the default, the run directory {places.run_dir}, is on the driver's host only"
            )
    for node in pipeline.sinks:
        node.params["sink"].check_writable()


def _check_run_dir(run_dir: str, places: Places, same: dict, resume: bool) -> None:
    """Refuses a run directory (or shared tier, or local root `places.local` on the driver's
    host: empty when the workers' are elsewhere) that another run's state would be mixed
    with; a resumed run must be the same pipeline, mode, number of workers and batch size
    (source positions count records inside chunks of that size)."""
    info_path = os.path.join(run_dir, "run.json")
    if not resume:
        held = []
        if checkpoints.completed(places.shared):
            held.append(f"checkpoints in {storage.redact(checkpoints.directory(places.shared))}")
        if storage.listdir(places.shared_path(SHARED_STORES)):
            held.append(f"stores' remote tiers in {storage.redact(places.shared_path(SHARED_STORES))}")
        if places.local and os.path.isdir(places.local):
            held.append(f"stores in {places.local}")
        if held:
            raise NosyncError(
                f"run directory {run_dir} holds the state of an earlier run ({'; '.join(held)}): continue it with "
                "--resume, or give another --run-dir"
            )
        return
    if not os.path.exists(info_path):
        raise NosyncError(f"--resume {run_dir}: no run.json there, so no run to continue")
    with open(info_path, encoding="utf-8") as f:
        before = json.load(f)
    for what, now in same.items():
        if before.get(what) != now:
            raise NosyncError(f"--resume {run_dir}: that run's {what} is {before.get(what)!r}, this one's is {now!r}")


def _write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    for line in text:
        if "RunFailed" in line or "PipelineError" in line:
            return line.strip()
    return text[0] if text else type(e).__name__
