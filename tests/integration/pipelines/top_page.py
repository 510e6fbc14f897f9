"""Test pipeline: JSONL page views {"user": u, "page": p} -> a running count per (user, page) in a
LevelDB sink (`<output>/counts`), then, keyed by user, each user's top page (highest count, ties to
the smallest page name) in a second LevelDB sink (`<output>/top`). Parameters: input, output."""

from __future__ import annotations

from typing import Any

import nosync as ns


def top_page(state: dict[str, int] | None, value: Any) -> tuple[dict[str, int], list]:
    """State: page -> latest count of this user. Emits (user, (page, count)) when the top changes."""
    (user, page), count = value
    counts = dict(state or {})
    before = min(counts.items(), key=lambda pc: (-pc[1], pc[0])) if counts else None
    counts[page] = count
    after = min(counts.items(), key=lambda pc: (-pc[1], pc[0]))
    return counts, ([] if after == before else [(user, after)])


def build(args: dict[str, str]) -> ns.Pipeline:
    p = ns.Pipeline("top_page")
    views = p.source(ns.sources.Files(args["input"], format="jsonl"))
    counts = views.key_by(lambda e: (e["user"], e["page"])).aggregate(int, lambda n, _: n + 1)
    counts.sink(ns.sinks.LevelDB(args["output"] + "/counts"))
    top = counts.key_by(lambda kv: kv[0][0]).stateful_map(top_page)
    top.sink(ns.sinks.LevelDB(args["output"] + "/top"))
    return p
