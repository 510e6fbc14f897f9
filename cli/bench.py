"""`nosync bench ...`: benchmarks that measure their own limits first, in the same command."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import click

from cli.common import master_option, spark_log, staged_log, verbose_option
from nosync.modes import MODES

interval_option = click.option(
    "--interval-ms",
    type=click.IntRange(min=1),
    default=1000,
    show_default=True,
    help="abs's checkpoint interval and nosync's snapshot interval alike (nosync's not stretched by its budget).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print only the JSON object.")


@click.group()
@verbose_option()
@click.pass_context
def bench(ctx: click.Context, verbose: bool) -> None:
    """Benchmarks. Each prints one JSON object (and a table unless --json); its progress goes to
    stderr, Spark's own output to a log file it names (`bench --verbose`: to stderr)."""
    ctx.obj = {"verbose": verbose}


def _report(name: str, run, render, as_json: bool) -> None:
    """Runs a benchmark (`run(progress)`), prints its JSON object and, unless --json, its table.
    A run that fails exits 1; a usage error exits 2."""
    from nosync.errors import NosyncError, RunFailed

    verbose = bool((click.get_current_context().obj or {}).get("verbose"))
    staged = staged_log()
    # the progress goes to the terminal's stderr, which Spark's output does not reach
    err = os.fdopen(os.dup(2), "w", buffering=1)
    try:
        with spark_log(verbose, staged):
            result = run(lambda m: print(f"[bench {name}] {m}", file=err))
    except RunFailed as e:
        click.echo(f"error: run failed: {e}" + ("" if verbose else f" (Spark's own output: {staged})"), err=True)
        sys.exit(1)
    except NosyncError as e:
        raise click.UsageError(str(e)) from None
    finally:
        err.close()
    if not verbose and os.path.exists(staged):
        click.echo(f"[bench {name}] Spark's own output: {staged}", err=True)
    click.echo(json.dumps(result, indent=None if as_json else 1, sort_keys=True))
    if not as_json:
        click.echo(render(result))


@bench.command("lsm")
@json_option
@click.option("--keys", default=1_000_000, show_default=True, type=click.IntRange(min=1000))
@click.option(
    "--runs",
    "rounds",
    default=5,
    show_default=True,
    type=click.IntRange(min=2),
    help="Runs of the whole state (snapshots) the as-of reads look through.",
)
@click.option(
    "--probes", default=200_000, show_default=True, type=click.IntRange(min=1), help="As-of look-ups per read pass."
)
@click.option("--seed", default=7, show_default=True, type=int)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    default=None,
    help="Where the stores go (default: a temporary directory, removed after).",
)
def bench_lsm(as_json: bool, keys: int, rounds: int, probes: int, seed: int, workdir: str | None) -> None:
    """The lsm store's runs against the same columns written, decoded and searched bare."""
    from experiments.bench import lsm_bench

    tmp = workdir or tempfile.mkdtemp(prefix="nosync-bench-lsm-")
    try:
        result = lsm_bench.run(
            tmp,
            keys=keys,
            rounds=rounds,
            probes=probes,
            seed=seed,
            progress=lambda msg: click.echo(f"[bench lsm] {msg}", err=True),
        )
    finally:
        if workdir is None:
            shutil.rmtree(tmp, ignore_errors=True)
    click.echo(json.dumps(result, indent=None if as_json else 1, sort_keys=True))
    if not as_json:
        click.echo(lsm_bench.render(result))
    sys.stdout.flush()


@bench.command("throughput")
@click.option("--mode", type=click.Choice(MODES), default="none", show_default=True)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--records", type=click.IntRange(min=1), default=2_000_000, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=100_000, show_default=True)
@master_option()
@click.option(
    "--sink",
    type=click.Choice(["parquet", "null"]),
    default="parquet",
    show_default=True,
    help="Commit to Parquet files, or count and drop (the engine alone).",
)
@click.option("--epoch-records", type=click.IntRange(min=1), default=None)
@json_option
def bench_throughput(mode, workers, records, keys, master, sink, epoch_records, as_json) -> None:
    """keyed_count through the engine against the bare Python loop, measured in one command."""
    from experiments.bench import throughput

    _report(
        "throughput",
        lambda progress: throughput.run(
            mode, workers, records, keys, master=master, sink=sink, epoch_records=epoch_records, progress=progress
        ),
        throughput.render,
        as_json,
    )


def _modes(value: str, levels: bool = False) -> list[str]:
    """The modes of a comma-separated list; with `levels`, an entry may name the level its
    snapshots must reach too (`nosync@replicated`: a column of its own)."""
    from nosync.options import TIERS

    modes = [m.strip() for m in value.split(",") if m.strip()]
    bad = [
        m
        for m in modes
        if m.partition("@")[0] not in MODES or ("@" in m and (not levels or m.partition("@")[2] not in TIERS))
    ]
    if bad or not modes:
        also = f"; an entry may name a level, mode@{'|'.join(TIERS)}" if levels else ""
        raise click.BadParameter(f"modes are {', '.join(MODES)} (comma-separated){also}, got {value!r}")
    return modes


