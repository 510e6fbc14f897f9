"""The remote tier: immutable Arrow IPC segments written through `pyarrow.fs`.

Any URI `pyarrow.fs.FileSystem.from_uri` accepts works (a local path, file://, s3://, hdfs://).
Two kinds of file, both immutable once written (FORMAT.md has the schemas):

- log segments `log-{start:020d}-{end:020d}.arrow`: the update batches whose seqs lie in
  [start, end], one row each (seq, payload, checksum), with the same payload and checksum as the
  local log's records, so a segment can be checked record by record and turned back into a log.
  Seqs need not be consecutive, so the name carries the range covered, not the seqs present:
  segments chain when one starts right after the previous one ends;
- base images `base-{seq:020d}.arrow`: every state as of `seq`, one run each (`run.image`),
  written by compaction so that the log segments at or below `seq` can be deleted.

A file is written under a temporary name and then moved into place, so a listing never shows
half a segment. Every write and delete first asks the tier's `fence`, if it has one: a writer
that may no longer change the tier (its process was replaced by another that writes it now) is
refused with FencedError before it touches anything. `durable("remote")` is the highest seq up
to which base + segments leave no gap.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
import xxhash

from lsm.errors import CorruptLogError, FencedError, FormatVersionError
from lsm.records import FORMAT_VERSION, SEQ, Record

_LOG_RE = re.compile(r"^log-(\d{20})-(\d{20})\.arrow$")
_BASE_RE = re.compile(r"^base-(\d{20})\.arrow$")
LOG_SCHEMA = pa.schema(
    [("seq", pa.uint64()), ("payload", pa.binary()), ("checksum", pa.uint64())],
    metadata={b"nosync.lsm.format": str(FORMAT_VERSION).encode(), b"kind": b"log"},
)
BASE_SCHEMA = pa.schema(
    [("state", pa.binary()), ("run", pa.binary())],
    metadata={b"nosync.lsm.format": str(FORMAT_VERSION).encode(), b"kind": b"base"},
)


@dataclass(frozen=True)
class RemoteFile:
    """A file of the remote tier: its name, the range of seqs it covers (`first` is -1 for a base
    image), and whether it is a base image."""

    name: str
    first: int
    last: int
    base: bool


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """The file system and root path of a remote URI or local path."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    return pafs.FileSystem.from_uri(uri)


