"""Test pipeline: tcp_count (tcp_count.py) with a changed aggregate, which counts every line
twice. The same graph and names, for `nosync rewind --pipeline`."""

import nosync as ns


def build(args):
    p = ns.Pipeline("tcp_count")
    lines = p.source(ns.sources.TcpLines("127.0.0.1", int(args["port"])))
    counts = lines.key_by(lambda line: str(int(line) % 50)).aggregate(int, lambda n, _: n + 2)
    counts.sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
