"""Parsing shared by the commands."""

from __future__ import annotations

import click


def parse_params(items: tuple[str, ...]) -> dict[str, str]:
    """`-p key=value` options as a dict; a malformed one is a usage error naming it."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"'{item}' is not KEY=VALUE", param_hint="-p")
        out[key] = value
    return out
