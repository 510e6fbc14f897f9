"""`nosync chaos`: runs a pipeline with and without seeded failures (a worker's process, its
machine, two machines, a hung or paused process) and judges exactly-once."""

from __future__ import annotations

import json
import os
import sys
import tempfile

import click

from cli.common import master_option, parse_params
from experiments.failures import FAILURES
from nosync.modes import MODES


@click.command("chaos")
@click.argument("pipeline_file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--mode",
    type=click.Choice(MODES),
    required=True,
    help="The mode to judge (none is refused: it does not recover).",
)
@click.option("--workers", "-w", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--kills", type=click.IntRange(min=1), default=1, show_default=True, help="Failures in the run with kills."
)
@click.option(
    "--failure",
    type=click.Choice(FAILURES),
    default="process",
    show_default=True,
    help="What each kill loses: a worker's process; its machine (the process, then its local disk: "
    "state/w<i> and the part files it was writing); two workers' machines at once (needs -w 2 or more); hang: its "
    "process stopped (SIGSTOP) for good; pause: stopped for a time drawn around the failure timeout, then resumed; "
    "on a cluster (--cluster) only: partition: its host's network cut for a time drawn around the failure timeout, "
    "then restored; hang-machine: every process of its host stopped for good; stop: no failure but a clean stop "
    "(SIGTERM), then --resume.",
)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option(
    "--out", type=click.Path(file_okay=False), default=None, help="Where the runs go (default: a new temp dir)."
)
@click.option(
    "--epoch-records", type=click.IntRange(min=1), default=None, help="Passed to `nosync run` (default: its own)."
)
@click.option(
    "--checkpoint-ms", type=click.IntRange(min=1), default=None, help="Passed to `nosync run` (default: its own)."
)
@click.option(
    "--checkpoint-tier",
    type=click.Choice(["disk", "remote", "replicated"]),
    default=None,
    help="Passed to `nosync run` (default: its own, disk). --failure machine and two need one off the lost machine.",
)
@click.option(
    "--replicas",
    type=click.IntRange(min=0),
    default=None,
    help="Passed to `nosync run` when given: copies of each snapshot on other workers (--checkpoint-tier replicated).",
)
@click.option(
    "--persist-ms", type=click.IntRange(min=1), default=None, help="Passed to `nosync run` (default: its own)."
)
@click.option("--persist-budget", type=float, default=None, help="Passed to `nosync run` (default: its own).")
@click.option(
    "--replay-threshold-records",
    type=click.IntRange(min=1),
    default=None,
    help="Passed to `nosync run` (mode nosync: recoveries hand long spans to a Spark batch job).",
)
@click.option(
    "--standbys",
    type=click.IntRange(min=0),
    default=None,
    help="Passed to `nosync run`: spare tasks that replace a lost or suspected worker at once.",
)
@click.option(
    "--failure-timeout-ms",
    type=int,
    default=None,
    help="Passed to `nosync run` (default: its own): how long a silent worker goes before it is suspected.",
)
@click.option(
    "--suspect-kill",
    type=click.Choice(["process", "spark"]),
    default=None,
    help="Passed to `nosync run`: 'spark' leaves a suspected worker to Spark's kill, as on a cluster (default: "
    "its own, 'process'; --failure pause uses 'spark', so that paused processes may wake as zombies).",
)
@master_option("embedded")
@click.option(
    "--cluster",
    "cluster_name",
    is_flag=False,
    flag_value="nsc",
    default=None,
    metavar="NAME",
    help="Run on the cluster of hosts `nosync cluster up` made (its --master and --remote; NAME default nsc): "
    "--failure machine then kills every process of the victim's host and wipes its disk.",
)
@click.option("--timeout", type=click.IntRange(min=10), default=600, show_default=True, help="Seconds per run.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON object.")
@click.option("-p", "params", multiple=True, metavar="KEY=VALUE", help="A parameter for the pipeline's build(args).")
def chaos_cmd(
    pipeline_file,
    mode,
    workers,
    kills,
    failure,
    seed,
    out,
    epoch_records,
    checkpoint_ms,
    checkpoint_tier,
    replicas,
    persist_ms,
    persist_budget,
    replay_threshold_records,
    standbys,
    failure_timeout_ms,
    suspect_kill,
    master,
    cluster_name,
    timeout,
    as_json,
    params,
) -> None:
    """Run PIPELINE_FILE without failures (twice, the second with K pauses of a worker) and with K
    failures of class --failure; compare outputs.

    Exit code 0 only when the committed output is exactly the reference's, every kill asked for
    made; 1 when records were lost or duplicated, or a run failed (the one with kills: not
    exactly-once); 2 for a usage error, or a mode and --checkpoint-tier that cannot survive the
    failure class (refused before any run); 3 when the pipeline is not deterministic (nothing
    judged); 4 when the run with kills is not judged: it ended before every kill asked for was
    made (give it more input), nothing recovered in it, or a lost machine's disk was wiped only
    after its retry had started."""
    from experiments.chaos import chaos, exit_code
    from nosync.errors import NosyncError, RunFailed

    args = parse_params(params)
    if "output" in args:
        raise click.UsageError("chaos sets -p output=<run dir>/output for each run itself: drop -p output")
    cluster = None
    if cluster_name is not None:
        from experiments.cluster import load

        if master is not None:
            raise click.UsageError("--cluster runs on the cluster's own master: drop --master")
        cluster = load(cluster_name)
        if cluster is None:
            raise click.UsageError(f"no cluster named {cluster_name} is up: start one with `nosync cluster up`")
    made = out is None
    out = out or tempfile.mkdtemp(prefix="nosync-chaos-")
    options = {
        "epoch_records": epoch_records,
        "checkpoint_ms": checkpoint_ms,
        "checkpoint_tier": checkpoint_tier,
        "replicas": replicas,
        "persist_ms": persist_ms,
        "persist_budget": persist_budget,
        "replay_threshold_records": replay_threshold_records,
        "failure_timeout_ms": failure_timeout_ms,
        "standbys": standbys,
        "suspect_kill": suspect_kill,
        "master": master,
    }

    def progress(msg: str) -> None:
        if not as_json:
            click.echo(f"[chaos] {msg}", err=True)

    try:
        r = chaos(
            pipeline_file,
            mode,
            workers,
            kills,
            seed,
            args,
            out,
            options,
            timeout=timeout,
            progress=progress,
            failure=failure,
            cluster=cluster,
        )
    except RunFailed as e:
        click.echo(f"error: a failure-free run failed, so nothing was judged: {e}", err=True)
        sys.exit(1)
    except NosyncError as e:
        if made and not os.listdir(out):
            os.rmdir(out)  # refused before any run: the directory made for them is empty
        raise click.UsageError(str(e)) from None
    if as_json:
        click.echo(json.dumps(r, sort_keys=True))
    else:
        if r.get("wipe_late"):
            click.echo(
                f"not judged: the local disk of worker(s) {', '.join(map(str, r['wipe_late']))} was wiped only after "
                "Spark's retry of the task had started (its registration came first), so the retry may have "
                "opened what the wipe then took: that is not the loss of a machine. Run it again (another "
                f"--seed), on a less loaded machine. Runs in {out}"
            )
        elif "run_failed" in r:
            click.echo(
                f"not exactly-once: the run with kills failed after {r['kills']} kill(s) ({r['run_failed']}); "
                f"runs in {out}"
            )
        elif not r["deterministic"]:
            second = r["reference_2"]
            pauses = ", ".join(f"worker {x['worker']} for {x['pause_s']:.2f} s" for x in second["paused"]) or "none"
            click.echo(
                "not deterministic: the two failure-free runs differ; nothing judged. The second read its sources "
                f"in chunks of {second['batch_size']} records and stopped workers for a while ({pauses}), as a "
                "recovery changes how an operator's inputs interleave: an output that depends on that (a stateful "
                "function over one key's records from two sources or two workers, in arrival order) differs then"
            )
            click.echo(json.dumps(r["reference_diff"], indent=1))
        elif r.get("kills_short") and r["exactly_once"] is None:
            made = ", ".join(f"{k['read']:,}" for k in r["killed"])
            click.echo(
                f"not judged: {r['kills']} of {r['kills_requested']} kills made before the run ended "
                f"({f'at records read {made}; ' if made else ''}planned at "
                f"{', '.join(f'{t:,}' for t in r['kill_targets'])} of the {r['records_read']:,} records the "
                "reference runs read, each once the run has something to recover from and recovered from the "
                "kill before). Equal outputs say nothing of the kills not made: give the pipeline more input, or "
                f"ask for fewer kills. Runs in {out}"
            )
        elif r.get("no_recovery"):
            click.echo(
                f"not judged: nothing recovered in the run with kills ({r['kills']} of {r['kills_requested']} "
                "kills made, each after the killed worker's work was done), so equal outputs say nothing. Give "
                f"the pipeline more input. Runs in {out}"
            )
        else:
            rows = [
                ("exactly_once", r["exactly_once"]),
                ("lost", r["lost"]),
                ("duplicated", r["duplicated"]),
                ("failure", r["failure"]),
                ("kills", f"{r['kills']} of {r['kills_requested']}"),
                ("recoveries", r["recoveries"]),
                ("detection_s", ", ".join("-" if x is None else f"{x:.2f}" for x in r["detection_s"])),
                ("recovery_s", ", ".join("-" if x is None else f"{x:.2f}" for x in r["recovery_s"])),
                ("records_reprocessed", ", ".join(str(x) for x in r["records_reprocessed"])),
            ]
            if r["failure"] == "pause":
                rows.append(("paused_s", ", ".join(f"{k['pause_s']:.2f}" for k in r["killed"])))
                rows.append(("suspected", ", ".join(str(k.get("suspected")).lower() for k in r["killed"])))
                rows.append(("suspected_below_timeout", r["suspected_below_timeout"]))
            elif r["failure"] in ("machine", "two"):
                # per kill, per lost machine: whether its disk was gone before its retry registered
                wiped = [k.get("wiped_before_retry", []) for k in r["killed"]]
                rows.append(("wiped_before_retry", ", ".join("/".join(str(x).lower() for x in k) for k in wiped)))
            rows.append(("runs", out))
            w = max(len(a) for a, _ in rows)
            click.echo("\n".join(f"{a:<{w}}  {b}" for a, b in rows))
    sys.exit(exit_code(r))
