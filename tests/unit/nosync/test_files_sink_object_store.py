"""The Files sink on an object store (nosync/api/sink_files.py), driven part by part against a
real S3 endpoint (moto's server, tests/support/s3.py): a pre-commit is uploaded under
`_staging/` and shows nothing, a commit copies it to its final key and deletes the staged
object, and a commit retried at any point of that leaves each record committed exactly once.

A "crash" is a part dropped (`del`) without `close()`; the writer that takes over is a new part
of the same worker on the same URI. Handles go through msgpack as a checkpoint file stores them.
The objects are listed with a `pyarrow.fs.S3FileSystem` made here, not through the engine's
`nosync.storage`; expected records and names are written out from each test's input.
"""

from __future__ import annotations

import re
import uuid
from urllib.parse import parse_qs, urlsplit

import msgpack
import pyarrow.fs as pafs
import pytest
from support.s3 import moto_s3

import nosync as ns
from nosync.errors import NosyncError, PipelineError, RunFailed

FILE_FORMATS = ["jsonl", "parquet"]


@pytest.fixture(scope="module")
def s3():
    """The base URI of a prefix on one moto server for the whole module."""
    with moto_s3() as base:
        yield base


@pytest.fixture
def uri(s3):
    """A prefix of its own for each test, under the module's server."""
    u = urlsplit(s3)
    return f"{u.scheme}://{u.netloc}{u.path}/{uuid.uuid4().hex[:8]}?{u.query}"


