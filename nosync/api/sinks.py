"""Sinks: where a run's output is committed. "Exactly once" is judged on committed output.

Each worker has its own instance of a sink (a "part"). Records are staged per epoch and become
visible only when committed. Mode none commits an epoch when every input of the sink has
finished it (`commit(epoch)`). The other modes commit in two phases: `precommit(c)` writes what
is staged durably into a staging area outside the committed output, under checkpoint (or safe
point) c, and returns a small handle; `commit_precommit(c, handle)` makes it visible atomically
once c is complete. Both are idempotent: a commit repeated after a crash writes nothing twice.
`recover(c, handles)` brings a part back to checkpoint c: it commits the handles of c and
before, discards the staging of later checkpoints (and, for files, retracts output committed
under a later checkpoint, which happens only when recovery falls back past a damaged one).

- Files: one staged file per (epoch, worker[, checkpoint]) under `<dir>/_staging/`, fsynced,
  renamed into `<dir>/` at commit (atomic on a POSIX file system). The directory is fsynced
  once for the commits before it (`sync`) when a snapshot or checkpoint records them
  (`SinkOp.snapshot_meta`) and before the worker reports its output done, not at each commit:
  a commit whose rename a machine crash took back is one that record does not hold yet, so a
  restore commits it again. Names carry the checkpoint, so one that cuts an epoch in two gives
  two files.
- LevelDB: a key-value sink of (key, value) records; the upserts go in one write batch at
  commit (idempotent: a replayed commit writes the same values). One LevelDB per worker
  (`<dir>/part-W`), since LevelDB allows one process per database; pre-commits are msgpack
  files under `<dir>/_staging/`.
- Console: prints committed records.
"""

from __future__ import annotations

__all__ = ["ALL", "Console", "Files", "LevelDB", "Null", "Sink", "SinkPart"]

import json
import os
import re
import sys
from typing import Any

import msgpack
import plyvel

from lsm.files import fsync_dir
from nosync.api.sink_base import ALL, Sink, SinkPart
from nosync.api.where import declared_at
from nosync.errors import PipelineError, RunFailed


def _msgpack_default(obj: Any) -> Any:
    # a set is written as the list of its items, in order when they can be ordered (so that
    # equal sets give equal bytes), as the JSON sink writes it
    if isinstance(obj, set | frozenset):
        try:
            return sorted(obj)
        except TypeError:
            return list(obj)
    raise TypeError(f"cannot write a {type(obj).__name__} as msgpack")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "backslashreplace")
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise TypeError(f"cannot write a {type(obj).__name__} as JSON")


class Files(Sink):
    """Transactional files: JSONL (one JSON value per line) or Parquet (records as rows;
    non-dict records are stored in a column `value`).

    >>> ns.sinks.Files("out/", format="jsonl")  # doctest: +SKIP
    """

    FORMATS = ("jsonl", "parquet")

    def __init__(self, directory: str, format: str = "jsonl", **options: Any) -> None:
        unknown = set(options)
        if unknown:
            raise PipelineError(
                f"unknown option(s) {', '.join(sorted(unknown))}; Files takes directory, format",
                "sinks.Files",
                declared_at(),
            )
        if format not in self.FORMATS:
            raise PipelineError(
                f"unknown format {format!r}; formats: {', '.join(self.FORMATS)}",
                "sinks.Files",
                declared_at(),
            )
        self.directory = directory
        self.format = format

    def describe(self) -> str:
        """The sink's directory and format, for messages."""
        return f"Files({self.directory}, {self.format})"

    def open_part(self, worker: int, run_id: str) -> SinkPart:
        """The writer of worker `worker`: its part files in the sink's directory."""
        return _FilesPart(self.directory, self.format, worker)

    def read_committed(self) -> list:
        """Every committed record, part files in name order (for tests and tools)."""
        return [r for _, r in self.read_committed_epochs()]

    def read_committed_epochs(self) -> list[tuple[int, Any]]:
        """(epoch, record) of every committed record, part files in name order; the epoch is
        the one its part file is named after."""
        out: list = []
        if not os.path.isdir(self.directory):
            return out
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            m = PART_NAME.match(name)
            epoch = int(m.group(1)) if m else -1
            if name.endswith(".jsonl"):
                with open(path, encoding="utf-8") as f:
                    out.extend((epoch, json.loads(line)) for line in f if line.strip())
            elif name.endswith(".parquet"):
                out.extend((epoch, r) for r in _parquet_records(path))
        return out


