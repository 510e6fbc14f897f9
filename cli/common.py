"""Parsing and output handling shared by the commands."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

import click


def parse_params(items: tuple[str, ...], hint: str = "-p") -> dict[str, str]:
    """`-p key=value` options as a dict; a malformed one is a usage error naming it."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"'{item}' is not KEY=VALUE", param_hint=hint)
        out[key] = value
    return out


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


def restore_from_option(help: str) -> Callable:
    """`--restore-from auto|checkpoint|sources`, shared by `rewind` and `state` (the values of
    `nosync.rewind.RESTORE_FROM`, not imported here to keep the CLI's start-up light)."""
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
