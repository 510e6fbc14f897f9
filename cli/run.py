"""`nosync run`: run a pipeline file under a mode, with live progress and a summary."""

from __future__ import annotations

import sys
import time

import click

from cli.common import master_option, move_log, parse_params, spark_log, staged_log, verbose_option


@click.command("run")
@click.argument("pipeline_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--mode", type=click.Choice(["none", "abs", "nosync", "replay"]), default="none", show_default=True)
@click.option("--workers", "-w", type=click.IntRange(min=1), default=2, show_default=True)
@master_option("embedded local[W,F]; 2W slots in mode replay")
@click.option(
    "--run-dir", type=click.Path(file_okay=False), default=None, help="Where metrics go (default: runs/NAME-TIME)."
)
@click.option(
    "--epoch-records",
    type=click.IntRange(min=1),
    default=None,
    help="Cut epochs every N records per source partition (default 10000).",
)
@click.option("--epoch-ms", type=click.IntRange(min=1), default=None, help="Cut epochs every MS milliseconds instead.")
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=1024, show_default=True, help="Records a source reads per step."
)
@click.option(
    "--linger-ms",
    type=click.IntRange(min=0),
    default=5,
    show_default=True,
    help="How long an exchange buffer waits to fill before it is sent.",
)
@click.option(
    "--on-bad-record",
    type=click.Choice(["deadletter", "fail"]),
    default="deadletter",
    show_default=True,
    help="A record a source cannot parse: to the run's dead-letter file, or fail the run.",
)
@click.option(
    "--checkpoint-ms", type=click.IntRange(min=1), default=1000, show_default=True, help="abs: checkpoint interval."
)
@click.option(
    "--checkpoint-tier",
    type=click.Choice(["disk", "remote"]),
    default="disk",
    show_default=True,
    help="abs, nosync: where a snapshot must be durable before it counts.",
)
@click.option(
    "--max-concurrent-checkpoints",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="abs: checkpoints in flight at once.",
)
@click.option(
    "--checkpoint-timeout-ms",
    type=click.IntRange(min=1),
    default=60_000,
    show_default=True,
    help="abs: a checkpoint not complete by then is aborted.",
)
@click.option(
    "--max-restarts",
    type=click.IntRange(min=0),
    default=None,
    help="Recoveries a run survives before it fails (default: unlimited).",
)
@click.option(
    "--persist-ms",
    type=click.IntRange(min=1),
    default=200,
    show_default=True,
    help="nosync: how often each worker snapshots its state at most (alone, no barrier); the budget stretches it.",
)
@click.option(
    "--persist-budget",
    type=float,
    default=0.05,
    show_default=True,
    help="nosync: the share of a worker's time its persistence may take, in (0, 1]; past it, snapshots come "
    "less often.",
)
@click.option(
    "--max-unpersisted-mb",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="nosync: bytes appended and not yet durable (snapshots, lineage points) above which sources wait.",
)
@click.option(
    "--max-concurrent-snapshots",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="nosync: snapshots being persisted at once (not yet durable); the next waits for one to be done.",
)
@click.option(
    "--replay-threshold-records",
    type=click.IntRange(min=1),
    default=None,
    help="nosync: a recovery whose span to re-execute holds more records hands it to a Spark batch job, "
    "parallel over keys (default: never).",
)
@click.option(
    "--max-output-log-mb",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="nosync: output-log MB held in memory; past it, the oldest frames go to a local spill file.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue the run in --run-dir (abs: its last completed checkpoint; nosync: every worker's last snapshot).",
)
@click.option("-p", "params", multiple=True, metavar="KEY=VALUE", help="A parameter for the pipeline's build(args).")
@verbose_option()
def run_cmd(
    pipeline_file,
    mode,
    workers,
    master,
    run_dir,
    epoch_records,
    epoch_ms,
    batch_size,
    linger_ms,
    on_bad_record,
    checkpoint_ms,
    checkpoint_tier,
    max_concurrent_checkpoints,
    checkpoint_timeout_ms,
    max_restarts,
    persist_ms,
    persist_budget,
    max_unpersisted_mb,
    max_output_log_mb,
    max_concurrent_snapshots,
    replay_threshold_records,
    resume,
    params,
    verbose,
) -> None:
    """Run PIPELINE_FILE (a Python file defining `pipeline` or `build(args)`)."""
    from nosync.driver.runner import run
    from nosync.errors import NosyncError, PipelineError, RunFailed

    if epoch_records and epoch_ms:
        raise click.UsageError("give --epoch-records or --epoch-ms, not both")
    if resume and not run_dir:
        raise click.UsageError("--resume needs --run-dir: the run directory to continue")
    args = parse_params(params)
    tty = sys.stdout.isatty()
    last = [0.0, 0, 0]

    def progress(p: dict) -> None:
        now = time.time()
        rate = (p["read"] - last[1]) / max(1e-9, now - last[0]) if last[0] else 0.0
        last[0], last[1] = now, p["read"]
        line = (
            f"t={p['t']:6.1f}s workers={p['workers']} read={p['read']:,} committed={p['committed']:,} "
            f"rate={rate:,.0f}/s epoch={p['frontier']}"
        )
        if tty:
            click.echo("\r" + line.ljust(100), nl=False)
        elif int(p["t"]) > last[2]:
            last[2] = int(p["t"])  # one line a second
            click.echo(line)

    staged = staged_log()
    try:
        with spark_log(verbose, staged):
            result = run(
                pipeline_file,
                mode=mode,
                workers=workers,
                master=master,
                run_dir=run_dir,
                epoch_records=epoch_records,
                epoch_ms=epoch_ms,
                params=args,
                batch_size=batch_size,
                linger_ms=linger_ms,
                on_bad_record=on_bad_record,
                progress=progress,
                checkpoint_ms=checkpoint_ms,
                checkpoint_tier=checkpoint_tier,
                max_concurrent_checkpoints=max_concurrent_checkpoints,
                checkpoint_timeout_ms=checkpoint_timeout_ms,
                max_restarts=max_restarts,
                resume=resume,
                persist_ms=persist_ms,
                persist_budget=persist_budget,
                max_unpersisted_mb=max_unpersisted_mb,
                max_output_log_mb=max_output_log_mb,
                max_concurrent_snapshots=max_concurrent_snapshots,
                replay_threshold_records=replay_threshold_records,
            )
    except PipelineError as e:
        if tty:
            click.echo()
        raise click.UsageError(str(e)) from None
    except RunFailed as e:
        if tty:
            click.echo()
        click.echo(f"error: run failed: {e}", err=True)
        if not verbose:
            click.echo(f"Spark's own output: {move_log(staged, run_dir)}", err=True)
        sys.exit(1)
    except NosyncError as e:
        if tty:
            click.echo()
        raise click.UsageError(str(e)) from None
    if tty:
        click.echo()
    s = result.summary
    rows = [
        ("pipeline", s["pipeline"]),
        ("mode", s["mode"]),
        ("workers", s["workers"]),
        ("records read", f"{s['records_read']:,}"),
        ("records committed", f"{s['records_committed']:,}"),
        ("throughput", f"{s['records_per_s']:,.0f} records/s"),
        ("start-up", f"{s['startup_s']:.1f} s"),
        ("latency p50 / p99", f"{_ms(s['latency_p50_ms'])} / {_ms(s['latency_p99_ms'])}"),
        ("dead letters", s["dead_letters"]),
    ]
    if "checkpoints_completed" in s:
        rows += [
            ("checkpoints", f"{s['checkpoints_completed']} completed, {s['checkpoints_aborted']} aborted"),
            ("checkpoint p50 / p99", f"{_ms(s['checkpoint_ms_p50'])} / {_ms(s['checkpoint_ms_p99'])}"),
            ("alignment (max stall)", _ms(s["stall_ms_max"])),
            ("bytes persisted", f"{s['checkpoint_bytes']:,}"),
        ]
    for i, r in enumerate(s.get("recoveries") or []):
        if "restored_step" in r:
            what = (
                f"restored its snapshot at step {r['restored_step']:,}, replayed {r.get('steps_replayed', 0):,} steps"
            )
        else:
            what = f"restored checkpoint {r.get('checkpoint')}"
        rows.append(
            (
                f"recovery {i + 1}",
                f"worker {r['worker']}: {what} in {r.get('restore_s') or 0:.2f} s, "
                f"{r.get('records_reprocessed') or 0:,} records reprocessed",
            )
        )
    rows.append(("run directory", result.run_dir))
    if not verbose:
        rows.append(("Spark's output", move_log(staged, result.run_dir)))
    width = max(len(a) for a, _ in rows)
    click.echo("\n".join(f"{a:<{width}}  {b}" for a, b in rows))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f} ms"