LAYOUT_KEY = b"nosync.layout"


def _arrow_table(recs: list) -> Any:
    """Records as an Arrow table, with the layout named in the schema metadata so that
    `read_committed` gives back what was written: "rows" (dicts as rows), "pairs" ((key, value)
    as two columns), "values" (one column), "json" (one column of JSON text, for records whose
    types Arrow cannot put in one column). The layout is chosen by the first record and checked
    by the conversion itself: a record of another shape falls through to the next layout."""
    import pyarrow as pa  # lazy: pyarrow costs ~0.3 s to import and only this path needs it

    def tagged(table: Any, layout: str) -> Any:
        return table.replace_schema_metadata({LAYOUT_KEY: layout.encode()})

    first = recs[0]
    if isinstance(first, dict):
        try:
            return tagged(pa.Table.from_pylist(recs), "rows")
        except (pa.ArrowException, TypeError, AttributeError):
            pass
    elif isinstance(first, tuple | list) and len(first) == 2:
        try:
            keys, values = zip(*recs, strict=True)
            return tagged(pa.table({"key": pa.array(keys), "value": pa.array(values)}), "pairs")
        except (pa.ArrowException, TypeError, ValueError):
            pass
    try:
        return tagged(pa.table({"value": pa.array(recs)}), "values")
    except (pa.ArrowException, TypeError, ValueError):
        text = [json.dumps(r, default=_json_default, separators=(",", ":")) for r in recs]
        return tagged(pa.table({"value": pa.array(text, pa.string())}), "json")


def _parquet_records(path: str) -> list:
    """The records of a Parquet part file, as `_arrow_table` laid them out."""
    import pyarrow.parquet as pq  # lazy: pyarrow costs ~0.3 s to import and only this path needs it

    table = pq.read_table(path)
    layout = (table.schema.metadata or {}).get(LAYOUT_KEY, b"rows").decode()
    if layout == "pairs":
        keys = table.column("key").to_pylist()
        return [list(kv) for kv in zip(keys, table.column("value").to_pylist(), strict=True)]
    if layout == "values":
        return table.column("value").to_pylist()
    if layout == "json":
        return [json.loads(t) for t in table.column("value").to_pylist()]
    return table.to_pylist()


PART_NAME = re.compile(r"^part-(\d+)-w(\d+)(?:-c(\d+))?(?:-(\d+))?\.")
"""A committed part file's name: epoch, worker, the checkpoint it was committed under (modes
that commit in two phases) and its index within the epoch."""
ROW_GROUP = 65_536
"""Records a Parquet part file buffers before it writes them as a row group."""


