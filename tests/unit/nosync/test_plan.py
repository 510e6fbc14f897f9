"""The physical plan: which edges exchange records by key, and which worker reads which source
partition (partition i on worker i % W)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import nosync as ns
from nosync.api.plan import plan


def gen(records: int = 10, partitions: int | None = None) -> ns.sources.Generator:
    return ns.sources.Generator(records=records, fn=lambda i: i, partitions=partitions)


def edge_kinds(p: ns.Pipeline, workers: int = 2) -> dict[tuple[str, str], bool]:
    """(upstream name, downstream name) -> exchange?"""
    names = {n.id: n.name for n in p.nodes}
    pp = plan(p, workers)
    out = {(names[e.src], names[e.dst]): e.exchange for e in pp.edges}
    assert len(out) == len(pp.edges), "two edges between the same operators"
    return out


def test_exchange_exactly_after_key_by_into_each_keyed_operator():
    p = ns.Pipeline("p")
    k = p.source(gen(), name="src").map(abs, name="m").key_by(lambda x: x % 3, name="kb")
    k.reduce(max, name="red").sink(ns.sinks.Console(), name="s1")
    k.aggregate(int, lambda a, v: a + v, name="agg").sink(ns.sinks.Console(), name="s2")
    k.stateful_map(lambda st, v: (st, [v]), name="sm").sink(ns.sinks.Console(), name="s3")
    k.window(5.0, float, int, lambda a, _: a + 1, name="win").sink(ns.sinks.Console(), name="s4")
    k.map(lambda kv: kv, name="after_kb").sink(ns.sinks.Console(), name="s5")
    assert edge_kinds(p) == {
        ("src", "m"): False,
        ("m", "kb"): False,
        ("kb", "red"): True,
        ("kb", "agg"): True,
        ("kb", "sm"): True,
        ("kb", "win"): True,
        ("kb", "after_kb"): False,  # a map after key_by is not keyed: forward
        ("red", "s1"): False,
        ("agg", "s2"): False,
        ("sm", "s3"): False,
        ("win", "s4"): False,
        ("after_kb", "s5"): False,
    }


def test_reduce_after_reduce_is_forward():
    p = ns.Pipeline("p")
    k = p.source(gen(), name="src").key_by(str, name="kb")
    k.reduce(max, name="r1").reduce(min, name="r2").window(
        1.0, lambda kv: float(kv[1]), int, lambda a, _: a + 1, name="w"
    ).sink(ns.sinks.Console(), name="out")
    assert edge_kinds(p) == {
        ("src", "kb"): False,
        ("kb", "r1"): True,
        ("r1", "r2"): False,
        ("r2", "w"): False,
        ("w", "out"): False,
    }


def test_join_inputs_exchange_only_when_they_come_from_key_by():
    p = ns.Pipeline("p")
    left = p.source(gen(), name="a").key_by(str, name="ka").reduce(max, name="ra")
    right = p.source(gen(), name="b").key_by(str, name="kb")
    left.join(right, name="j").sink(ns.sinks.Console(), name="out")
    assert edge_kinds(p) == {
        ("a", "ka"): False,
        ("ka", "ra"): True,
        ("ra", "j"): False,  # already partitioned by key: forward
        ("b", "kb"): False,
        ("kb", "j"): True,
        ("j", "out"): False,
    }


def test_join_of_two_key_bys_exchanges_both():
    p = ns.Pipeline("p")
    left = p.source(gen(), name="a").key_by(str, name="ka")
    right = p.source(gen(), name="b").key_by(str, name="kb")
    left.join(right, name="j").sink(ns.sinks.Console(), name="out")
    kinds = edge_kinds(p)
    assert kinds[("ka", "j")] and kinds[("kb", "j")]
    assert [k for k, x in kinds.items() if x] == [("ka", "j"), ("kb", "j")]


def test_iterate_body_edges_are_forward_and_union_of_key_bys_is_forward():
    p = ns.Pipeline("p")
    s = p.source(gen(), name="src")
    looped = s.iterate(lambda b: b.map(lambda n: n // 2, name="half"), keep=lambda n: n > 1, name="it")
    a = looped.key_by(str, name="k1")
    b = s.key_by(str, name="k2")
    a.union(b, name="u").sink(ns.sinks.Console(), name="out")
    pp = plan(p, 3)
    assert not [e for e in pp.edges if e.exchange]
    assert pp.exchange_edges == []


def test_plan_validates_first():
    p = ns.Pipeline("p")
    p.source(gen()).map(abs)
    with pytest.raises(ns.PipelineError, match="no sink"):
        plan(p, 2)


def test_inputs_and_outputs_of():
    p = ns.Pipeline("p")
    left = p.source(gen(), name="a").key_by(str, name="ka")
    right = p.source(gen(), name="b").key_by(str, name="kb")
    left.join(right, name="j").sink(ns.sinks.Console(), name="out")
    pp = plan(p, 2)
    j = p.node("j").id
    assert sorted(e.src for e in pp.inputs_of(j)) == sorted([p.node("ka").id, p.node("kb").id])
    assert [e.dst for e in pp.outputs_of(j)] == [p.node("out").id]


# -- source partitions -----------------------------------------------------------------------


def assigned(pp, p: ns.Pipeline, source_name: str) -> list[list[dict]]:
    return pp.source_parts[p.node(source_name).id]


@pytest.mark.parametrize("parts, workers", [(1, 1), (1, 3), (5, 2), (6, 3), (7, 4), (2, 5)])
def test_generator_partitions_go_to_worker_i_mod_w(parts, workers):
    p = ns.Pipeline("p")
    p.source(gen(partitions=parts), name="g").sink(ns.sinks.Console())
    per = assigned(plan(p, workers), p, "g")
    assert len(per) == workers
    expected = [[{"p": i, "of": parts} for i in range(parts) if i % workers == w] for w in range(workers)]
    assert per == expected


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_generator_defaults_to_one_partition_per_worker(workers):
    p = ns.Pipeline("p")
    p.source(gen(), name="g").sink(ns.sinks.Console())
    per = assigned(plan(p, workers), p, "g")
    assert per == [[{"p": w, "of": workers}] for w in range(workers)]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_files_one_partition_per_file_in_name_order(tmp_path, workers):
    names = ["e.txt", "a.txt", "c.txt", "b.txt", "d.txt"]
    for n in names:
        (tmp_path / n).write_text("x\n")
    (tmp_path / "skip.csv").write_text("a\n1\n")
    p = ns.Pipeline("p")
    p.source(ns.sources.Files(str(tmp_path / "*.txt")), name="f").sink(ns.sinks.Console())
    per = assigned(plan(p, workers), p, "f")
    files = [str(tmp_path / n) for n in sorted(names)]
    assert per == [[{"file": f} for i, f in enumerate(files) if i % workers == w] for w in range(workers)]


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_parquet_one_partition_per_row_group(tmp_path, workers):
    # a.parquet: 10 rows in groups of 4 -> 3 row groups; b.parquet: 3 rows in one group
    pq.write_table(pa.table({"x": list(range(10))}), tmp_path / "a.parquet", row_group_size=4)
    pq.write_table(pa.table({"x": [7, 8, 9]}), tmp_path / "b.parquet", row_group_size=4)
    p = ns.Pipeline("p")
    p.source(ns.sources.Files(str(tmp_path / "*.parquet")), name="f").sink(ns.sinks.Console())
    per = assigned(plan(p, workers), p, "f")
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    all_parts = [(a, 0), (a, 1), (a, 2), (b, 0)]
    expected = [
        [{"file": f, "row_group": g} for i, (f, g) in enumerate(all_parts) if i % workers == w] for w in range(workers)
    ]
    assert per == expected


def test_no_matching_files_is_a_pipeline_error(tmp_path):
    p = ns.Pipeline("p")
    p.source(ns.sources.Files(str(tmp_path / "*.jsonl")), name="f").sink(ns.sinks.Console())
    with pytest.raises(ns.PipelineError, match="no input files match"):
        plan(p, 2)