def write_table(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    """Writes `table` as an Arrow IPC file at `path`, atomically as far as `fs` allows."""
    tmp = path + ".tmp"
    with fs.open_output_stream(tmp) as out, ipc.new_file(out, table.schema) as writer:
        writer.write_table(table)
    fs.move(tmp, path)


class RemoteTier:
    """The remote tier of one store: its log segments and base images under one URI
    (`files`: their listing)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.fs, self.root = resolve(uri)
        self.fs.create_dir(self.root, recursive=True)
        self.fence: Callable[[], str | None] | None = None
        """Asked before every write and delete: None lets it through, a reason refuses it."""
        self.files: list[RemoteFile] = []
        self.refresh()

    def _path(self, name: str) -> str:
        return f"{self.root}/{name}"

    def _may_write(self) -> None:
        why = self.fence() if self.fence is not None else None
        if why is not None:
            raise FencedError(f"{self.uri}: write refused: {why}")

    def refresh(self) -> None:
        """Lists the tier; leftover temporary files of an interrupted upload are removed."""
        files = []
        for info in self.fs.get_file_info(pafs.FileSelector(self.root)):
            name = info.base_name
            if name.endswith(".tmp"):
                self.fs.delete_file(info.path)
                continue
            m = _LOG_RE.match(name)
            if m:
                files.append(RemoteFile(name, int(m[1]), int(m[2]), False))
                continue
            m = _BASE_RE.match(name)
            if m:
                files.append(RemoteFile(name, -1, int(m[1]), True))
        files.sort(key=lambda f: (f.last, not f.base))
        self.files = files

    @property
    def base(self) -> RemoteFile | None:
        """The newest base image, None if the tier holds none."""
        bases = [f for f in self.files if f.base]
        return bases[-1] if bases else None

    def durable(self) -> int:
        """The highest seq such that the tier holds everything up to it (-1: nothing)."""
        base = self.base
        top = base.last if base else -1
        for f in sorted((f for f in self.files if not f.base), key=lambda f: f.first):
            if f.last <= top:
                continue
            if f.first > top + 1:
                break
            top = f.last
        return top

    def upload(self, start: int, records: list[Record]) -> RemoteFile:
        """Writes one log segment covering seqs [start, last record's seq].

        REQUIRES: `records` sorted by seq, all >= start.
        """
        payloads = [SEQ.pack(r.seq) + r.packed for r in records]
        table = pa.table(
            {
                "seq": pa.array([r.seq for r in records], pa.uint64()),
                "payload": pa.array(payloads, pa.binary()),
                "checksum": pa.array([xxhash.xxh3_64_intdigest(p, len(p)) for p in payloads], pa.uint64()),
            },
            schema=LOG_SCHEMA,
        )
        end = records[-1].seq
        name = f"log-{start:020d}-{end:020d}.arrow"
        self._may_write()
        write_table(self.fs, self._path(name), table)
        f = RemoteFile(name, start, end, False)
        self._add(f)
        return f

    def _read_table(self, f: RemoteFile, kind: bytes) -> pa.Table:
        path = self._path(f.name)
        try:
            with self.fs.open_input_file(path) as src:
                table = ipc.open_file(src).read_all()
        except (pa.ArrowInvalid, OSError) as e:
            raise CorruptLogError(path, 0, f"unreadable Arrow IPC file: {e}") from e
        meta = table.schema.metadata or {}
        version = meta.get(b"nosync.lsm.format")
        if version != str(FORMAT_VERSION).encode() or meta.get(b"kind") != kind:
            raise FormatVersionError(path, version, FORMAT_VERSION)
        return table

    def read_log(self, f: RemoteFile) -> list[Record]:
        """The records of a log segment, each checked against its checksum."""
        table = self._read_table(f, b"log")
        out = []
        for row, (seq, payload, checksum) in enumerate(
            zip(
                table.column("seq").to_pylist(),
                table.column("payload").to_pylist(),
                table.column("checksum").to_pylist(),
                strict=True,
            )
        ):
            if xxhash.xxh3_64_intdigest(payload, len(payload)) != checksum or SEQ.unpack_from(payload)[0] != seq:
                raise CorruptLogError(self._path(f.name), row, "checksum mismatch in row")
            out.append(Record(seq, row, payload[SEQ.size :]))
        return out

    def write_base(self, seq: int, rows: list[tuple[bytes, bytes]], horizon: int | None = None) -> RemoteFile:
        """Writes a base image: (encoded state name, run bytes) of every state as of `seq`,
        with every version a read at or after `horizon` (default `seq`) can see."""
        schema = BASE_SCHEMA.with_metadata(
            {**BASE_SCHEMA.metadata, b"horizon": str(seq if horizon is None else horizon).encode()}
        )
        table = pa.table(
            {"state": pa.array([r[0] for r in rows], pa.binary()), "run": pa.array([r[1] for r in rows], pa.binary())},
            schema=schema,
        )
        name = f"base-{seq:020d}.arrow"
        self._may_write()
        write_table(self.fs, self._path(name), table)
        f = RemoteFile(name, -1, seq, True)
        self._add(f)
        return f

    def read_base(self, f: RemoteFile) -> tuple[list[tuple[bytes, bytes]], int]:
        """The (state, run bytes) rows of a base image (each run is checked when it is read)
        and its horizon: the oldest seq a read of it may ask for."""
        table = self._read_table(f, b"base")
        try:
            horizon = int((table.schema.metadata or {}).get(b"horizon", str(f.last).encode()))
        except ValueError as e:
            raise CorruptLogError(self._path(f.name), 0, f"bad horizon in the base image's metadata: {e}") from e
        return list(zip(table.column("state").to_pylist(), table.column("run").to_pylist(), strict=True)), horizon

    def _add(self, f: RemoteFile) -> None:
        """Lists a file just written; a rewrite of the same name replaces its entry."""
        self.files = sorted([*(x for x in self.files if x.name != f.name), f], key=lambda x: (x.last, not x.base))

    def delete(self, f: RemoteFile) -> None:
        """Deletes a file of the tier and drops it from the list."""
        self._may_write()
        self.fs.delete_file(self._path(f.name))
        self.files = [x for x in self.files if x.name != f.name]

    def drop_after(self, seq: int) -> list[RemoteFile]:
        """Removes every batch above `seq` (rollback); returns the segments deleted.

        A segment that also holds batches at or below `seq` is first rewritten without the
        others (covering [its start, its last kept batch]): the local log may no longer have
        them. A base image above `seq` goes too (it holds the state after it, and a restore
        from the tier would start from it): the tier then holds up to the newest base and
        segments left, and the persister uploads a new base image where the local log cannot
        fill the gap. The tier then claims no seq it holds no batch for.
        """
        self._may_write()
        gone = [f for f in self.files if f.last > seq]
        for f in gone:
            if not f.base and f.first <= seq:
                kept = [r for r in self.read_log(f) if r.seq <= seq]
                if kept:
                    self.upload(f.first, kept)
            self.delete(f)
        return gone

    def total_bytes(self) -> int:
        """The bytes of every file under the tier's root, as the file system lists them."""
        return sum(i.size for i in self.fs.get_file_info(pafs.FileSelector(self.root)) if i.size is not None)