class _OpenFile:
    """One part file being written under `_staging/` while its records arrive, so that a
    commit or pre-commit has only a flush, an fsync and a rename left to do."""

    def __init__(self, path: str, fmt: str) -> None:
        self.path = path
        self.fmt = fmt
        self.records = 0
        self.f = open(path, "wb") if fmt == "jsonl" else None  # noqa: SIM115 - closed by finish/discard
        self.writer: Any = None
        self.schema: Any = None
        self.buffer: list = []
        self.buffered = 0

    def write(self, recs: list) -> bool:
        """Appends `recs`; False if they do not fit this file's Parquet schema (nothing written).
        Parquet records become Arrow here, batch by batch, so that finishing a file is C work."""
        if self.fmt == "jsonl":
            self.f.write(
                ("\n".join(json.dumps(r, default=_json_default, separators=(",", ":")) for r in recs) + "\n").encode()
            )
        else:
            table = _arrow_table(recs)
            if self.schema is None:
                self.schema = table.schema
            elif not table.schema.equals(self.schema, check_metadata=True):
                return False
            self.buffer.append(table)
            self.buffered += len(recs)
            if self.buffered >= ROW_GROUP:
                self._row_group()
        self.records += len(recs)
        return True

    def _row_group(self) -> None:
        import pyarrow as pa  # lazy: pyarrow costs ~0.3 s to import and only this path needs it
        import pyarrow.parquet as pq  # lazy: pyarrow costs ~0.3 s to import and only this path needs it

        if self.writer is None:
            self.writer = pq.ParquetWriter(self.path, self.schema)
        self.writer.write_table(pa.concat_tables(self.buffer))
        self.buffer, self.buffered = [], 0

    def finish(self) -> None:
        """Writes what is buffered, fsyncs and closes."""
        if self.f is not None:
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            return
        if self.buffer:
            self._row_group()
        if self.writer is not None:
            self.writer.close()
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def discard(self) -> None:
        try:
            if self.writer is not None:
                self.writer.close()
        except Exception:  # noqa: BLE001 - the file goes anyway
            pass
        if self.f is not None:
            self.f.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class _FilesPart(SinkPart):
    order_matters = False

    def __init__(self, directory: str, fmt: str, worker: int) -> None:
        super().__init__()
        self.dir = directory
        self.staging = os.path.join(directory, "_staging")
        os.makedirs(self.staging, exist_ok=True)
        self.fmt = fmt
        self.worker = worker
        self.open: dict[int, list[_OpenFile]] = {}
        self.sealed: dict[int, list[_OpenFile]] = {}
        self._serial = 0
        self.unsynced = False
        """Whether a commit renamed files into the directory since it was last fsynced."""

    def _name(self, epoch: int, checkpoint: int | None = None, index: int = 0) -> str:
        c = "" if checkpoint is None else f"-c{checkpoint:010d}"
        k = f"-{index:03d}" if index else ""
        return f"part-{epoch:010d}-w{self.worker:04d}{c}{k}.{self.fmt}"

    def _new_file(self, epoch: int) -> _OpenFile:
        self._serial += 1
        path = os.path.join(self.staging, f"part-{epoch:010d}-w{self.worker:04d}.{self._serial}.inprogress")
        f = _OpenFile(path, self.fmt)
        self.open.setdefault(epoch, []).append(f)
        return f

    def write(self, epoch: int, records: list) -> None:
        if not records:
            return
        files = self.open.get(epoch)
        f = files[-1] if files else self._new_file(epoch)
        if not f.write(records):
            self._new_file(epoch).write(records)

    def has_staged(self, upto: int = ALL) -> bool:
        return any(e <= upto for e in self.open) or any(e <= upto for e in self.sealed)

    def seal(self, epoch: int) -> None:
        """Finishes the files of epochs <= `epoch` (no record of them can come any more), so a
        later pre-commit only renames them."""
        for e in sorted(e for e in self.open if e <= epoch):
            self.sealed[e] = self._close_epoch(e)

    def _close_epoch(self, epoch: int) -> list[_OpenFile]:
        """Finishes the files of `epoch`."""
        files = self.open.pop(epoch)
        for f in files:
            f.finish()
        return [f for f in files if f.records]

    def _publish(self, epoch: int, target_dir: str, checkpoint: int | None) -> tuple[list[str], int]:
        names, n = [], 0
        files = self.sealed.pop(epoch, []) + (self._close_epoch(epoch) if epoch in self.open else [])
        for i, f in enumerate(files):
            name = self._name(epoch, checkpoint, i)
            os.replace(f.path, os.path.join(target_dir, name))
            names.append(name)
            n += f.records
        return names, n

    def commit(self, epoch: int) -> int:
        n = 0
        for e in sorted(e for e in {*self.open, *self.sealed} if e <= epoch):
            if self.replace:
                for name, c in self._mine(self.dir):
                    if c is None and int(PART_NAME.match(name).group(1)) == e:
                        os.unlink(os.path.join(self.dir, name))
            n += self._publish(e, self.dir, None)[1]
        self.unsynced = self.unsynced or n > 0
        return n

    def precommit(self, checkpoint: int, upto: int = ALL, durable: bool = True) -> Any:
        names = []
        n = 0
        epochs = sorted(e for e in {*self.open, *self.sealed} if e <= upto)
        if not durable:
            # the finished (fsynced) files stay where they were written, under their names in
            # progress: one rename, at the commit
            paths = []
            for e in epochs:
                files = self.sealed.pop(e, []) + (self._close_epoch(e) if e in self.open else [])
                for i, f in enumerate(files):
                    names.append(self._name(e, checkpoint, i))
                    paths.append(f.path)
                    n += f.records
            return {"files": names, "records": n, "paths": paths}
        for e in epochs:
            got, k = self._publish(e, self.staging, checkpoint)
            names.extend(got)
            n += k
        if names:
            fsync_dir(self.staging)
        return {"files": names, "records": n}

    def harden(self, checkpoint: int, handle: Any) -> Any:
        if "paths" not in handle:
            return handle
        for path, name in zip(handle["paths"], handle["files"], strict=True):
            if os.path.exists(path):
                os.replace(path, os.path.join(self.staging, name))
        fsync_dir(self.staging)
        return {"files": handle["files"], "records": handle["records"]}

    def abort(self) -> None:
        for files in [*self.open.values(), *self.sealed.values()]:
            for f in files:
                f.discard()
        self.open, self.sealed = {}, {}
        super().abort()

    def commit_precommit(self, checkpoint: int, handle: Any) -> int:
        moved = False
        paths = handle.get("paths") or [os.path.join(self.staging, name) for name in handle["files"]]
        for staged, name in zip(paths, handle["files"], strict=True):
            final = os.path.join(self.dir, name)
            if os.path.exists(staged):
                os.replace(staged, final)
                moved = True
            elif not os.path.exists(final):
                raise RunFailed(f"sink {self.dir}: the pre-committed file {name} of checkpoint {checkpoint} is missing")
        self.unsynced = self.unsynced or moved
        return handle["records"]

    def sync(self) -> None:
        if self.unsynced:
            fsync_dir(self.dir)
            self.unsynced = False

    def _mine(self, directory: str) -> list[tuple[str, int | None]]:
        """This worker's part files in `directory` and the checkpoint each names (None: none)."""
        out = []
        for name in os.listdir(directory):
            m = PART_NAME.match(name)
            if m and int(m.group(2)) == self.worker:
                out.append((name, None if m.group(3) is None else int(m.group(3))))
        return out

    def recover(self, checkpoint: int, handles: list, retract_above: int | None = None) -> int:
        self.abort()
        n = sum(self.commit_precommit(c, h) for c, h in handles)
        for name, c in self._mine(self.staging):
            if name.endswith((".tmp", ".inprogress")) or c is None or c > checkpoint:
                os.unlink(os.path.join(self.staging, name))
        above = checkpoint if retract_above is None else retract_above
        retracted = [name for name, c in self._mine(self.dir) if c is not None and c > above]
        for name in retracted:
            os.unlink(os.path.join(self.dir, name))
        fsync_dir(self.staging)
        fsync_dir(self.dir)
        self.unsynced = False
        return n

    def close(self) -> None:
        for files in self.open.values():
            for f in files:
                if f.f is not None:
                    f.f.close()
                elif f.writer is not None:
                    f.writer.close()


