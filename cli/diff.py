"""`nosync diff`: differences between two committed outputs, per key and per epoch."""

from __future__ import annotations

import json
import sys

import click


@click.command("diff")
@click.argument("output_a", type=click.Path())
@click.argument("output_b", type=click.Path())
@click.option(
    "--key",
    default=None,
    metavar="FIELD",
    help="The key field of dict records (default: element 0 of a list; any other record is its own key).",
)
@click.option(
    "--out", "out_path", default="nosync-diff.jsonl", show_default=True, help="Where every difference is written."
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def diff_cmd(output_a, output_b, key, out_path, as_json) -> None:
    """Compare the committed outputs OUTPUT_A and OUTPUT_B (directories of a Files or LevelDB
    sink). Exit code 0: the same; 1: they differ; 2: they cannot be compared."""
    from nosync.errors import NosyncError
    from nosync.tools.diff import diff_outputs

    try:
        s = diff_outputs(output_a, output_b, out_path, key=key)
    except NosyncError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(s, indent=2, default=str))
    else:
        click.echo(f"A: {output_a}: {s['records_a']:,} records")
        click.echo(f"B: {output_b}: {s['records_b']:,} records")
        if not s["differences"]:
            click.echo("the same")
        else:
            if s["kind"] == "multiset":
                click.echo(
                    f"{s['differences']:,} records differ: {s['only_in_a']:,} copies only in A, "
                    f"{s['only_in_b']:,} only in B; first in epoch {s['first_epoch']}"
                )
                epochs = list(s["epochs"].items())
                shown = ", ".join(f"{e}: {n}" for e, n in epochs[:12])
                click.echo(f"per epoch: {shown}{' ...' if len(epochs) > 12 else ''}")
                if s["whole_only_in_a"] or s["whole_only_in_b"]:
                    click.echo(
                        f"as wholes (epochs aside): {s['whole_only_in_a']:,} copies only in A, "
                        f"{s['whole_only_in_b']:,} only in B"
                    )
                else:
                    click.echo("as wholes (epochs aside): the same records; only the epochs they sit in differ")
            else:
                click.echo(f"{s['differences']:,} keys differ")
            top = ", ".join(f"{json.dumps(k, default=str)} ({n})" for k, n in s["top_keys"])
            click.echo(f"{s['keys']:,} keys differ; most: {top}")
            click.echo(f"every difference: {s['file']}")
    sys.exit(1 if s["differences"] else 0)