class Bucket:
    """The objects under a sink's URI, seen with a file system made from its parts here."""

    def __init__(self, uri: str) -> None:
        u = urlsplit(uri)
        q = parse_qs(u.query)
        self.fs = pafs.S3FileSystem(
            access_key=u.username,
            secret_key=u.password,
            endpoint_override=q["endpoint_override"][0],
            scheme=q["scheme"][0],
        )
        self.root = u.hostname + u.path

    def names(self, sub: str = "") -> list[str]:
        """The objects directly under the URI (or its folder `sub`), `_staging` left out."""
        where = f"{self.root}/{sub}".rstrip("/")
        infos = self.fs.get_file_info(pafs.FileSelector(where, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.File)

    def staging(self) -> list[str]:
        return self.names("_staging")

    def copy(self, src: str, dst: str) -> None:
        self.fs.copy_file(f"{self.root}/{src}", f"{self.root}/{dst}")

    def delete(self, key: str) -> None:
        self.fs.delete_file(f"{self.root}/{key}")


def stored(handle):
    """`handle` as it comes back from a checkpoint file (same msgpack options)."""
    return msgpack.unpackb(msgpack.packb(handle, use_bin_type=True), raw=False, use_list=False, strict_map_key=False)


def cname(epoch: int, worker: int, checkpoint: int, fmt: str) -> str:
    """The file name of a checkpoint commit, written out as documented."""
    return f"part-{epoch:010d}-w{worker:04d}-c{checkpoint:010d}.{fmt}"


def rows(tag: str, n: int) -> list[dict]:
    """Dict records (one schema, so that Parquet stores them as rows)."""
    return [{"tag": tag, "i": i} for i in range(n)]


def local_files(directory) -> list[str]:
    """The part files the sink keeps on this host, under `directory` (its `local_dir`)."""
    return sorted(p.name for p in directory.rglob("part-*"))


# -- two phases: a pre-commit is uploaded, invisible, and committed by a copy ----------------------


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_precommit_is_staged_invisible_and_commits_once_after_a_crash(uri, tmp_path, fmt):
    sink = ns.sinks.Files(uri, format=fmt)
    bucket = Bucket(uri)
    a, b = rows("a", 3), rows("b", 2)
    part = sink.open_part(2, "run-1", local_dir=str(tmp_path))
    part.write(3, a)
    part.write(6, b)
    part.seal(6)  # finished (a Parquet file is written only then)
    assert len(local_files(tmp_path)) == 2  # on this host until the pre-commit
    handle = stored(part.precommit(7))
    assert bucket.staging() == [cname(3, 2, 7, fmt), cname(6, 2, 7, fmt)]
    assert bucket.names() == []
    assert sink.read_committed() == []
    assert local_files(tmp_path) == []  # uploaded: nothing left here
    del part  # a crash: the writer is gone without close()

    part = sink.open_part(2, "run-2", local_dir=str(tmp_path))
    assert part.commit_precommit(7, handle) == len(a) + len(b)
    assert bucket.names() == [cname(3, 2, 7, fmt), cname(6, 2, 7, fmt)]
    assert bucket.staging() == []
    assert sink.read_committed() == a + b
    assert sink.read_committed_epochs() == [(3, r) for r in a] + [(6, r) for r in b]

    part.commit_precommit(7, handle)  # repeated after it took effect
    part.recover(7, [(7, handle)])
    assert sink.read_committed() == a + b
    assert bucket.names() == [cname(3, 2, 7, fmt), cname(6, 2, 7, fmt)]
    part.close()


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_commit_retried_after_a_crash_between_copy_and_delete(uri, tmp_path, fmt):
    sink = ns.sinks.Files(uri, format=fmt)
    bucket = Bucket(uri)
    a, b = rows("a", 4), rows("b", 3)
    part = sink.open_part(0, "run-1", local_dir=str(tmp_path))
    part.write(1, a)
    part.write(2, b)
    handle = stored(part.precommit(5))
    names = [cname(1, 0, 5, fmt), cname(2, 0, 5, fmt)]
    # the commit got as far as copying the first file, and copying the second without deleting it
    bucket.copy(f"_staging/{names[0]}", names[0])
    bucket.delete(f"_staging/{names[0]}")
    bucket.copy(f"_staging/{names[1]}", names[1])
    del part  # a crash before the second delete
    assert bucket.staging() == [names[1]]
    assert sink.read_committed() == a + b

    part = sink.open_part(0, "run-2", local_dir=str(tmp_path))
    assert part.commit_precommit(5, handle) == len(a) + len(b)
    assert bucket.names() == names
    assert bucket.staging() == []
    assert sink.read_committed() == a + b
    part.close()


def test_commit_retried_after_the_staged_object_is_gone_neither_fails_nor_duplicates(uri, tmp_path):
    sink = ns.sinks.Files(uri)
    bucket = Bucket(uri)
    recs = rows("x", 5)
    part = sink.open_part(1, "run", local_dir=str(tmp_path))
    part.write(0, recs)
    handle = stored(part.precommit(2))
    part.commit_precommit(2, handle)
    assert bucket.staging() == []
    assert part.commit_precommit(2, handle) == len(recs)
    assert sink.open_part(1, "run-2", local_dir=str(tmp_path)).recover(2, [(2, handle)]) == len(recs)
    assert sink.read_committed() == recs
    assert bucket.names() == [cname(0, 1, 2, "jsonl")]


def test_commit_of_a_pre_commit_lost_everywhere_fails_naming_the_file(uri, tmp_path):
    sink = ns.sinks.Files(uri)
    bucket = Bucket(uri)
    part = sink.open_part(1, "run", local_dir=str(tmp_path))
    part.write(2, rows("x", 2))
    part.write(3, rows("y", 1))
    handle = stored(part.precommit(4))
    lost = cname(3, 1, 4, "jsonl")
    bucket.delete(f"_staging/{lost}")
    with pytest.raises(RunFailed, match=re.escape(lost)) as ei:
        part.commit_precommit(4, handle)
    assert "k:s@" not in str(ei.value)  # the URI's secret is not in the message
    assert lost not in bucket.names()


# -- recover(c): later checkpoints are forgotten ----------------------------------------------------


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_recover_drops_later_staging_and_retracts_committed_above_for_this_worker_only(uri, tmp_path, fmt):
    sink = ns.sinks.Files(uri, format=fmt)
    bucket = Bucket(uri)
    local = str(tmp_path)
    a, b, c3 = rows("w0-c1", 2), rows("w0-c2", 3), rows("w0-c3", 1)
    d, e = rows("w1-c2", 2), rows("w1-c3", 2)

    w0 = sink.open_part(0, "run-1", local_dir=local)
    w1 = sink.open_part(1, "run-1", local_dir=local)
    w0.write(0, a)
    h1 = stored(w0.precommit(1))
    w0.commit_precommit(1, h1)
    w0.write(1, b)
    w0.commit_precommit(2, w0.precommit(2))  # committed, then recovery falls back past it
    w0.write(2, c3)
    h3 = stored(w0.precommit(3))  # staged only
    w0.write(4, rows("w0-open", 2))
    w0.seal(4)  # finished, not yet pre-committed when the worker dies
    w1.write(1, d)
    w1.commit_precommit(2, w1.precommit(2))
    w1.write(2, e)
    h3_w1 = stored(w1.precommit(3))
    w1.write(4, rows("w1-open", 1))
    w1.seal(4)
    assert sink.read_committed() == a + b + d
    assert len(local_files(tmp_path)) == 2  # each worker's finished file of epoch 4
    del w0  # a crash: the writer is gone without close()

    w0 = sink.open_part(0, "run-2", local_dir=local)
    assert w0.recover(1, [(1, h1)]) == len(a)
    assert bucket.names() == [cname(0, 0, 1, fmt), cname(1, 1, 2, fmt)]  # worker 1's object stays
    assert bucket.staging() == [cname(2, 1, 3, fmt)]  # worker 1's pre-commit stays
    assert sink.read_committed() == a + d
    # what the crashed writer left on this host is gone; worker 1's file is not
    assert [n for n in local_files(tmp_path) if "-w0000" in n] == []
    assert [n for n in local_files(tmp_path) if "-w0001" in n] != []

    w0.commit_precommit(1, h1)
    with pytest.raises(RunFailed):
        w0.commit_precommit(3, h3)  # discarded for good
    assert sink.read_committed() == a + d
    assert w1.commit_precommit(3, h3_w1) == len(e)
    assert sink.read_committed() == a + d + e
    w0.close()
    w1.close()


def test_recover_with_a_lower_retract_point_takes_back_committed_output(uri, tmp_path):
    """Mode nosync recovers to its snapshot and retracts what was committed above the durable
    point it gives (`retract_above`)."""
    sink = ns.sinks.Files(uri)
    bucket = Bucket(uri)
    part = sink.open_part(0, "run", local_dir=str(tmp_path))
    kept, taken = rows("kept", 2), rows("taken", 3)
    part.write(0, kept)
    part.commit_precommit(1, part.precommit(1))
    part.write(1, taken)
    part.commit_precommit(2, part.precommit(2))
    assert part.recover(2, [], retract_above=1) == 0
    assert bucket.names() == [cname(0, 0, 1, "jsonl")]
    assert sink.read_committed() == kept


# -- a pre-commit not made durable -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_precommit_not_durable_stays_local_until_hardened_then_commits(uri, tmp_path, fmt):
    sink = ns.sinks.Files(uri, format=fmt)
    bucket = Bucket(uri)
    a, b = rows("a", 2), rows("b", 3)
    part = sink.open_part(3, "run", local_dir=str(tmp_path))
    part.write(0, a)
    h = stored(part.precommit(1, durable=False))
    assert bucket.staging() == [] and bucket.names() == []
    assert len(local_files(tmp_path)) == 1
    hard = stored(part.harden(1, h))
    assert bucket.staging() == [cname(0, 3, 1, fmt)]
    assert local_files(tmp_path) == []
    assert part.commit_precommit(1, hard) == len(a)
    assert sink.read_committed() == a

    # committed without `harden`: the local file goes straight to its final key
    part.write(1, b)
    h2 = stored(part.precommit(2, durable=False))
    assert part.commit_precommit(2, h2) == len(b)
    assert bucket.names() == [cname(0, 3, 1, fmt), cname(1, 3, 2, fmt)]
    assert bucket.staging() == []
    assert local_files(tmp_path) == []
    assert sink.read_committed() == a + b
    part.commit_precommit(2, h2)  # repeated: the final object is there
    assert sink.read_committed() == a + b
    part.close()


# -- mode none ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_mode_none_commit_uploads_to_final_keys_and_replace_takes_back_an_epoch(uri, tmp_path, fmt):
    sink = ns.sinks.Files(uri, format=fmt)
    bucket = Bucket(uri)
    e0, e1, e2 = rows("e0", 2), rows("e1", 1), rows("e2", 3)
    part = sink.open_part(3, "run", local_dir=str(tmp_path))
    part.write(0, e0)
    part.write(2, e2)
    part.write(1, e1)
    assert part.commit(1) == len(e0) + len(e1)
    assert bucket.names() == [f"part-{0:010d}-w{3:04d}.{fmt}", f"part-{1:010d}-w{3:04d}.{fmt}"]
    assert bucket.staging() == []
    assert sink.read_committed() == e0 + e1
    assert part.commit(2) == len(e2)
    assert sink.read_committed() == e0 + e1 + e2
    assert local_files(tmp_path) == []
    part.close()


def test_mode_none_commit_with_replace_takes_back_every_file_of_the_epoch(uri, tmp_path):
    """Mode replay commits an epoch again after recomputing it: what this worker committed of
    it before goes, the second file of the epoch (a second Parquet schema) included."""
    sink = ns.sinks.Files(uri, format="parquet")
    bucket = Bucket(uri)
    e0, first, other = rows("e0", 2), rows("e1", 2), [{"other": 1}]
    part = sink.open_part(3, "run", local_dir=str(tmp_path))
    part.write(0, e0)
    part.write(1, first)
    part.write(1, other)
    assert part.commit(1) == len(e0) + len(first) + len(other)
    e1_names = [f"part-{1:010d}-w{3:04d}.parquet", f"part-{1:010d}-w{3:04d}-001.parquet"]
    assert bucket.names() == sorted([f"part-{0:010d}-w{3:04d}.parquet", *e1_names])

    again = rows("e1-again", 3)
    part.replace = True
    part.write(1, again)
    assert part.commit(1) == len(again)
    assert bucket.names() == [f"part-{0:010d}-w{3:04d}.parquet", e1_names[0]]
    assert sink.read_committed() == e0 + again
    part.close()


# -- a place the sink cannot write is refused before the first epoch ----------------------------------


def test_a_bucket_that_does_not_exist_is_refused_naming_the_uri(s3, tmp_path):
    u = urlsplit(s3)
    missing = f"s3://k:s@no-such-bucket-{uuid.uuid4().hex[:6]}/out?{u.query}"
    sink = ns.sinks.Files(missing)
    with pytest.raises(NosyncError, match=r"sink Files\(s3://k:\*\*\*@no-such-bucket-") as ei:
        sink.check_writable()
    assert "k:s@" not in str(ei.value)
    with pytest.raises(NosyncError, match="no-such-bucket-"):
        sink.open_part(0, "run", local_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_a_writable_bucket_passes_the_check_and_leaves_nothing(uri):
    ns.sinks.Files(uri).check_writable()
    assert Bucket(uri).names() == []


def test_leveldb_refuses_an_object_store_at_declaration():
    with pytest.raises(PipelineError, match="LevelDB needs a local path on every worker's host") as ei:
        ns.sinks.LevelDB("s3://k:s@bucket/kv?endpoint_override=127.0.0.1:9&scheme=http")
    assert ei.value.operator == "sinks.LevelDB" and ei.value.where and __file__ in ei.value.where
    assert "k:s@" not in str(ei.value)


def test_file_uris_are_local_directories(tmp_path):
    """A file:// URI is the local path: the POSIX code path, read back through the plain path."""
    files = ns.sinks.Files(f"file://{tmp_path}/out")
    part = files.open_part(0, "run")
    part.write(0, [1, 2])
    part.commit_precommit(1, stored(part.precommit(1)))
    part.close()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["_staging", cname(0, 0, 1, "jsonl")]
    assert ns.sinks.Files(str(tmp_path / "out")).read_committed() == [1, 2]

    kv = ns.sinks.LevelDB(f"file://{tmp_path}/kv")
    part = kv.open_part(0, "run")
    part.write(0, [("k", 1)])
    part.commit(0)
    part.close()
    assert ns.sinks.LevelDB(str(tmp_path / "kv")).read_committed() == {"k": 1}
