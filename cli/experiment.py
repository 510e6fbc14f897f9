"""`nosync experiment NAME`: the comparative experiments, and their report."""

from __future__ import annotations

import os
import sys
import time

import click

from cli.common import master_option, parse_params, spark_output_to

NAMES = (
    "overhead-vs-interval",
    "stall-vs-state",
    "recovery-vs-state",
    "recovery-vs-failure-point",
    "scaling",
    "snapshot-size",
    "budget",
    "cycles",
    "failure-classes",
    "detection",
)


@click.command("experiment")
@click.argument("name", type=click.Choice([*NAMES, "all", "report"]))
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="runs/experiments",
    show_default=True,
    help="Where the Parquet tables, figures and REPORT.md go; a second run resumes there.",
)
@click.option(
    "--quick",
    is_flag=True,
    help=f"A reduced grid of each experiment (there are {len(NAMES)}): to check the figures' pipeline, not to quote.",
)
@click.option("--seed", type=int, default=1, show_default=True, help="The data seed of repetition 0 (rep r: seed + r).")
@master_option("embedded")
@click.option(
    "-s",
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a grid parameter in every point (e.g. -s records=100000); repeatable.",
)
def experiment_cmd(name: str, out: str, quick: bool, seed: int, master: str | None, sets: tuple[str, ...]) -> None:
    """Run experiment NAME (or all of them) and write its report; `report` only writes
    OUT/REPORT.md and one PNG per experiment from the tables already under OUT.

    Every point of the grid is a run of keyed_count through the code of `nosync run`; its
    figures are appended to OUT/<experiment>/ (Parquet) with the machine, versions and git
    commit. Points already measured there are skipped."""
    from experiments.catalog import EXPERIMENTS
    from experiments.harness import points, run
    from nosync.errors import NosyncError, RunFailed

    if name == "report":
        if not os.path.isdir(out):
            click.echo(f"error: --out {out} does not exist: no experiment has written there", err=True)
            sys.exit(2)
        _report(out)
        return
    overrides = parse_params(sets, "--set")
    names = list(NAMES) if name == "all" else [name]
    try:
        for n in names:
            points(EXPERIMENTS[n], quick, overrides, strict=name != "all")
        known = {k for n in names for p in EXPERIMENTS[n].points(quick) for k in p}
        unknown = [k for k in overrides if k not in known]
        if unknown:
            raise NosyncError(f"no experiment has a parameter '{unknown[0]}'; they have: {', '.join(sorted(known))}")
    except NosyncError as e:
        raise click.BadParameter(str(e), param_hint="--set") from None
    os.makedirs(out, exist_ok=True)
    t0 = time.monotonic()
    log = os.path.join(out, "spark.log")
    click.echo(f"Spark's own output goes to {log}")
    # one Spark session for every experiment: as many slots as the most demanding point
    slots = max(EXPERIMENTS[n].slots(p) for n in names for p in points(EXPERIMENTS[n], quick, overrides, False))
    failed: tuple[int, str] | None = None
    with spark_output_to(log):
        for n in names:
            try:
                got = run(
                    EXPERIMENTS[n],
                    out,
                    quick=quick,
                    seed=seed,
                    master=master,
                    echo=click.echo,
                    overrides=overrides,
                    strict=name != "all",
                    slots=slots,
                )
            except RunFailed as e:
                failed = (1, f"experiment {n}: a run failed: {e} (the points measured are kept in {out})")
                break
            except NosyncError as e:
                failed = (2, f"experiment {n}: {e}")
                break
            click.echo(f"{n}: {got['measured']} measured, {got['skipped']} already there, {got['total']} in the grid")
    if failed is not None:
        click.echo(f"error: {failed[1]}", err=True)
        sys.exit(failed[0])
    click.echo(f"{len(names)} experiment(s) in {time.monotonic() - t0:.0f} s")
    _report(out)


def _report(out: str) -> None:
    from experiments import report

    figures = report.write(out)
    for n, path in figures.items():
        click.echo(f"figure {n}: {path}")
    click.echo(f"report: {os.path.join(out, 'REPORT.md')}")