class LevelDB(Sink):
    """A key-value sink: records are (key, value) pairs, upserted at commit; keys and values
    are stored as msgpack. One database per worker: `<directory>/part-W`."""

    def __init__(self, directory: str, **options: Any) -> None:
        if options:
            raise PipelineError(
                f"unknown option(s) {', '.join(sorted(options))}; LevelDB takes directory",
                "sinks.LevelDB",
                declared_at(),
            )
        self.directory = directory

    def describe(self) -> str:
        """The sink's directory, for messages."""
        return f"LevelDB({self.directory})"

    def open_part(self, worker: int, run_id: str) -> SinkPart:
        """The writer of worker `worker`: its database `<directory>/part-W`."""
        return _LevelDBPart(self.directory, worker)

    def read_committed(self) -> dict:
        """Every committed key and its value, from every part database (for tests and tools)."""
        out: dict = {}
        if not os.path.isdir(self.directory):
            return out
        for name in sorted(os.listdir(self.directory)):
            if not name.startswith("part-"):
                continue
            db = plyvel.DB(os.path.join(self.directory, name))
            try:
                for k, v in db:
                    out[msgpack.unpackb(k, use_list=False, strict_map_key=False)] = msgpack.unpackb(
                        v, strict_map_key=False
                    )
            finally:
                db.close()
        return out


