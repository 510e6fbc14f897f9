"""`nosync run`: run a pipeline file under a mode, with live progress and a summary."""

from __future__ import annotations

import os
import select
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from cli.common import parse_params, verbose_option
from nosync.driver.runner import run
from nosync.errors import NosyncError, PipelineError, RunFailed
from nosync.modes import MODES
from nosync.options import RunOptions, cli_fields, default_of, flag


def run_options(fn: Callable) -> Callable:
    """The flags of every run option (`nosync.options.RunOptions`), made from its fields."""
    for f in reversed(cli_fields()):
        decls = [flag(f.name)] + ([f.metadata["short"]] if "short" in f.metadata else [])
        default = default_of(f)
        if f.name == "mode":
            kind: Any = click.Choice(MODES)
        elif "choices" in f.metadata:
            kind = click.Choice(f.metadata["choices"])
        elif f.type in ("bool",):
            fn = click.option(flag(f.name), is_flag=True, help=f.metadata["help"])(fn)
            continue
        elif "min" in f.metadata:
            kind = click.IntRange(min=f.metadata["min"])
        elif f.type in ("float", "float | None"):
            kind = float
        elif f.type in ("int",):
            kind = int
        else:
            kind = str
        fn = click.option(
            *decls, type=kind, default=default, show_default=default is not None, help=f.metadata["help"]
        )(fn)
    return fn


@click.command("run")
@click.argument("pipeline_file", type=click.Path(exists=True, dir_okay=False))
@run_options
@click.option("-p", "params", multiple=True, metavar="KEY=VALUE", help="A parameter for the pipeline's build(args).")
@verbose_option()
def run_cmd(pipeline_file: str, params: tuple[str, ...], verbose: bool, **given: Any) -> None:
    """Run PIPELINE_FILE (a Python file defining `pipeline` or `build(args)`)."""
    try:
        options = RunOptions(**given, params=parse_params(params))
    except NosyncError as e:
        raise click.UsageError(str(e)) from None
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
        elif int(p["t"]) > last[2] and _room(sys.stdout):
            last[2] = int(p["t"])  # one line a second
            click.echo(line)

    try:
        result = run(pipeline_file, options, progress=progress, log_spark=not verbose)
    except PipelineError as e:
        if tty:
            click.echo()
        raise click.UsageError(str(e)) from None
    except RunFailed as e:
        if tty:
            click.echo()
        click.echo(f"error: run failed: {e}", err=True)
        run_dir = getattr(e, "run_dir", None)
        if not verbose and run_dir:
            click.echo(f"Spark's own output: {os.path.join(run_dir, 'spark.log')}", err=True)
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
        rows.append(("Spark's output", os.path.join(result.run_dir, "spark.log")))
    width = max(len(a) for a, _ in rows)
    click.echo("\n".join(f"{a:<{width}}  {b}" for a, b in rows))


def _room(stream: Any) -> bool:
    """Whether a progress line written to `stream` now would not wait: a pipe nobody reads
    (a wrapper, a supervisor) fills, and the loop that prints progress is the one that acts on
    `--duration` and `nosync stop`, so a line that would wait is dropped instead. A stream that
    is no file (a test's capture) always has room."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return True
    try:
        return bool(select.select([], [fd], [], 0)[1])
    except (OSError, ValueError):
        return True


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f} ms"
