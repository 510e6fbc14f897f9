"""The reachability workload without Spark: its generator draws the same graph from the same
parameters and record i whatever the partitioning, the graph's degrees follow the power law the
docstring promises, the reference finds what a hand-worked example says, and the vertex step
commits each reachable vertex once whatever the order in which records meet."""

from __future__ import annotations

import collections
import math
import random

import msgpack
import pytest

import nosync as ns
from experiments.workloads import reachability as reach


def read_all(source: ns.sources.Generator, workers: int, chunk: int) -> dict[int, list]:
    """Record index -> record, read from every partition of `source` (partition p of n holds
    records p, p + n, ...)."""
    got = {}
    for part in source.partitions(workers):
        i = part["p"]
        for recs, _ in source.read(part, 0, chunk):
            for r in recs:
                got[i] = r
                i += part["of"]
    return got


def test_the_same_parameters_draw_the_same_graph():
    args = {"vertices": "2000", "degree": "3", "roots": "5", "seed": "4"}
    assert reach.graph(args) == reach.graph(dict(args))
    assert reach.graph(args) != reach.graph({**args, "seed": "5"})


@pytest.mark.parametrize("partitions", [1, 2, 3, 7])
def test_record_i_is_the_same_whatever_the_partitioning(partitions):
    """Each worker draws the graph itself and reads its own partitions; any reader, from any
    position, must see the same record i."""
    args = {"vertices": "1500", "roots": "4"}
    g = reach.graph(args)
    n = len(g.roots) + len(g.src)
    expected = [reach.records(g)(i) for i in range(n)]
    source = ns.sources.Generator(records=n, fn=reach.records(reach.graph(args)), partitions=partitions)
    assert read_all(source, 1, 97) == dict(enumerate(expected))
    last = source.partitions()[-1]
    resumed = [r for recs, _ in source.read(last, 5, 13) for r in recs]
    assert resumed == expected[last["p"] + 5 * partitions :: partitions]


def test_records_are_roots_then_edges_of_plain_msgpack_values():
    g = reach.graph({"vertices": "500", "roots": "3"})
    rec = reach.records(g)
    assert [rec(i) for i in range(3)] == [["r", v] for v in g.roots]
    assert rec(3) == ["e", g.src[0], g.dst[0]]
    for i in (0, 3, len(g.src) + 2):
        r = rec(i)
        assert all(type(x) in (str, int) for x in r)
        assert msgpack.unpackb(msgpack.packb(r)) == r


def test_about_vertices_times_degree_edges_over_the_vertices():
    n = 10_000
    for degree, edges in (("4", 40_000), ("2.5", 25_000), ("0", 0)):
        g = reach.graph({"vertices": str(n), "degree": degree, "roots": "10"})
        assert len(g.src) == len(g.dst) == edges
        assert all(0 <= v < n for v in g.src + g.dst)
    assert len(set(g.roots)) == 10 and all(0 <= v < n for v in g.roots)
    with pytest.raises(ValueError, match="roots"):
        reach.graph({"vertices": "5", "roots": "6"})


@pytest.mark.parametrize("end", ["src", "dst"])
def test_degrees_follow_the_power_law(end):
    """Vertex of rank k draws an endpoint with weight k^(-2/3): degrees ~ d^-2.5, so the count of
    vertices of degree >= d falls as d^-1.5 (measured at seeds 1, 2, 3, 7: 1.52 to 1.58) and the
    largest degree is about 400,000 / sum(k^(-2/3)) ~ 2,900, 730x the mean (measured 2,808 to
    2,937). Uniform endpoints (Poisson degrees) would give a largest degree ~ 16, no vertex of
    degree >= 40 and 2.6% of the edges at the top 1% of the vertices (measured here: 20%)."""
    n = 100_000
    g = reach.graph({"vertices": str(n), "degree": "4"})
    per_vertex = collections.Counter(getattr(g, end))
    degrees = sorted((per_vertex[v] for v in range(n)), reverse=True)
    mean = sum(degrees) / n
    assert mean == 4.0
    assert degrees[0] >= 250 * mean
    assert sum(degrees[: n // 100]) >= 0.15 * sum(degrees)
    at_least = {d: sum(1 for x in degrees if x >= d) for d in (16, 160)}
    slope = math.log(at_least[16] / at_least[160]) / math.log(10)
    assert 1.2 <= slope <= 1.8, (at_least, slope)


def test_reference_on_a_hand_written_graph():
    # 0 -> 1 -> 2 -> 0 (a cycle) -> 3 (with a self-loop); 7 a root with only a self-loop;
    # 5 -> 1 and 4 -> 5 lead in from vertices no root reaches; 6 -> 4; 8 has no edge
    edges = [(0, 1), (1, 2), (2, 0), (2, 3), (3, 3), (1, 2), (5, 1), (4, 5), (6, 4), (7, 7)]
    g = reach.Graph([0, 7], [u for u, _ in edges], [v for _, v in edges])
    assert reach.reference({}, g) == {0, 1, 2, 3, 7}
    assert reach.reference({}, g._replace(roots=[6])) == {6, 4, 5, 1, 2, 0, 3}
    assert reach.reference({}, g._replace(roots=[])) == set()


def test_reference_reads_the_generated_graph():
    args = {"vertices": "3000"}
    got = reach.reference(args)
    assert got == reach.reference({}, reach.graph(args))
    assert set(reach.graph(args).roots) <= got and 0.5 * 3000 < len(got) < 3000


def loop_in_random_order(g: reach.Graph, seed: int) -> collections.Counter:
    """What the loop emits when its records meet the vertex step in a random order: records and
    states go through msgpack, as they do between workers and into the state store."""
    rng = random.Random(seed)
    rec = reach.records(g)
    pending = [rec(i) for i in range(len(g.roots) + len(g.src))]
    states: dict = {}
    out: collections.Counter = collections.Counter()
    while pending:
        j = rng.randrange(len(pending))
        pending[j], pending[-1] = pending[-1], pending[j]
        r = msgpack.unpackb(msgpack.packb(pending.pop()))
        state, emitted = reach.visit(states.get(r[1]), r)
        states[r[1]] = msgpack.unpackb(msgpack.packb(state))
        for e in emitted:
            if e[0] == "out":
                out[e[1]] += 1
            else:
                pending.append(e)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_vertex_step_emits_each_reachable_vertex_once_in_any_order(seed):
    g = reach.graph({"vertices": "3000", "seed": str(seed)})
    expected = reach.reference({}, g)
    for order in range(3):
        got = loop_in_random_order(g, order)
        assert set(got) == expected, f"graph seed {seed}, order seed {order}"
        assert set(got.values()) == {1}, f"graph seed {seed}, order seed {order}"
