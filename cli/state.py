"""`nosync state`: the keyed state of an operator of a run, as it was at the end of an epoch."""

from __future__ import annotations

import json
import os
import sys

import click


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
    "--as-of-epoch", type=click.IntRange(min=0), default=None, help="At the end of this epoch (default: all)."
)
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True, help="Keys shown (0: all).")
@click.option("--json", "as_json", is_flag=True, help="Print (key, state) pairs as JSON lines.")
def state_cmd(run_dir, operator, key, as_of_epoch, limit, as_json) -> None:
    """Show the keyed state of OPERATOR in the run RUN_DIR at the end of an epoch. The state is
    recomputed from the run's input by Spark batch jobs running the pipeline's own operators,
    so it is the same under every mode."""
    from lsm.keys import encode_key
    from nosync.batch import keyed_state
    from nosync.errors import NosyncError, PipelineError

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
    try:
        state = keyed_state(
            run["pipeline_file"],
            run.get("params") or {},
            operator,
            workers=int(run["workers"]),
            epoch_records=run.get("epoch_records"),
            until_epoch=as_of_epoch,
            keys=None if key is None else _candidates(key),
            run_dir=os.path.join(run_dir, "state-query"),
        )
    except PipelineError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except NosyncError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    state.sort(key=lambda kv: encode_key(kv[0]))
    shown = state if not limit else state[:limit]
    if as_json:
        for k, v in shown:
            click.echo(json.dumps([k, v], default=str))
        return
    at = "the end of the input" if as_of_epoch is None else f"the end of epoch {as_of_epoch}"
    click.echo(f"{operator}: {len(state):,} keys at {at}")
    for k, v in shown:
        click.echo(f"  {json.dumps(k, default=str)}: {json.dumps(v, default=str)}")
    if len(shown) < len(state):
        click.echo(f"  ... {len(state) - len(shown):,} more (--limit 0 shows all)")
    if key is not None and not state:
        click.echo(f"  no state for key {key}")