@bench.command("compare")
@click.option(
    "--modes",
    default="none,abs",
    show_default=True,
    help="Comma-separated modes; none is the limit. mode@level runs it with --checkpoint-tier level "
    "(nosync@replicated, abs@remote), a column of its own.",
)
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--records", type=click.IntRange(min=1), default=2_000_000, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--skew", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Zipf exponent of keys.")
@click.option("--reps", type=click.IntRange(min=1), default=2, show_default=True, help="Rounds; best kept per mode.")
@interval_option
@click.option(
    "--slow-worker",
    "slow_ms",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="MS",
    help="Worker 0's source waits MS milliseconds after every batch (a straggler).",
)
@master_option()
@json_option
def bench_compare(modes, workers, records, keys, skew, reps, interval_ms, slow_ms, master, as_json) -> None:
    """keyed_count under each mode, with each mode's ratio to mode none, in one command."""
    from experiments.bench import compare

    picked = _modes(modes, levels=True)
    _report(
        "compare",
        lambda progress: compare.run(
            picked,
            workers,
            records,
            keys,
            skew=skew,
            reps=reps,
            master=master,
            interval_ms=interval_ms,
            slow_ms=slow_ms,
            progress=progress,
        ),
        compare.render,
        as_json,
    )


@bench.command("sustain")
@click.option("--modes", default="none,abs,nosync", show_default=True, help="Comma-separated modes; none first.")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--value-bytes", type=click.IntRange(min=0), default=0, show_default=True, help="Bytes of state per key.")
@interval_option
@click.option("--warmup-s", type=click.FloatRange(min=0), default=20.0, show_default=True)
@click.option(
    "--window-s",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="The steady window after the warm-up: at least 30 intervals.",
)
@click.option("--steps", type=click.IntRange(min=1), default=5, show_default=True, help="Bisection steps per mode.")
@click.option(
    "--max-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="The bisection's upper bound, records/s per partition (default: 1.25x mode none unpaced).",
)
@master_option()
@json_option
def bench_sustain(
    modes, workers, keys, value_bytes, interval_ms, warmup_s, window_s, steps, max_rate, master, as_json
) -> None:
    """The highest input rate each mode sustains (its backlog does not grow over the window),
    then latency p50/p99/p99.9 at 50% and 80% of mode none's."""
    from experiments.bench import sustain

    picked = _modes(modes)
    try:
        sustain.check_window(window_s, interval_ms)
    except Exception as e:  # noqa: BLE001 - a NosyncError: a usage error
        raise click.UsageError(str(e)) from None
    _report(
        "sustain",
        lambda progress: sustain.run(
            picked,
            workers,
            keys,
            value_bytes=value_bytes,
            interval_ms=interval_ms,
            warmup_s=warmup_s,
            window_s=window_s,
            steps=steps,
            max_rate=max_rate,
            master=master,
            progress=progress,
        ),
        sustain.render,
        as_json,
    )


@bench.command("hosts")
@click.option(
    "--cluster",
    "cluster_name",
    default="nsc",
    show_default=True,
    metavar="NAME",
    help="The cluster of hosts `nosync cluster up` made.",
)
@click.option("--modes", default="none,nosync", show_default=True, help="Comma-separated modes.")
@click.option("--workers", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--records", type=click.IntRange(min=1), default=30_000_000, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--reps", type=click.IntRange(min=1), default=2, show_default=True, help="Rounds; best kept per place.")
@interval_option
@click.option(
    "--checkpoint-tier",
    type=click.Choice(["disk", "remote", "replicated"]),
    default="remote",
    show_default=True,
    help="Where abs's and nosync's snapshots must be durable, in both places.",
)
@json_option
def bench_hosts(cluster_name, modes, workers, records, keys, reps, interval_ms, checkpoint_tier, as_json) -> None:
    """keyed_count on one host (embedded) and across a cluster's hosts, the same run in both:
    records/s across hosts over one host (bar: 0.8)."""
    from experiments.bench import hosts
    from experiments.cluster import load

    cluster = load(cluster_name)
    if cluster is None:
        raise click.UsageError(f"no cluster named {cluster_name} is up: start one with `nosync cluster up`")
    picked = _modes(modes)
    _report(
        "hosts",
        lambda progress: hosts.run(
            cluster,
            picked,
            workers,
            records,
            keys,
            reps=reps,
            interval_ms=interval_ms,
            tier=checkpoint_tier,
            progress=progress,
        ),
        hosts.render,
        as_json,
    )


