"""Exact restart positions of a source operator (nosync/runtime/operators.py SourceOp, nosync/api/sources.py).

A SourceOp is built from a real pipeline's source node and driven poll by poll with a stand-in
for the worker (no Spark, no sockets). Its `snapshot_meta()`, taken between any two polls and
stored as a checkpoint file stores it (msgpack), must let a fresh SourceOp emit exactly the
rest of the stream: every record after the snapshot once, with the epoch it had the first time.

Expected emissions are written out from the input files: the k-th record of a partition is its
k-th input record, emitted in epoch k // epoch_records (epochs are cut by record count per
partition; `epoch_ms` is 0). The end-of-epoch markers after the snapshot must repeat too.
"""

from __future__ import annotations

import json
import types

import msgpack
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import nosync as ns
from nosync.runtime.operators import EOS
from nosync.runtime.source_op import SourceOp

SETTINGS = settings(
    deadline=None,
    max_examples=30,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# a line or field long enough that a few of them fill a text chunk (>= 64 KiB) or a CSV block
# (1 MiB), so that partitions are read in several chunks and offsets are not all None
LONG_TEXT = 40_000
LONG_CSV = 400_000


class StandInWorker:
    """What a SourceOp uses of its worker."""

    def __init__(self, batch_size: int, epoch_records: int) -> None:
        self.batch_size = batch_size
        self.epoch_records = epoch_records
        self.epoch_ms = 0
        self.slow_s = 0.0
        self.clock = types.SimpleNamespace(ts=0.0)
        self.first_read_at = None
        self.dead: list = []

    def dead_letter(self, op_name: str, bad) -> None:
        self.dead.append((op_name, bad))


class Emissions:
    """What a SourceOp sends downstream: `records` is (record, epoch) in emission order; `log`
    is the same interleaved with the end-of-epoch markers, ("marker", epoch, eos)."""

    def __init__(self) -> None:
        self.records: list = []
        self.log: list = []

    def push(self, records: list, epoch: int, chan) -> None:
        assert chan == "chan"
        self.records.extend((r, epoch) for r in records)
        self.log.extend(("record", r, epoch) for r in records)

    def marker(self, chan, epoch: int, wm, eos: bool) -> None:
        self.log.append(("marker", epoch, eos))


def source_op(src, worker: StandInWorker) -> tuple[SourceOp, Emissions]:
    """A SourceOp over every partition of `src`, and what it emits."""
    p = ns.Pipeline("t")
    s = p.source(src)
    s.sink(ns.sinks.Null())
    assert s.node.params["source"] is src
    op = SourceOp(s.node, src.partitions(1), worker)
    got = Emissions()
    op.connect(got.push, got.marker, "chan")
    return op, got


def stored(meta: dict) -> dict:
    """`meta` as it comes back from a checkpoint file (nosync/state/checkpoints.py's msgpack options)."""
    return msgpack.unpackb(msgpack.packb(meta, use_bin_type=True), raw=False, use_list=False, strict_map_key=False)


# -- inputs: each kind writes its files and says, per partition, the records it holds ---------------


def pad(n: int, long: bool, size: int) -> str:
    return "x" * (size if long else n)


def longs(draw, n: int) -> list[bool]:
    """Which of n records carry a long pad: none, or a few."""
    if not draw(st.booleans()):
        return [False] * n
    return [draw(st.integers(0, 9)) == 0 for _ in range(n)]


@st.composite
def text_input(draw, directory):
    files = draw(st.integers(1, 3))
    parts = []
    for f in range(files):
        n = draw(st.integers(0, 40))
        long = longs(draw, n)
        lines = [f"{f}:{i}:" + pad(i % 5, long[i], LONG_TEXT) for i in range(n)]
        path = directory / f"in{f}.txt"
        path.write_text("".join(line + "\n" for line in lines))
        parts.append(lines)
    return ns.sources.Files(str(directory / "in*.txt")), parts


@st.composite
def jsonl_input(draw, directory):
    files = draw(st.integers(1, 3))
    parts = []
    for f in range(files):
        n = draw(st.integers(0, 40))
        long = longs(draw, n)
        recs = [{"f": f, "i": i, "pad": pad(i % 3, long[i], LONG_TEXT)} for i in range(n)]
        (directory / f"in{f}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        parts.append(recs)
    return ns.sources.Files(str(directory / "in*.jsonl")), parts


@st.composite
def csv_input(draw, directory):
    files = draw(st.integers(1, 2))
    parts = []
    for f in range(files):
        n = draw(st.integers(0, 30))
        long = longs(draw, n)
        # "p" + pad: never empty, so that the first block types the column as text
        recs = [{"f": f, "i": i, "pad": "p" + pad(i % 4, long[i], LONG_CSV)} for i in range(n)]
        lines = ["f,i,pad"] + [f"{r['f']},{r['i']},{r['pad']}" for r in recs]
        (directory / f"in{f}.csv").write_text("\n".join(lines) + "\n")
        parts.append(recs)
    return ns.sources.Files(str(directory / "in*.csv")), parts


@st.composite
def parquet_input(draw, directory):
    n = draw(st.integers(1, 60))
    group = draw(st.integers(1, 12))
    recs = [{"g": i // group, "i": i, "s": f"s{i}"} for i in range(n)]
    pq.write_table(pa.Table.from_pylist(recs), directory / "in.parquet", row_group_size=group)
    parts = [recs[k : k + group] for k in range(0, n, group)]  # one partition per row group
    return ns.sources.Files(str(directory / "in.parquet")), parts


@st.composite
def generator_input(draw, directory):
    n = draw(st.integers(0, 80))
    of = draw(st.integers(1, 3))
    src = ns.sources.Generator(records=n, fn=lambda i: [i, f"r{i}"], partitions=of)
    return src, [[[i, f"r{i}"] for i in range(p, n, of)] for p in range(of)]


INPUTS = {
    "text": text_input,
    "jsonl": jsonl_input,
    "csv": csv_input,
    "parquet": parquet_input,
    "generator": generator_input,
}


def partition_of(kind: str, rec, partitions: int) -> int:
    """The partition an emitted record came from (each input record names its own)."""
    if kind == "text":
        return int(rec.split(":", 1)[0])
    if kind in ("jsonl", "csv"):
        return rec["f"]
    if kind == "parquet":
        return rec["g"]
    return rec[0] % partitions  # generator: record i is in partition i % partitions


def by_partition(kind: str, emitted: list, partitions: int) -> list[list]:
    """The (record, epoch) pairs of `emitted`, split by partition, in emission order."""
    out: list[list] = [[] for _ in range(partitions)]
    for rec, epoch in emitted:
        out[partition_of(kind, rec, partitions)].append((rec, epoch))
    return out


# -- the property --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(INPUTS))
@SETTINGS
@given(data=st.data(), batch_size=st.integers(1, 7), epoch_records=st.integers(1, 9))
def test_a_restored_source_emits_exactly_the_rest(tmp_path_factory, kind, data, batch_size, epoch_records):
    directory = tmp_path_factory.mktemp(kind)
    src, parts = data.draw(INPUTS[kind](directory), label="input")

    worker = StandInWorker(batch_size, epoch_records)
    op, got = source_op(src, worker)
    # a snapshot between every two polls (and before the first): (emissions so far, meta)
    snapshots = [(0, stored(op.snapshot_meta()))]
    while op.poll():
        snapshots.append((len(got.log), stored(op.snapshot_meta())))
    snapshots.append((len(got.log), stored(op.snapshot_meta())))
    assert not op.poll()
    assert worker.dead == []

    # the uninterrupted run: every record of every partition, in order, in its epoch
    expected = [[(rec, k // epoch_records) for k, rec in enumerate(recs)] for recs in parts]
    assert by_partition(kind, got.records, len(parts)) == expected
    assert len(got.records) == sum(len(recs) for recs in parts)
    assert got.log[-1] == ("marker", EOS, True)

    at = data.draw(st.integers(0, len(snapshots) - 1), label="snapshot after poll")
    emitted_before, meta = snapshots[at]
    positions = meta["parts"]
    event(f"restart inside a chunk: {any(skip for _, skip, _, _ in positions)}")
    event(f"restart past a first chunk: {any(offset is not None for offset, _, _, _ in positions)}")
    event(f"restart in a later epoch: {meta['epoch'] > 0}")
    again = StandInWorker(batch_size, epoch_records)
    restored, rest = source_op(src, again)
    restored.restore_meta(meta)
    while restored.poll():
        pass
    # records and end-of-epoch markers: exactly what followed the snapshot
    assert rest.log == got.log[emitted_before:]
    assert restored.finished
    assert restored.records_in == len(got.records)
    assert again.dead == []


# -- bad records and restarts ---------------------------------------------------------------------


def read_until(op: SourceOp, got: Emissions, emitted: int) -> None:
    """Polls until at least `emitted` records went out."""
    while len(got.records) < emitted:
        assert op.poll()


def read_to_end(op: SourceOp) -> None:
    while op.poll():
        pass


def test_csv_bad_row_of_an_earlier_chunk_is_not_reported_again(tmp_path):
    path = tmp_path / "in.csv"
    good = [{"n": i, "pad": "p" + "x" * LONG_CSV} for i in range(8)]  # ~3 MiB: several 1 MiB chunks
    lines = ["n,pad", f"0,{good[0]['pad']}", "bad row,with,three columns"]
    lines += [f"{r['n']},{r['pad']}" for r in good[1:]]
    path.write_text("\n".join(lines) + "\n")
    src = ns.sources.Files(str(path))

    worker = StandInWorker(batch_size=1, epoch_records=100)
    op, got = source_op(src, worker)
    while op.snapshot_meta()["parts"][0][0] is None:  # into the second chunk
        assert op.poll()
    meta = stored(op.snapshot_meta())
    cut = len(got.records)
    assert 2 <= cut < len(good)
    read_to_end(op)
    assert [r for r, _ in got.records] == good
    assert [(name, bad.position["row"]) for name, bad in worker.dead] == [(op.name, 3)]  # header: line 1

    again = StandInWorker(batch_size=1, epoch_records=100)
    restored, rest = source_op(src, again)
    restored.restore_meta(meta)
    read_to_end(restored)
    assert [r for r, _ in rest.records] == good[cut:]
    assert again.dead == []


def test_csv_bad_row_before_the_restart_position_is_reported_once(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("a,b\n1,2\nbad\n3,4\n5,6\n7,8\n")
    expected = [{"a": 1, "b": 2}, {"a": 3, "b": 4}, {"a": 5, "b": 6}, {"a": 7, "b": 8}]
    src = ns.sources.Files(str(path))

    worker = StandInWorker(batch_size=1, epoch_records=100)
    op, got = source_op(src, worker)
    read_until(op, got, 3)  # the restart position is after {"a": 5}: the bad row (line 3) is behind it
    meta = stored(op.snapshot_meta())
    read_to_end(op)
    assert [r for r, _ in got.records] == expected
    assert [(bad.position["row"], bad.position["raw"]) for _, bad in worker.dead] == [(3, "bad")]

    restored, rest = source_op(src, worker)  # the same dead-letter file
    restored.restore_meta(meta)
    read_to_end(restored)
    assert [r for r, _ in rest.records] == expected[3:]
    assert [(bad.position["row"], bad.position["raw"]) for _, bad in worker.dead] == [(3, "bad")]


def test_jsonl_bad_line_before_the_restart_position_is_reported_once(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"i": 1}\nnot json\n{"i": 2}\n{"i": 3}\n')
    src = ns.sources.Files(str(path))

    worker = StandInWorker(batch_size=1, epoch_records=100)
    op, got = source_op(src, worker)
    read_until(op, got, 2)  # after {"i": 2}: the bad line (byte 9) is behind the restart position
    meta = stored(op.snapshot_meta())
    read_to_end(op)
    assert [r for r, _ in got.records] == [{"i": 1}, {"i": 2}, {"i": 3}]
    assert [bad.position["byte"] for _, bad in worker.dead] == [9]

    restored, rest = source_op(src, worker)
    restored.restore_meta(meta)
    read_to_end(restored)
    assert [r for r, _ in rest.records] == [{"i": 3}]
    assert [bad.position["byte"] for _, bad in worker.dead] == [9]
