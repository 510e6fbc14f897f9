"""Test pipeline: integers from a TCP line source -> iterate the Collatz step until 1, counting
steps -> (n, steps) records. Parameters: port, output."""

import nosync as ns


def step(pair):
    n, x, steps = pair
    return (n, x // 2 if x % 2 == 0 else 3 * x + 1, steps + 1)


def build(args):
    p = ns.Pipeline("tcp_collatz")
    nums = p.source(ns.sources.TcpLines("127.0.0.1", int(args["port"])))
    start = nums.map(lambda line: (int(line), int(line), 0))
    done = start.iterate(lambda s: s.map(step), keep=lambda t: t[1] != 1, max_iterations=10_000)
    done.map(lambda t: [t[0], t[2]]).sink(ns.sinks.Files(args["output"], format="jsonl"))
    return p
