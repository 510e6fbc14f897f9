"""`nosync cluster up|down|status`: a cluster of Spark hosts on this machine (network
namespaces, a Spark standalone worker on each, an S3 server as the shared tier), to run and
lose machines on. See `experiments.cluster`."""

from __future__ import annotations

import os
import shlex
import sys
from typing import TYPE_CHECKING

import click

from experiments.cluster.layout import DEFAULT_NAME, DEFAULT_SUBNET

if TYPE_CHECKING:
    from experiments.cluster import Cluster

_NAME_HELP = "The cluster's name: 1 to 6 of a-z, 0-9; every namespace and link it makes starts with it."


def _name_option() -> click.Option:
    return click.option("--name", default=DEFAULT_NAME, show_default=True, help=_NAME_HELP)


@click.group("cluster")
def cluster_cmd() -> None:
    """A cluster of Spark hosts on this machine, to run on and lose machines of (needs root).

    Each host is a network namespace with its own address, loopback and private disk (a tmpfs
    only its processes see), running a Spark standalone worker; another runs the master; an S3
    server on this host (the driver's) is the shared tier. `up` prints the --master and
    --remote of a run on it."""


@cluster_cmd.command("up")
@click.option("--hosts", type=click.IntRange(min=1), default=3, show_default=True, help="Worker hosts.")
@click.option("--cores", type=click.IntRange(min=1), default=2, show_default=True, help="Cores of each worker.")
@click.option(
    "--memory",
    default="1g",
    show_default=True,
    help="Memory of each worker for its executors (an executor takes 1g by default: 1g makes one a host).",
)
@click.option(
    "--disk", default="4g", show_default=True, help="Most a host's private disk (a tmpfs, in memory) can hold."
)
@_name_option()
@click.option(
    "--subnet",
    default=DEFAULT_SUBNET,
    show_default=True,
    help="IPv4 subnet of the hosts: .1 this host (the driver's), .2 the master, .11 and on the workers.",
)
def up_cmd(hosts: int, cores: int, memory: str, disk: str, name: str, subnet: str) -> None:
    """Start a cluster: N hosts, a master, an S3 server; wait until every worker is alive.

    Exit code 0 once it is ready; 2 when refused before anything was made (not root, a tool
    missing, a name or the subnet in use); 1 when it failed to start (everything it made taken
    down again, its logs kept)."""
    from experiments.cluster import ClusterError, ClusterRefused, up

    try:
        c = up(hosts, cores, memory, name, subnet, disk=disk, progress=lambda m: click.echo(f"[cluster] {m}", err=True))
    except ClusterRefused as e:
        raise click.UsageError(str(e)) from None
    except ClusterError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    click.echo(
        f"cluster {c.name} is up: {len(c.hosts)} hosts ({c.hosts[0].address} to {c.hosts[-1].address}, {c.cores} "
        f"cores, {c.memory} each), this host at {c.driver_address}; state and logs in {c.state_dir}"
    )
    _echo_usage(c)


def _echo_usage(c: Cluster) -> None:
    """The options of a run on `c`, and an example (its output on the shared tier too: every
    host must reach where a sink writes)."""
    from nosync import storage

    remote = shlex.quote(c.remote)
    output = shlex.quote(storage.join(c.remote, "output", "tour"))
    click.echo(f"--master {c.master}")
    click.echo(f"--remote {remote}")
    click.echo(
        f"e.g. nosync run experiments/workloads/keyed_count.py --mode nosync --workers {len(c.hosts)} "
        f"--checkpoint-tier remote --master {c.master} --remote {remote} -p output={output}"
    )
    click.echo(f"or    nosync chaos ... --cluster {c.name}")


@cluster_cmd.command("down")
@_name_option()
def down_cmd(name: str) -> None:
    """Stop every process of the cluster and remove its namespaces, links and state.

    Idempotent: finishes after an `up` that failed half-way or a state file that is gone."""
    from experiments.cluster import ClusterError, ClusterRefused, down

    try:
        removed = down(name)
    except ClusterRefused as e:
        raise click.UsageError(str(e)) from None
    except ClusterError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    if removed:
        click.echo(f"cluster {name} is down: removed {', '.join(removed)}")
    else:
        click.echo(f"no cluster {name} here: nothing to remove")


@cluster_cmd.command("status")
@_name_option()
def status_cmd(name: str) -> None:
    """Show the cluster's hosts, the workers the master counts alive, the S3 server.

    Exit code 1 when no cluster of that name is up."""
    from experiments.cluster import ClusterRefused, load

    try:
        c = load(name)
    except ClusterRefused as e:
        raise click.UsageError(str(e)) from None
    if c is None:
        click.echo(f"no cluster {name} is up (`nosync cluster up --name {name}` starts one)", err=True)
        sys.exit(1)
    s = c.status()
    root = os.geteuid() == 0
    click.echo(f"cluster {c.name}: state and logs in {c.state_dir}")
    rows = [("host", "address", "worker")]
    for h in s.hosts:
        if not root:
            worker = "unknown (only root sees a namespace's processes)"
        elif h.worker_pid is None:
            worker = "not running"
        else:
            worker = f"running (pid {h.worker_pid}){'' if h.alive else ', not alive at the master'}"
        rows.append((h.host.name, h.host.address, worker))
    w0, w1 = (max(len(r[i]) for r in rows) for i in (0, 1))
    click.echo("\n".join(f"  {a:<{w0}}  {b:<{w1}}  {w}" for a, b, w in rows))
    alive = "not answering" if s.alive_workers is None else f"{s.alive_workers} of {len(c.hosts)} workers alive"
    click.echo(f"master {c.master_host.name} ({c.master_host.address}): {alive}")
    click.echo(f"S3 on {c.driver_address}: {'reachable' if s.s3_reachable else 'NOT reachable'}")
    _echo_usage(c)
