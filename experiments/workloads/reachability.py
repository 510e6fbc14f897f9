"""reachability: the vertices reachable from a few roots of a generated directed graph with
power-law degrees, computed by a feedback loop whose body is keyed by vertex.

    nosync run experiments/workloads/reachability.py -p vertices=10000 -p output=out/

    edges -> iterate(key_by(vertex) -> stateful_map "vertex", name="reach") -> vertex id -> sink

The input is one generator of `roots` + `edges` records: record i < roots is ["r", v] (root v),
record roots + j is ["e", u, v] (edge j, from u to v). Every record goes to the key of the vertex
it concerns (r[1]), whose state is [reached, neighbors]. An edge appends v to u's neighbors or,
if u is already reached, sends ["r", v] round the loop; a reach of a vertex not yet reached marks
it reached, emits ["out", v] (which leaves the loop) and sends ["r", n] round for each neighbor n
known so far; a reach of a vertex already reached emits nothing. Whatever the order in which
edges and reaches meet, a vertex is reached iff a path leads to it from a root, and it is
emitted once: the committed output is the same multiset in every run.

The graph is Chung-Lu-like: both endpoints of every edge are drawn independently, vertex of rank
k (1-based) with weight k^(-2/3), so in- and out-degrees follow a power law of exponent 2.5; the
ranks are two independent random permutations of the vertices, so in-hubs, out-hubs and vertex
ids are unrelated. About vertices * degree edges, duplicates and self-loops kept. The roots are
distinct vertices drawn uniformly. The whole graph is drawn once, in build() (numpy, ~0.15 s at
100,000 vertices), from `seed` alone: every worker draws the same graph, so record i is the same
whichever worker reads it and however often.

Parameters: vertices (default 100,000), degree (average out-degree, 4), roots (number of root
vertices, 10), seed (1), output (a directory of committed JSONL files; default
./reachability-out; `nosync chaos` sets <run dir>/output), partitions (of the generator; default
one per worker). Each output record is a reachable vertex id (a JSON int), each exactly once.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

import nosync as ns

EXPONENT = 2.5
"""The power law of the degrees: P(degree = d) ~ d^-EXPONENT (rank weights k^(-1 / (EXPONENT - 1)))."""


class Graph(NamedTuple):
    """A directed graph as the generator emits it: the roots, and edge j from src[j] to dst[j]
    (plain Python ints, vertices 0..vertices-1)."""

    roots: list[int]
    src: list[int]
    dst: list[int]


def graph(args: dict) -> Graph:
    """The graph of the parameters `vertices`, `degree`, `roots` and `seed` (see the module
    docstring): a pure function of them."""
    n = int(args.get("vertices", 100_000))
    degree = float(args.get("degree", 4))
    n_roots = int(args.get("roots", 10))
    seed = int(args.get("seed", 1))
    if n < 1 or degree < 0 or not 0 <= n_roots <= n:
        raise ValueError(f"need vertices >= 1, degree >= 0 and 0 <= roots <= vertices; got {n}, {degree}, {n_roots}")
    n_edges = round(n * degree)
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, n + 1, dtype=np.float64) ** (-1.0 / (EXPONENT - 1)))
    cdf /= cdf[-1]
    by_out_rank = rng.permutation(n)
    by_in_rank = rng.permutation(n)
    # inverse-CDF draws of ranks: u in [0, 1) and cdf[-1] == 1.0, so the rank is < n
    src = by_out_rank[np.searchsorted(cdf, rng.random(n_edges), side="right")]
    dst = by_in_rank[np.searchsorted(cdf, rng.random(n_edges), side="right")]
    roots = rng.choice(n, size=n_roots, replace=False)
    return Graph(roots.tolist(), src.tolist(), dst.tolist())


def records(g: Graph) -> Callable[[int], list]:
    """Record i of the generator over `g`: ["r", root i] for i < len(roots), else
    ["e", u, v] for edge i - len(roots)."""
    roots, src, dst = g.roots, g.src, g.dst
    first_edge = len(roots)

    def record(i: int) -> list:
        if i < first_edge:
            return ["r", roots[i]]
        j = i - first_edge
        return ["e", src[j], dst[j]]

    return record


def visit(state: list | None, rec: list) -> tuple[list, Iterable[list]]:
    """A vertex's step: `state` is [reached, neighbors] (None before its first record), `rec`
    an edge ["e", u, v] out of it or a reach ["r", v] of it. Returns the new state and the
    records to emit: reaches ["r", n] to go round the loop, and ["out", v] once, when v is
    first reached.

    >>> s, out = visit(None, ["e", 1, 2])
    >>> s, list(out)
    ([False, [2]], [])
    >>> s, out = visit(s, ["r", 1])
    >>> s, list(out)
    ([True, []], [['out', 1], ['r', 2]])
    >>> visit(s, ["r", 1])
    ([True, []], [])
    >>> visit(s, ["e", 1, 3])
    ([True, []], [['r', 3]])
    """
    if rec[0] == "e":
        v = rec[2]
        if state is None:
            return [False, [v]], []
        if state[0]:
            return state, [["r", v]]
        # the state is the operator's own: appended in place, not copied (a hub has thousands)
        state[1].append(v)
        return state, []
    if state is None:
        return [True, []], [["out", rec[1]]]
    if state[0]:
        return state, []
    # reached now: its neighbors are reached from it, and it needs them no more
    return [True, []], [["out", rec[1]], *(["r", n] for n in state[1])]


def build(args: dict) -> ns.Pipeline:
    """The reachability pipeline over graph(args), committing to args["output"]."""
    g = graph(args)
    parts = args.get("partitions")
    p = ns.Pipeline("reachability")
    src = p.source(
        ns.sources.Generator(
            records=len(g.roots) + len(g.src),
            fn=records(g),
            partitions=int(parts) if parts is not None else None,
        ),
        name="edges",
    )
    reached = src.iterate(
        lambda s: s.key_by(lambda r: r[1], name="by_vertex").stateful_map(visit, name="vertex"),
        keep=lambda r: r[0] != "out",
        name="reach",
    )
    vertices = reached.map(lambda r: r[1], name="vertex_id")
    vertices.sink(ns.sinks.Files(args.get("output", "reachability-out"), format="jsonl"), name="reached")
    return p


def reference(args: dict, g: Graph | None = None) -> set[int]:
    """The vertices reachable from the roots of `g` (default: graph(args)), by a breadth-first
    search in plain Python: what the pipeline must commit, each vertex once."""
    if g is None:
        g = graph(args)
    out: dict[int, list[int]] = collections.defaultdict(list)
    for u, v in zip(g.src, g.dst, strict=True):
        out[u].append(v)
    seen = set(g.roots)
    frontier = list(seen)
    while frontier:
        step = []
        for u in frontier:
            for v in out.get(u, ()):
                if v not in seen:
                    seen.add(v)
                    step.append(v)
        frontier = step
    return seen
