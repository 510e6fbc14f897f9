"""The `nosync` command group."""

from __future__ import annotations

import click

from cli.batch import batch_cmd
from cli.bench import bench
from cli.chaos import chaos_cmd
from cli.cluster import cluster_cmd
from cli.demo import demo_cmd, lsm_demo
from cli.diff import diff_cmd
from cli.experiment import experiment_cmd
from cli.inspect import inspect_cmd
from cli.rewind import rewind_cmd
from cli.run import run_cmd
from cli.state import state_cmd
from cli.stop import stop_cmd


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """nosync: fault tolerance you can choose, crash, recover, measure and rewind."""


main.add_command(batch_cmd)
main.add_command(bench)
main.add_command(chaos_cmd)
main.add_command(cluster_cmd)
main.add_command(demo_cmd)
main.add_command(lsm_demo)
main.add_command(diff_cmd)
main.add_command(experiment_cmd)
main.add_command(inspect_cmd)
main.add_command(rewind_cmd)
main.add_command(run_cmd)
main.add_command(state_cmd)
main.add_command(stop_cmd)

if __name__ == "__main__":
    main()
