"""`nosync batch`: run a pipeline over bounded input as Spark batch jobs."""

from __future__ import annotations

import click

from cli.common import master_option, move_log, parse_params, spark_log, staged_log, verbose_option


@click.command("batch")
@click.argument("pipeline_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--workers", "-w", type=click.IntRange(min=1), default=2, show_default=True, help="Tasks per stage.")
@master_option()
@click.option(
    "--run-dir", type=click.Path(file_okay=False), default=None, help="For dead letters (default: runs/batch-TIME)."
)
@click.option(
    "--epoch-records",
    type=click.IntRange(min=1),
    default=None,
    help="Cut epochs every N records per source partition, as `run` does (default 10000).",
)
@click.option(
    "--batch-size", type=click.IntRange(min=1), default=1024, show_default=True, help="Records a source reads per step."
)
@click.option("-p", "params", multiple=True, metavar="KEY=VALUE", help="Pipeline parameter (repeatable).")
@verbose_option()
def batch_cmd(pipeline_file, workers, master, run_dir, epoch_records, batch_size, params, verbose) -> None:
    """Run PIPELINE_FILE over bounded input as Spark batch jobs, one per stage between
    exchanges, with the streaming operators' own code; the committed output is the one a
    streaming run commits."""
    from nosync.errors import NosyncError, PipelineError
    from nosync.spark.batch import run_batch

    staged = staged_log()
    try:
        with spark_log(verbose, staged):
            r = run_batch(
                pipeline_file,
                parse_params(params),
                workers=workers,
                master=master,
                epoch_records=epoch_records,
                batch_size=batch_size,
                run_dir=run_dir,
            )
    except PipelineError as e:
        raise click.UsageError(str(e)) from None
    except NosyncError as e:
        if not verbose:
            click.echo(f"Spark's own output: {move_log(staged, run_dir)}", err=True)
        raise click.ClickException(str(e)) from None
    log = "" if verbose else f"; Spark's output: {move_log(staged, r['run_dir'])}"
    click.echo(
        f"batch: {r['stages']} stage(s), {r['seconds']:.1f}s, rows between stages {r['rows'][:-1]}, "
        f"read {r['read']:,}, committed {r['committed']:,}{log}"
    )