@bench.command("recovery")
@click.option("--modes", default="abs", show_default=True, help="Comma-separated modes that recover.")
@click.option("--workers", type=click.IntRange(min=2), default=2, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--records", type=click.IntRange(min=1), default=None, help="Default: max(8M, 8 x keys).")
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="A paced run instead: records/s per partition, open loop, unbounded, for --duration seconds.",
)
@click.option(
    "--value-bytes",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="With --rate: bytes of the value each key's state keeps.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=120.0,
    show_default=True,
    help="With --rate: seconds of input (at least 30 intervals).",
)
@click.option(
    "--kill-at-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="With --rate: seconds of input when the kill comes (default: once every key has its state).",
)
@click.option(
    "--failure-timeout-ms",
    type=click.IntRange(min=1),
    default=None,
    help="Passed to every run (default: nosync run's own).",
)
@interval_option
@click.option(
    "--reps",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Killed runs per mode, the modes taking turns; the median is reported.",
)
@click.option(
    "--failure",
    type=click.Choice(["process", "machine"]),
    default="process",
    show_default=True,
    help="process: a SIGKILL; machine: the worker's local root goes with it.",
)
@click.option(
    "--tiers",
    default=None,
    help="Comma-separated levels each mode runs with (disk, replicated, remote; a column each). "
    "Default: disk; with --failure machine, replicated,remote.",
)
@master_option()
@json_option
def bench_recovery(
    modes,
    workers,
    keys,
    records,
    rate,
    value_bytes,
    duration,
    kill_at_s,
    failure_timeout_ms,
    interval_ms,
    reps,
    failure,
    tiers,
    master,
    as_json,
) -> None:
    """Kills one worker mid-run; prints recovery time and records reprocessed per mode (and level)."""
    from experiments.bench import recovery
    from nosync.options import TIERS

    picked = _modes(modes)
    levels = None
    if tiers:
        levels = [t.strip() for t in tiers.split(",") if t.strip()]
        bad = [t for t in levels if t not in TIERS]
        if bad:
            raise click.UsageError(f"--tiers: {bad[0]!r} is no level; levels are {', '.join(TIERS)}")
    if "none" in picked:
        raise click.UsageError("mode none does not recover; give modes that do (abs, nosync, replay)")
    _report(
        "recovery",
        lambda progress: recovery.run(
            picked,
            workers,
            keys,
            records=records,
            master=master,
            interval_ms=interval_ms,
            reps=reps,
            progress=progress,
            failure=failure,
            tiers=levels,
            rate=rate,
            value_bytes=value_bytes,
            duration=duration,
            kill_at_s=kill_at_s,
            options={} if failure_timeout_ms is None else {"failure_timeout_ms": failure_timeout_ms},
        ),
        recovery.render,
        as_json,
    )


@bench.command("span")
@click.option("--workers", type=click.IntRange(min=2), default=2, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--records", type=click.IntRange(min=1), default=4_000_000, show_default=True)
@click.option(
    "--kill-at",
    default="0.125,0.25,0.5",
    show_default=True,
    help="Comma-separated fractions of the records read at which the kill comes (the span's length).",
)
@click.option("--reps", type=click.IntRange(min=1), default=2, show_default=True, help="Steady-state pairs.")
@master_option()
@json_option
def bench_span(workers, keys, records, kill_at, reps, master, as_json) -> None:
    """nosync recovery of one worker: record by record against the span job, per span length."""
    from experiments.bench import span

    try:
        points = [float(x) for x in kill_at.split(",") if x.strip()]
    except ValueError:
        raise click.UsageError(f"--kill-at takes fractions such as 0.25,0.5, not {kill_at!r}") from None
    if not points or not all(0 < x < 1 for x in points):
        raise click.UsageError(f"--kill-at takes fractions between 0 and 1, not {kill_at!r}")
    _report(
        "span",
        lambda progress: span.run(workers, keys, records, points, master=master, reps=reps, progress=progress),
        span.render,
        as_json,
    )


@bench.command("batch")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--records", type=click.IntRange(min=1), default=2_000_000, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--reps", type=click.IntRange(min=1), default=2, show_default=True, help="Rounds; best kept for each.")
@master_option()
@json_option
def bench_batch(workers, records, keys, reps, master, as_json) -> None:
    """A keyed_count backfill: Spark batch jobs against the streaming run, in one session."""
    from experiments.bench import batch

    _report(
        "batch",
        lambda progress: batch.run(workers, records, keys, reps=reps, master=master, progress=progress),
        batch.render,
        as_json,
    )


@bench.command("rewind")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--records", type=click.IntRange(min=1), default=None, help="Default: max(2M, 4 x keys).")
@master_option()
@click.option(
    "--mode",
    type=click.Choice(["abs", "nosync"]),
    default="abs",
    show_default=True,
    help="The run's mode: the rewind starts from its checkpoint (abs) or from a cut of its snapshots (nosync).",
)
@json_option
def bench_rewind(workers, keys, records, master, mode, as_json) -> None:
    """Rewinds keyed_count by the last 10% of its epochs; against the run's own time for them."""
    from experiments.bench import rewind

    _report(
        "rewind",
        lambda progress: rewind.run(workers, keys, records=records, master=master, progress=progress, mode=mode),
        rewind.render,
        as_json,
    )
