"""Test pipeline with a loop: v = i + 1 for record i goes round `iterate`, halved each time,
once and then until it is 1 or less; the number of rounds it took (max(1, v.bit_length() - 1))
and v % 50 make the key of a running count. Output records: [[rounds, v % 50], count so far].
Parameters: records, output."""

import nosync as ns


def build(args):
    p = ns.Pipeline("halving_loop")
    nums = p.source(ns.sources.Generator(records=int(args.get("records", 600_000)), fn=lambda i: i + 1))
    start = nums.map(lambda v: (v, v, 0))
    done = start.iterate(lambda s: s.map(lambda t: (t[0], t[1] // 2, t[2] + 1)), keep=lambda t: t[1] > 1, name="halve")
    counts = done.key_by(lambda t: (t[2], t[0] % 50)).aggregate(int, lambda n, _: n + 1)
    counts.sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
