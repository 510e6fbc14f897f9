"""A keyed state holding a datetime.date, which the state codec cannot save: modes that save
state refuse it at their first snapshot, and mode replay, which saves state only when it
recovers, refuses it as it runs. Parameters: records, output."""

import datetime

import nosync as ns


def build(args):
    p = ns.Pipeline("dated_state")
    src = p.source(ns.sources.Generator(records=int(args.get("records", 20_000)), fn=lambda i: i), name="src")
    src.key_by(lambda i: i % 50).aggregate(
        lambda: None, lambda _, i: datetime.date(2026, 1, 1 + i % 28), name="last_day"
    ).map(lambda kv: [kv[0], str(kv[1])]).sink(ns.sinks.Files(args["output"], format="jsonl"), name="out")
    return p
