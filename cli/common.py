"""Parsing and output handling shared by the commands."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

import click

from nosync.spark.session import spark_output_to


def parse_params(items: tuple[str, ...], hint: str = "-p") -> dict[str, str]:
    """`-p key=value` options as a dict; a malformed one is a usage error naming it."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"'{item}' is not KEY=VALUE", param_hint=hint)
        out[key] = value
    return out


def verbose_option() -> Callable:
    """`--verbose`, shared by every command that starts Spark: show Spark's own output (WARN
    and log4j lines) on the terminal instead of sending it to a file (the run directory's
    spark.log; a rewind's in its output's _rewind/; `state`, which writes nothing, a
    temporary file it names if it fails)."""
    return click.option(
        "--verbose",
        is_flag=True,
        help="Show Spark's own output here instead of in a log file.",
    )


@contextlib.contextmanager
def spark_log(verbose: bool, path: str) -> Iterator[None]:
    """Spark's output to `path` for the block (`spark_output_to`), unless `verbose`."""
    if verbose:
        yield
        return
    with spark_output_to(path):
        yield


def kept_log(path: str) -> str | None:
    """`path`, a staged Spark log, if Spark wrote anything there (worth naming with an error);
    else None, the empty file removed (an error found before Spark started)."""
    try:
        if os.path.getsize(path) > 0:
            return path
        os.unlink(path)
    except OSError:
        pass
    return None


def staged_log() -> str:
    """Where Spark's output goes until the run directory is known (`move_log`)."""
    return os.path.join(tempfile.gettempdir(), f"nosync-spark-{os.getpid()}.log")


def move_log(staged: str, run_dir: str | None) -> str:
    """Moves a spark.log written before its directory was known (a run's, a batch's, a
    rewind's) into `run_dir` (appending to one already there); returns where the log is."""
    if not run_dir or not os.path.exists(staged):
        return staged
    final = os.path.join(run_dir, "spark.log")
    os.makedirs(run_dir, exist_ok=True)
    if os.path.exists(final):
        with open(staged, "rb") as src, open(final, "ab") as dst:
            dst.write(src.read())
        os.unlink(staged)
    else:
        shutil.move(staged, final)
    return final


def restore_from_option(help: str) -> Callable:
    """`--restore-from auto|checkpoint|sources`, shared by `rewind` and `state` (the values of
    `nosync.tools.rewind.RESTORE_FROM`, not imported here to keep the CLI's start-up light)."""
    return click.option(
        "--restore-from",
        "restore_from",
        type=click.Choice(["auto", "checkpoint", "sources"]),
        default="auto",
        show_default=True,
        help=help,
    )


def master_option(default: str = "embedded local[W,F]") -> Callable:
    """`--master URL`, shared by every command that runs Spark; `default` says what runs when
    it is not given."""
    return click.option("--master", default=None, help=f"Spark master URL (default: {default}).")
