"""Sources read every record once, in partitions, and resume from the offsets they hand out;
malformed records go to `on_bad` with their file and position. Sinks show nothing before
commit and everything after."""

from __future__ import annotations

import collections
import datetime
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nosync as ns
from nosync.errors import BadRecord, PipelineError


def read_all(src, part, offset=None, chunk=100, on_bad=None):
    """Every chunk of one partition: [(records, next offset)]."""
    if on_bad is None:
        return list(src.read(part, offset, chunk))
    return list(src.read(part, offset, chunk, on_bad))


def records_of(chunks) -> list:
    return [r for recs, _ in chunks for r in recs]


# -- Generator -------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, print_blob=True)
@given(records=st.integers(0, 60), parts=st.integers(1, 7), chunk=st.integers(1, 9))
def test_generator_partitions_cover_every_record_once(records, parts, chunk):
    src = ns.sources.Generator(records=records, fn=lambda i: i, partitions=parts)
    got = [r for part in src.partitions() for r in records_of(read_all(src, part, 0, chunk))]
    assert sorted(got) == list(range(records))
    for part in src.partitions():
        recs = records_of(read_all(src, part, 0, chunk))
        assert all(r % parts == part["p"] for r in recs)
        assert recs == sorted(recs)


@pytest.mark.parametrize("workers", [1, 2, 3, 4])
def test_generator_default_keys(workers):
    src = ns.sources.Generator(records=50, keys=7)
    got = [r for part in src.partitions(workers) for r in records_of(read_all(src, part, 0, 8))]
    assert collections.Counter(got) == collections.Counter(str(i % 7) for i in range(50))


def test_generator_skewed_keys_do_not_depend_on_partitioning():
    src = ns.sources.Generator(records=400, keys=20, skew=1.2)
    one = [r for part in src.partitions(1) for r in records_of(read_all(src, part, 0, 64))]
    three = [r for part in src.partitions(3) for r in records_of(read_all(src, part, 0, 5))]
    assert collections.Counter(one) == collections.Counter(three)
    assert set(one) <= {str(k) for k in range(20)}
    counts = collections.Counter(one)
    assert counts["0"] > counts.get("19", 0)  # Zipf: the first key is the most frequent


@settings(max_examples=60, deadline=None, print_blob=True)
@given(records=st.integers(1, 60), parts=st.integers(1, 4), chunk=st.integers(1, 9), data=st.data())
def test_generator_resumes_from_any_offset_it_returned(records, parts, chunk, data):
    src = ns.sources.Generator(records=records, fn=lambda i: i * 10, partitions=parts)
    part = {"p": data.draw(st.integers(0, parts - 1)), "of": parts}
    chunks = read_all(src, part, 0, chunk)
    full = records_of(chunks)
    assert full == [i * 10 for i in range(part["p"], records, parts)]
    for k, (_, offset) in enumerate(chunks):
        assert records_of(read_all(src, part, offset, chunk)) == records_of(chunks[k + 1 :])
        assert offset == len(records_of(chunks[: k + 1]))  # offsets count records


# -- Files: text and JSONL -------------------------------------------------------------------