class _LevelDBPart(SinkPart):
    def __init__(self, directory: str, worker: int) -> None:
        super().__init__()
        self.staging = os.path.join(directory, "_staging")
        os.makedirs(self.staging, exist_ok=True)
        self.worker = worker
        self.db = plyvel.DB(os.path.join(directory, f"part-{worker}"), create_if_missing=True)

    @staticmethod
    def _pairs(recs: list) -> list:
        out = []
        for rec in recs:
            try:
                k, v = rec
            except (TypeError, ValueError):
                raise PipelineError(f"the LevelDB sink takes (key, value) records, got {rec!r:.80}") from None
            try:
                out.append((msgpack.packb(k, default=_msgpack_default), msgpack.packb(v, default=_msgpack_default)))
            except (TypeError, ValueError, OverflowError) as e:
                raise PipelineError(
                    f"the LevelDB sink cannot write the record {rec!r:.80}: {type(e).__name__}: {e}; its key and "
                    f"value must be msgpack data (None, bool, int, float, str, bytes, lists, tuples, dicts, sets)"
                ) from None
        return out

    def _put(self, pairs: list) -> None:
        wb = self.db.write_batch(sync=True)
        for k, v in pairs:
            wb.put(k, v)
        wb.write()

    def commit(self, epoch: int) -> int:
        pairs = [p for _, recs in self.take(epoch) for p in self._pairs(recs)]
        self._put(pairs)
        return len(pairs)

    def _staged(self, checkpoint: int) -> str:
        return os.path.join(self.staging, f"w{self.worker:04d}-c{checkpoint:010d}.msgpack")

    def precommit(self, checkpoint: int, upto: int = ALL, durable: bool = True) -> Any:
        pairs = [p for _, recs in self.take(upto) for p in self._pairs(recs)]
        if not pairs:
            return {"records": 0}
        if not durable:
            self.held[checkpoint] = pairs  # in memory, until the commit or `harden`
            return {"records": len(pairs), "held": True}
        return self._stage(checkpoint, pairs)

    def harden(self, checkpoint: int, handle: Any) -> Any:
        pairs = self.held.pop(checkpoint, None) if handle.get("held") else None
        return handle if pairs is None else self._stage(checkpoint, pairs)

    def _stage(self, checkpoint: int, pairs: list) -> Any:
        path = self._staged(checkpoint)
        with open(path + ".tmp", "wb") as f:
            f.write(msgpack.packb(pairs, use_bin_type=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)
        fsync_dir(self.staging)
        return {"records": len(pairs)}

    def commit_precommit(self, checkpoint: int, handle: Any) -> int:
        held = self.held.pop(checkpoint, None)
        if held is not None:
            self._put(held)
            return handle["records"]
        path = self._staged(checkpoint)
        if handle["records"] and os.path.exists(path):
            # the staged file goes only after its upserts are in LevelDB: a crash between the
            # two repeats the same upserts
            with open(path, "rb") as f:
                pairs = msgpack.unpackb(f.read(), raw=False, use_list=False)
            self._put(pairs)
            os.unlink(path)
        return handle["records"]

    def recover(self, checkpoint: int, handles: list, retract_above: int | None = None) -> int:
        self.abort()
        n = sum(self.commit_precommit(c, h) for c, h in handles)
        prefix = f"w{self.worker:04d}-c"
        for name in os.listdir(self.staging):
            if name.startswith(prefix) and (
                name.endswith(".tmp") or int(name[len(prefix) : len(prefix) + 10]) > checkpoint
            ):
                os.unlink(os.path.join(self.staging, name))
        return n

    def close(self) -> None:
        self.db.close()


class Console(Sink):
    """Prints committed records, one per line, prefixed with the worker."""

    def __init__(self, **options: Any) -> None:
        if options:
            raise PipelineError(
                f"unknown option(s) {', '.join(sorted(options))}; Console takes none",
                "sinks.Console",
                declared_at(),
            )

    def open_part(self, worker: int, run_id: str) -> SinkPart:
        """The writer of worker `worker`: it prints what is committed to stdout."""
        return _ConsolePart(worker)


class _ConsolePart(SinkPart):
    def __init__(self, worker: int) -> None:
        super().__init__()
        self.worker = worker

    def commit(self, epoch: int) -> int:
        n = 0
        for e, recs in self.take(epoch):
            sys.stdout.write("".join(f"[w{self.worker} e{e}] {r!r}\n" for r in recs))
            n += len(recs)
        sys.stdout.flush()
        return n


class Null(Sink):
    """Counts and drops records at commit (benchmarks that measure the engine alone)."""

    def open_part(self, worker: int, run_id: str) -> SinkPart:
        """A writer that counts records and drops them."""
        return _NullPart()


class _NullPart(SinkPart):
    """Stages only a count per epoch."""

    order_matters = False

    def write(self, epoch: int, records: list) -> None:
        self.pending[epoch] = self.pending.get(epoch, 0) + len(records)

    def commit(self, epoch: int) -> int:
        return sum(n for _, n in self.take(epoch))

    def precommit(self, checkpoint: int, upto: int = ALL, durable: bool = True) -> Any:
        return self.commit(upto)

    def commit_precommit(self, checkpoint: int, handle: Any) -> int:
        return handle
