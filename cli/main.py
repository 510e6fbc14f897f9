"""The `nosync` command group."""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """nosync: fault tolerance you can choose, crash, recover, measure and rewind."""


if __name__ == "__main__":
    main()
