"""`nosync state`: the keyed state of an operator of a run, as it was at the end of an epoch."""

from __future__ import annotations

import json
import os
import sys

import click

from cli.common import kept_log, master_option, restore_from_option, spark_log, staged_log, verbose_option


def _candidates(text: str) -> list:
    """`--key 5` may mean the int 5 or the string "5": both are looked up, the JSON reading first."""
    out: list = []
    try:
        v = json.loads(text)
        if isinstance(v, list):
            v = tuple(v)
        out.append(v)
    except ValueError:
        pass
    if text not in out:
        out.append(text)
    return out


@click.command("state")
@click.argument("run_dir", type=click.Path())
@click.option("--operator", required=True, help="A keyed operator's name (aggregate, reduce, window, join...).")
@click.option("--key", default=None, help="Only this key (read as JSON, else as a string).")
@click.option(
    "--as-of-epoch",
    type=click.IntRange(min=0),
    default=None,
    help="At the end of this epoch (default: the end of the input).",
)
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True, help="Keys shown (0: all).")
@restore_from_option(
    "Start from the run's own state (a retained checkpoint in mode abs, a consistent cut of the workers' "
    "retained snapshots in mode nosync), or recompute from the sources; auto takes the run's state when "
    "it has some to start from."
)
@master_option("embedded")
@click.option("--json", "as_json", is_flag=True, help="Print (key, state) pairs as JSON lines.")
@verbose_option()
def state_cmd(run_dir, operator, key, as_of_epoch, limit, restore_from, master, as_json, verbose) -> None:
    """Show the keyed state of OPERATOR in the run RUN_DIR at the end of an epoch. The state is
    computed by Spark batch jobs running the pipeline's own operators over the run's input:
    from the latest retained checkpoint before that epoch for a run in mode abs, from a
    consistent cut of the workers' snapshots for one in mode nosync, else from the start of
    the sources. It is the same under every mode."""
    from lsm.files import scratch_near
    from lsm.keys import encode_key
    from nosync.api.loader import load_pipeline
    from nosync.errors import NosyncError, PipelineError, RunFailed
    from nosync.spark.batch import keyed_state
    from nosync.tools.rewind import choose_start

    meta_path = os.path.join(run_dir, "run.json")
    if not os.path.isfile(meta_path):
        click.echo(f"error: {run_dir} is not a run directory: it has no run.json", err=True)
        sys.exit(2)
    with open(meta_path, encoding="utf-8") as f:
        run = json.load(f)
    if run.get("epoch_ms"):
        click.echo(
            f"error: the epochs of {run_dir} were cut by time (--epoch-ms {run['epoch_ms']}): their boundaries "
            "are not recorded, so the state at the end of one cannot be recomputed",
            err=True,
        )
        sys.exit(2)
    staged = staged_log()
    # (exit code, message, whether Spark's output is kept) of an error, told once Spark's output
    # goes back to the terminal: inside the block, file descriptor 2 is the staged log
    failed: tuple[int, str, bool] | None = None
    with scratch_near(run_dir, "nosync-state-") as scratch, spark_log(verbose, staged):
        try:
            pipeline = load_pipeline(run["pipeline_file"], run.get("params") or {})
            # a checkpoint whose cut lies before epoch E begins (not only before it ends): the
            # sources then read at least epoch E's end, so every task of every stage runs
            start = choose_start(run_dir, run, pipeline, as_of_epoch, os.path.join(scratch, "start"), restore_from)
            state = keyed_state(
                run["pipeline_file"],
                run.get("params") or {},
                operator,
                workers=int(run["workers"]),
                epoch_records=run.get("epoch_records"),
                until_epoch=as_of_epoch,
                keys=None if key is None else _candidates(key),
                run_dir=scratch,
                restore=start["restore"],
                input_logs=start["input_logs"],
                master=master,
            )
        except PipelineError as e:
            failed = (2, f"error: {e}", False)  # a usage error: Spark's output says nothing more
        except NosyncError as e:
            failed = (1 if isinstance(e, RunFailed) else 2, f"error: {e}", True)
    if failed is not None:
        code, message, keep = failed
        log = kept_log(staged) if keep and not verbose else None
        if not keep and os.path.exists(staged):
            os.unlink(staged)
        click.echo(message + ("" if log is None else f" (Spark's own output: {log})"), err=True)
        sys.exit(code)
    if not verbose and os.path.exists(staged):
        os.unlink(staged)  # the state was computed: Spark's output holds nothing to keep
    state.sort(key=lambda kv: encode_key(kv[0]))
    shown = state if not limit else state[:limit]
    if as_json:
        for k, v in shown:
            click.echo(json.dumps([k, v], default=str))
        return
    at = "the end of the input" if as_of_epoch is None else f"the end of epoch {as_of_epoch}"
    if start["restore"] is not None:
        frm = f"from {start['start']}, {start['records']:,} records before it"
    else:
        frm = "from the start of the sources" + (f" ({start['why_not']})" if start["why_not"] else "")
    if start["input_logs"] is not None:
        frm += "; the sources that cannot restart read back from the run's input logs"
    click.echo(f"{operator}: {len(state):,} keys at {at}, computed {frm}")
    for k, v in shown:
        click.echo(f"  {json.dumps(k, default=str)}: {json.dumps(v, default=str)}")
    if len(shown) < len(state):
        click.echo(f"  ... {len(state) - len(shown):,} more (--limit 0 shows all)")
    if key is not None and not state:
        click.echo(f"  no state for key {key}")
