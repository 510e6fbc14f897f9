"""`nosync inspect`: what a run directory holds."""

from __future__ import annotations

import json
import sys

import click


def _mb(n: int) -> str:
    return f"{n / (1 << 20):,.1f} MB"


@click.command("inspect")
@click.argument("run_dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print everything as JSON.")
def inspect_cmd(run_dir, as_json) -> None:
    """Show RUN_DIR: pipeline and mode, epochs and safe points, checkpoints (abs), durable
    points and storage per tier (nosync), recoveries and what each cost."""
    from nosync import storage
    from nosync.errors import NosyncError
    from nosync.tools.runinfo import inspect_run

    try:
        info = inspect_run(run_dir)
    except NosyncError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(info, indent=2, default=str))
        return
    params = storage.redact(" ".join(f"-p {k}={v}" for k, v in info["params"].items()))
    click.echo(f"run        {info['run_dir']}")
    click.echo(f"pipeline   {info['pipeline']} ({info['pipeline_file']}) {params}".rstrip())
    click.echo(
        f"mode       {info['mode']}, {info['workers']} workers, {'finished' if info['finished'] else 'not finished'}"
    )
    where = info["places"]
    hosts = ", ".join(f"w{w} {h}" for w, h in sorted((where.get("worker_hosts") or {}).items()))
    click.echo(
        f"places     shared tier {where['shared']}; local roots {where['local']}" + (f" ({hosts})" if hosts else "")
    )
    if info["finished"]:
        click.echo(
            f"records    read {info['records_read']:,}, committed {info['records_committed']:,}, "
            f"{info['records_per_s'] or 0:,.0f}/s, latency p99 {info['latency_p99_ms'] or 0:,.1f} ms"
        )
    if "safe_points" in info:
        sp = info["safe_points"]
        last = "the end of the input" if sp["last"] >= 1 << 62 else f"epoch {sp['last']}"
        click.echo(f"safe       {sp['count']} safe points, the last at {last}")
    if "checkpoints" in info:
        c = info["checkpoints"]
        click.echo(
            f"checkpoints {c['completed']} completed (last {c['last']}), {c['aborted']} aborted, "
            f"{c['files']} files, {_mb(c['bytes'])}"
        )
        if c.get("rewind_from_epoch") is not None:
            click.echo(f"rewind     from a retained checkpoint, to any epoch from {c['rewind_from_epoch']} on")
    if (info.get("snapshots") or {}).get("rewind_from_epoch") is not None:
        first = info["snapshots"]["rewind_from_epoch"]
        click.echo(f"rewind     from a consistent cut of the workers' snapshots, to any epoch from {first} on")
    tiers = info["storage_bytes"]
    if info["stores"]:
        click.echo("storage    " + ", ".join(f"{t} {_mb(n)}" for t, n in tiers.items()))
        for s in info["stores"]:
            if s.get("in_use"):
                points = "in use by a running worker"
            elif "error" in s:
                points = s["error"]
            else:
                points = f"last seq {s['last_seq']}, durable on disk {s['disk']}, remote {s['remote']}"
            click.echo(f"  w{s['worker']} {s['store']:<12} {points}")
    lv = info.get("levels")
    if lv:
        lags = ", ".join(f"{k} {v:,.0f} ms" for k, v in lv["lag_ms_max"].items())
        click.echo(f"levels     durable seqs at the end per worker; longest an append waited: {lags}")
        for w, seqs in lv["durable_seqs"].items():
            click.echo(f"  w{w} " + ", ".join(f"{k} {v}" for k, v in (seqs or {}).items()))
        behind = {k: v for k, v in lv["gap_ms_max"].items() if v}
        if behind:
            gaps = ", ".join(f"{k} {v:,.0f} ms" for k, v in behind.items())
            click.echo(f"  fell behind the budget (longest gap between two rounds): {gaps}")
        if lv["replica_holder_losses"]:
            click.echo(f"  holders of copies lost: {lv['replica_holder_losses']} (the level waited for them)")
        for w, why in lv["replica_holders_over_budget"].items():
            click.echo(f"  holder w{w} acknowledged nothing more: {why}")
    for r in info["recoveries"]:
        cost = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items() if k != "reason")
        click.echo(f"recovery   {cost}")
    if info["regroups"]:
        click.echo(f"regroups   {info['regroups']}")
