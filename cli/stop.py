"""`nosync stop`: stop a running run cleanly."""

from __future__ import annotations

import json
import os
import sys
import time

import click


@click.command("stop")
@click.argument("run_dir", type=click.Path())
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait for the run to have stopped.")
@click.option(
    "--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True, help="Seconds to wait."
)
def stop_cmd(run_dir: str, wait: bool, timeout: float) -> None:
    """Stop the run in RUN_DIR cleanly: its sources stop at an epoch boundary, everything read
    before it is committed, a last checkpoint (abs) or snapshot (nosync) is taken, and the run
    exits 0. `nosync run --resume --run-dir RUN_DIR` reads on from there. The same as SIGINT or
    SIGTERM to `nosync run`; the request is a file in RUN_DIR, so any host that shares it may
    ask."""
    from nosync.driver.stopping import read_json, stop_file

    run = read_json(os.path.join(run_dir, "run.json"))
    if not run:
        click.echo(f"error: {run_dir}: no run.json there, so no run to stop", err=True)
        sys.exit(2)
    summary = read_json(os.path.join(run_dir, "summary.json"))
    if summary.get("run_id") == run.get("run_id"):
        click.echo(f"error: the run in {run_dir} (run {run.get('run_id')}) has already ended", err=True)
        sys.exit(2)
    with open(stop_file(run_dir), "w", encoding="utf-8") as f:
        f.write(json.dumps({"asked_at": time.time(), "pid": os.getpid()}) + "\n")
    click.echo(f"asked the run in {run_dir} to stop")
    if not wait:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        summary = read_json(os.path.join(run_dir, "summary.json"))
        if summary.get("run_id") == run.get("run_id"):
            stopped = summary.get("stopped") or {}
            click.echo(
                f"stopped at epoch {stopped.get('epoch')} after {stopped.get('stop_s')} s: "
                f"{summary.get('records_committed', 0):,} records committed"
            )
            return
        time.sleep(0.2)
    click.echo(f"error: the run in {run_dir} had not stopped after {timeout:g} s (its request stays)", err=True)
    sys.exit(1)
