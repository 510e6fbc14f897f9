"""Test pipeline: integers from a TCP line source -> a running count per residue mod 50 ->
(residue, count) records. Parameters: port, output."""

import nosync as ns


def build(args):
    p = ns.Pipeline("tcp_count")
    lines = p.source(ns.sources.TcpLines("127.0.0.1", int(args["port"])))
    counts = lines.key_by(lambda line: str(int(line) % 50)).aggregate(int, lambda n, _: n + 1)
    counts.sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
