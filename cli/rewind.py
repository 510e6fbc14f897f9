"""`nosync rewind`: re-execute an operator and its downstream cone from a past epoch."""

from __future__ import annotations

import json
import os
import sys

import click

from cli.common import kept_log, master_option, move_log, restore_from_option, spark_log, staged_log, verbose_option


@click.command("rewind")
@click.argument("run_dir", type=click.Path())
@click.option("--operator", required=True, help="The operator to rewind (with everything downstream of it).")
@click.option(
    "--to-epoch",
    "to_epoch",
    type=click.IntRange(min=0),
    required=True,
    help="Restore the state just before this epoch.",
)
@click.option(
    "--pipeline",
    "pipeline_file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="A changed pipeline.",
)
@click.option("--output", default=None, help="Where the new output goes (default: RUN_DIR-rewind-OPERATOR-eE).")
@restore_from_option(
    "Where the state before the epoch comes from: the run's own state (a retained checkpoint in mode abs, "
    "a consistent cut of the workers' retained snapshots in mode nosync), or a recomputation from the "
    "sources; auto takes the run's state when it has some to start from."
)
@master_option("embedded")
@click.option("--json", "as_json", is_flag=True, help="Print what was done as JSON.")
@verbose_option()
def rewind_cmd(run_dir, operator, to_epoch, pipeline_file, output, restore_from, master, as_json, verbose) -> None:
    """Restore OPERATOR of the run in RUN_DIR, and its downstream cone, to the state just before
    epoch --to-epoch, and re-execute from there with the run's pipeline or a changed one
    (--pipeline), into a separate output. The run itself is not changed."""
    from nosync.errors import NosyncError, PipelineError, RunFailed
    from nosync.tools.rewind import rewind

    staged = staged_log()
    try:
        with spark_log(verbose, staged):
            r = rewind(
                run_dir,
                operator,
                to_epoch,
                pipeline_file=pipeline_file,
                output=output,
                master=master,
                restore_from=restore_from,
            )
    except (PipelineError, NosyncError) as e:
        log = None if verbose else kept_log(staged)
        if log is not None:
            click.echo(f"Spark's own output: {log}", err=True)
        if isinstance(e, RunFailed):
            click.echo(f"error: rewind failed: {e}", err=True)
            sys.exit(1)
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if not verbose:
        r["spark_log"] = move_log(staged, os.path.join(r["output"], "_rewind"))
    if as_json:
        click.echo(json.dumps(r, indent=1))
        return
    click.echo(f"rewound {r['operator']} of {r['run_dir']} (mode {r['mode']}) to just before epoch {r['to_epoch']}")
    click.echo(f"cone       {', '.join(r['cone'])}")
    click.echo(f"pipeline   {r['pipeline_file']}{' (changed)' if r['changed'] else ''}")
    click.echo(f"state      {r['restored']}")
    click.echo(f"output     {r['output']}")
    if not r["by_epoch"]:
        click.echo(
            f"note       a run in mode {r['mode']} tags output with the greatest epoch an instance has seen: compare "
            "the outputs as wholes; epoch by epoch they can differ at epoch boundaries"
        )
    carried = f" ({r['records_carried']:,} carried from the run)" if r["start"] != "sources" else ""
    click.echo(
        f"records    read {r['records_read']:,}, committed {r['records_committed']:,}{carried}, in {r['seconds']:.1f}s"
    )