def test_text_files_every_line_and_resume(tmp_path):
    lines_a = [f"line {i:05d} " + "x" * (i % 13) for i in range(30_000)]  # several chunks
    lines_b = ["", "  spaced  ", "last without newline"]
    (tmp_path / "a.txt").write_text("\n".join(lines_a) + "\n")
    (tmp_path / "b.txt").write_text("\r\n".join(lines_b))
    src = ns.sources.Files(str(tmp_path / "*.txt"))
    parts = src.partitions()
    assert [p["file"] for p in parts] == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    chunks = read_all(src, parts[0])
    assert records_of(chunks) == lines_a
    assert len(chunks) > 2
    for k in (0, len(chunks) // 2, len(chunks) - 1):
        offset = chunks[k][1]
        consumed = len(records_of(chunks[: k + 1]))
        assert offset == sum(len(line) + 1 for line in lines_a[:consumed])  # a byte offset
        assert records_of(read_all(src, parts[0], offset)) == lines_a[consumed:]
    assert records_of(read_all(src, parts[1])) == lines_b


def test_jsonl_malformed_line_goes_to_on_bad_with_file_and_byte(tmp_path):
    good = [{"a": 1}, [1, 2], "s", None, {"nested": {"b": [True]}}]
    raw = [
        json.dumps(good[0]),
        json.dumps(good[1]),
        "{not json",
        "",
        json.dumps(good[2]),
        '{"a": 1',
        json.dumps(good[3]),
        json.dumps(good[4]),
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(raw) + "\n")
    src = ns.sources.Files(str(path))
    assert src.format == "jsonl"
    bad: list[BadRecord] = []
    got = records_of(read_all(src, src.partitions()[0], on_bad=bad.append))
    assert got == good
    starts = [sum(len(r) + 1 for r in raw[:i]) for i in range(len(raw))]
    assert [(b.source, b.position["byte"]) for b in bad] == [(str(path), starts[2]), (str(path), starts[5])]
    assert [b.position["raw"] for b in bad] == ["{not json", '{"a": 1']
    assert str(path) in str(bad[0])
    with pytest.raises(BadRecord):  # without a handler, the first bad line raises
        read_all(src, src.partitions()[0])


def test_jsonl_resume_after_a_bad_line(tmp_path):
    raw = [json.dumps({"i": i}) if i != 3 else "oops" for i in range(3000)]
    path = tmp_path / "in.ndjson"
    path.write_text("\n".join(raw) + "\n")
    src = ns.sources.Files(str(path))
    part = src.partitions()[0]
    bad: list[BadRecord] = []
    chunks = read_all(src, part, chunk=10, on_bad=bad.append)
    assert records_of(chunks) == [{"i": i} for i in range(3000) if i != 3]
    assert len(bad) == 1
    offset = chunks[0][1]
    resumed = records_of(read_all(src, part, offset, chunk=10, on_bad=bad.append))
    assert resumed == records_of(chunks[1:])
    assert len(bad) == 1  # the bad line was before the offset: not reported again


def test_undecodable_text_line(tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"ok\n\xff\xfe bad\nfine\n")
    src = ns.sources.Files(str(path))
    bad: list[BadRecord] = []
    assert records_of(read_all(src, src.partitions()[0], on_bad=bad.append)) == ["ok", "fine"]
    assert [b.position["byte"] for b in bad] == [3]


# -- Files: CSV ------------------------------------------------------------------------------


def test_csv_rows_as_dicts_and_a_bad_row_with_its_line(tmp_path):
    lines = ["name,n", "x,1", "y,2", "z,3,4", "w,5", "v"]
    path = tmp_path / "in.csv"
    path.write_text("\n".join(lines) + "\n")
    src = ns.sources.Files(str(path))
    bad: list[BadRecord] = []
    got = records_of(read_all(src, src.partitions()[0], on_bad=bad.append))
    assert got == [{"name": "x", "n": 1}, {"name": "y", "n": 2}, {"name": "w", "n": 5}]
    # positions: the 1-based line of the file (the header is line 1)
    assert [(b.source, b.position["row"], b.position["raw"]) for b in bad] == [
        (str(path), 4, "z,3,4"),
        (str(path), 6, "v"),
    ]


def test_csv_with_only_bad_rows_reports_them(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("a,b\n1,2,3\n")
    src = ns.sources.Files(str(path))
    bad: list[BadRecord] = []
    assert records_of(read_all(src, src.partitions()[0], on_bad=bad.append)) == []
    assert [b.position["raw"] for b in bad] == ["1,2,3"]


def test_csv_resume_does_not_report_bad_rows_before_the_offset_again(tmp_path):
    path = tmp_path / "in.csv"
    path.write_text("a,b\n1,2\nbad\n3,4\n5,6\n")
    src = ns.sources.Files(str(path))
    bad: list[BadRecord] = []
    assert records_of(read_all(src, src.partitions()[0], on_bad=bad.append)) == [
        {"a": 1, "b": 2},
        {"a": 3, "b": 4},
        {"a": 5, "b": 6},
    ]
    assert len(bad) == 1
    line = bad[0].position["row"]
    assert line == 3  # the header is line 1
    # an offset is [good rows consumed, line of the last bad row reported]: resuming after the
    # second good row, which is after the bad one, must not report the bad row a second time
    # (the dead-letter file is append-only)
    assert records_of(read_all(src, src.partitions()[0], [2, line], on_bad=bad.append)) == [{"a": 5, "b": 6}]
    assert len(bad) == 1
    # resuming from before the bad row reports it once more, as a fresh read must
    assert records_of(read_all(src, src.partitions()[0], [1, 0], on_bad=bad.append)) == [
        {"a": 3, "b": 4},
        {"a": 5, "b": 6},
    ]
    assert len(bad) == 2


def test_csv_every_row_and_resume(tmp_path):
    n = 80_000  # over the reader's 1 MiB block: several chunks
    path = tmp_path / "big.csv"
    with open(path, "w") as f:
        f.write("id,word\n")
        for i in range(n):
            f.write(f"{i},w{i % 97:03d}-{'y' * (i % 7)}\n")
    src = ns.sources.Files(str(path))
    part = src.partitions()[0]
    chunks = read_all(src, part)
    expected = [{"id": i, "word": f"w{i % 97:03d}-{'y' * (i % 7)}"} for i in range(n)]
    assert records_of(chunks) == expected
    assert len(chunks) > 1
    offset = chunks[0][1]
    assert offset == [len(chunks[0][0]), 0]  # [good rows consumed, line of the last bad row]
    assert records_of(read_all(src, part, offset)) == expected[offset[0] :]
    assert records_of(read_all(src, part, [12345, 0])) == expected[12345:]


def test_csv_in_latin_1_is_decoded_in_blocks_and_resumes(tmp_path):
    n = 60_000  # over the reader's 1 MiB block: several chunks
    names = ["café", "Zürich", "Ærø", "señor", "naïve"]
    path = tmp_path / "latin.csv"
    with open(path, "w", encoding="latin-1", newline="") as f:
        f.write("id,name\n")
        for i in range(n):
            f.write(f"{i},{names[i % 5]}-{'é' * (i % 7)}\n")
            if i == 41_000:
                f.write("née,1,2\n")  # a bad row: line 41_003 (the header is line 1)
    raw = path.read_bytes()
    assert b"caf\xe9" in raw and "café".encode() not in raw  # latin-1 on disk, not UTF-8
    src = ns.sources.Files(str(path), encoding="latin-1")
    part = src.partitions()[0]
    bad: list[BadRecord] = []
    chunks = read_all(src, part, on_bad=bad.append)
    expected = [{"id": i, "name": f"{names[i % 5]}-{'é' * (i % 7)}"} for i in range(n)]
    assert records_of(chunks) == expected
    assert len(chunks) > 1
    assert [(b.position["row"], b.position["raw"]) for b in bad] == [(41_003, "née,1,2")]
    offset = chunks[0][1]
    assert offset[1] == 41_003  # the first block holds the bad row
    assert records_of(read_all(src, part, offset, on_bad=bad.append)) == expected[offset[0] :]
    assert len(bad) == 1
    assert records_of(read_all(src, part, [30_000, 0], on_bad=bad.append)) == expected[30_000:]
    assert len(bad) == 2  # resumed before the bad row: reported again


def test_csv_byte_the_encoding_cannot_decode_fails_the_file_naming_it(tmp_path):
    path = tmp_path / "in.csv"
    path.write_bytes(b"a,b\nok,1\nn\xe9e,2\n")
    src = ns.sources.Files(str(path), encoding="ascii")
    with pytest.raises(PipelineError, match=r"in\.csv is not ascii text"):
        read_all(src, src.partitions()[0], on_bad=lambda b: None)


def test_an_unknown_encoding_is_refused_where_the_source_is_declared(tmp_path):
    with pytest.raises(PipelineError, match="unknown encoding 'latin-9000'"):
        ns.sources.Files(str(tmp_path / "in.csv"), encoding="latin-9000")
    with pytest.raises(PipelineError, match="unknown encoding"):
        ns.sources.TcpLines("localhost", 9, encoding="nope")


# -- Files: Parquet --------------------------------------------------------------------------


def test_parquet_row_groups_every_row_and_resume(tmp_path):
    rows_a = [{"k": f"k{i}", "v": i * 1.5} for i in range(23)]
    rows_b = [{"k": "only", "v": -1.0}]
    pq.write_table(pa.Table.from_pylist(rows_a), tmp_path / "a.parquet", row_group_size=10)
    pq.write_table(pa.Table.from_pylist(rows_b), tmp_path / "b.pq")
    src_a = ns.sources.Files(str(tmp_path / "a.parquet"))
    parts = src_a.partitions()
    assert [p["row_group"] for p in parts] == [0, 1, 2]
    per_group = [records_of(read_all(src_a, p, chunk=4)) for p in parts]
    assert per_group == [rows_a[0:10], rows_a[10:20], rows_a[20:23]]
    chunks = read_all(src_a, parts[1], chunk=4)
    assert [off for _, off in chunks] == [4, 8, 10]  # offsets: rows within the row group
    assert records_of(read_all(src_a, parts[1], 4, chunk=4)) == rows_a[14:20]
    src_b = ns.sources.Files(str(tmp_path / "b.pq"))
    assert src_b.format == "parquet"
    assert records_of(read_all(src_b, src_b.partitions()[0])) == rows_b


def test_files_format_from_the_argument_or_the_extension(tmp_path):
    path = tmp_path / "data.log"
    path.write_text('{"a": 1}\n')
    with pytest.raises(PipelineError, match="unknown file format 'log'"):
        ns.sources.Files(str(path))
    src = ns.sources.Files(str(path), format="text")
    assert records_of(read_all(src, {"file": str(path)})) == ['{"a": 1}']
    src = ns.sources.Files(str(path), format="jsonl")
    assert records_of(read_all(src, {"file": str(path)})) == [{"a": 1}]
    no_ext = tmp_path / "README"
    no_ext.write_text("plain\n")
    assert ns.sources.Files(str(no_ext)).format == "text"


# -- sinks: Files ----------------------------------------------------------------------------


def visible(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n != "_staging")


def test_files_jsonl_nothing_before_commit_everything_after(tmp_path):
    out = tmp_path / "out"
    sink = ns.sinks.Files(str(out))
    w0, w1 = sink.open_part(0, "run"), sink.open_part(1, "run")
    w0.write(0, [{"a": 1}, ("k", 2)])
    w1.write(0, ["w1"])
    w0.write(1, [3])
    w0.write(0, [b"bytes"])
    assert sink.read_committed() == []
    assert visible(out) == []
    assert w0.commit(0) == 3
    assert w1.commit(0) == 1
    # tuples are JSON arrays; bytes are written as text; parts in name order (epoch, worker)
    assert sink.read_committed() == [{"a": 1}, ["k", 2], "bytes", "w1"]
    assert w0.commit(0) == 0  # nothing new
    assert w0.commit(5) == 1
    assert sink.read_committed() == [{"a": 1}, ["k", 2], "bytes", "w1", 3]
    assert len(visible(out)) == 3
    assert os.listdir(out / "_staging") == []


def test_files_commit_publishes_only_epochs_up_to_the_one_given(tmp_path):
    sink = ns.sinks.Files(str(tmp_path / "out"))
    part = sink.open_part(0, "run")
    for e in range(4):
        part.write(e, [e * 10, e * 10 + 1])
    assert part.commit(1) == 4
    assert sink.read_committed() == [0, 1, 10, 11]
    part.abort()
    assert part.commit(10) == 0
    assert sink.read_committed() == [0, 1, 10, 11]


def test_files_parquet_stage_and_commit(tmp_path):
    sink = ns.sinks.Files(str(tmp_path / "pq"), format="parquet")
    part = sink.open_part(0, "run")
    part.write(0, [("a", 1), ("b", 2)])
    part.write(1, [{"x": 1, "y": "s"}, {"x": 2, "y": "t"}])
    part.write(2, [1.5, 2.5])
    assert sink.read_committed() == []
    assert part.commit(2) == 6
    # 2-tuples come back as [key, value]; dict rows as dicts; scalars as themselves
    assert sink.read_committed() == [["a", 1], ["b", 2], {"x": 1, "y": "s"}, {"x": 2, "y": "t"}, 1.5, 2.5]


def test_files_parquet_dict_rows_named_key_and_value_come_back_as_dicts(tmp_path):
    """Records are dicts; reading them back must not turn them into something else."""
    sink = ns.sinks.Files(str(tmp_path / "pq"), format="parquet")
    part = sink.open_part(0, "run")
    rows = [{"key": "a", "value": 1}, {"key": "b", "value": 2}]
    part.write(0, rows)
    part.write(1, [{"value": 7}])
    part.commit(1)
    assert sink.read_committed() == [*rows, {"value": 7}]


def test_files_parquet_records_of_mixed_types_come_back_as_written(tmp_path):
    """Records Arrow cannot put in one typed column are stored as JSON text; reading them
    back must give the records, not their JSON text."""
    sink = ns.sinks.Files(str(tmp_path / "pq"), format="parquet")
    part = sink.open_part(0, "run")
    part.write(0, [1, "a", None])
    part.write(1, [{"x": 1}, {"x": "s"}])
    part.commit(1)
    assert sink.read_committed() == [1, "a", None, {"x": 1}, {"x": "s"}]


# -- sinks: LevelDB and Console --------------------------------------------------------------


def test_leveldb_upserts_are_idempotent(tmp_path):
    sink = ns.sinks.LevelDB(str(tmp_path / "kv"))
    epoch0 = [("a", 1), ("b", [1, 2]), (("t", 1), {"m": 1}), ("a", 3)]
    epoch1 = [("b", None), ("c", "x")]
    model: dict = {}
    for k, v in epoch0:
        model[k] = v

    part = sink.open_part(0, "run")
    part.write(0, epoch0)
    assert part.commit(0) == 4
    part.close()
    assert sink.read_committed() == model

    part = sink.open_part(0, "run")  # the epoch replayed: same content, same state
    part.write(0, epoch0)
    part.commit(0)
    part.close()
    assert sink.read_committed() == model

    part = sink.open_part(0, "run")
    part.write(1, epoch1)
    part.write(2, [("never", "committed")])
    assert part.commit(1) == 2
    part.close()
    for k, v in epoch1:
        model[k] = v
    assert sink.read_committed() == model


def test_leveldb_one_database_per_worker(tmp_path):
    sink = ns.sinks.LevelDB(str(tmp_path / "kv"))
    parts = [sink.open_part(w, "run") for w in range(2)]
    parts[0].write(0, [("x", 0)])
    parts[1].write(0, [("y", 1)])
    for p in parts:
        p.commit(0)
        p.close()
    assert sorted(n for n in os.listdir(tmp_path / "kv") if n != "_staging") == ["part-0", "part-1"]
    assert sink.read_committed() == {"x": 0, "y": 1}


def test_leveldb_refuses_records_that_are_not_pairs(tmp_path):
    part = ns.sinks.LevelDB(str(tmp_path / "kv")).open_part(0, "run")
    try:
        part.write(0, ["just a string of length > 2"])
        with pytest.raises(PipelineError, match=r"\(key, value\) records"):
            part.commit(0)
    finally:
        part.close()


def test_leveldb_values_with_int_map_keys_and_sets_read_back(tmp_path):
    """A Counter of ints (a histogram) and a set, as keyed state now emits them: written, and
    read back (maps with int keys failed to read; sets failed to write)."""
    sink = ns.sinks.LevelDB(str(tmp_path / "kv"))
    part = sink.open_part(0, "run")
    part.write(0, [("hist", collections.Counter({3: 2, 7: 1})), ("seen", {"b", "a"}), (1, frozenset({2, 1}))])
    assert part.commit(0) == 3
    part.close()
    assert sink.read_committed() == {"hist": {3: 2, 7: 1}, "seen": ["a", "b"], 1: [1, 2]}


def test_leveldb_names_a_record_it_cannot_write(tmp_path):
    part = ns.sinks.LevelDB(str(tmp_path / "kv")).open_part(0, "run")
    try:
        part.write(0, [("ok", 1), ("when", datetime.date(2026, 1, 1))])
        with pytest.raises(PipelineError, match=r"cannot write the record \('when', datetime.date\(2026, 1, 1\)\)"):
            part.commit(0)
    finally:
        part.close()


def test_console_prints_at_commit(capsys):
    part = ns.sinks.Console().open_part(3, "run")
    part.write(0, ["a", ("k", 1)])
    part.write(1, [{"x": 2}])
    assert capsys.readouterr().out == ""
    assert part.commit(0) == 2
    assert capsys.readouterr().out == "[w3 e0] 'a'\n[w3 e0] ('k', 1)\n"
    assert part.commit(1) == 1
    assert capsys.readouterr().out == "[w3 e1] {'x': 2}\n"
    assert part.commit(1) == 0
    assert capsys.readouterr().out == ""
