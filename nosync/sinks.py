"""Sinks: where a run's output is committed. "Exactly once" is judged on committed output.

Each worker has its own instance of a sink (a "part"). Records are staged per epoch and become
visible only at `commit(epoch)`, which the fault-tolerance mode calls when the epoch is safe
(mode none: when every input of the sink has finished the epoch; abs: a completed checkpoint;
nosync: a safe point):

- Files: one staged file per (epoch, worker) under `<dir>/_staging/`, fsynced, renamed into
  `<dir>/` at commit (atomic on a POSIX file system), then the directory is fsynced; a re-run
  of a committed epoch replaces the same name.
- LevelDB: a key-value sink of (key, value) records; the epoch's upserts go in one write batch
  at commit (idempotent: a replayed epoch writes the same values). One LevelDB per worker
  (`<dir>/part-W`), since LevelDB allows one process per database.
- Console: prints committed records.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from lsm.files import fsync_dir
from nosync.errors import PipelineError
from nosync.pipeline import _declared_at


class Sink:
    """Base of all sinks: `open_part` gives the per-worker writer."""

    def open_part(self, worker: int, run_id: str) -> SinkPart:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


class SinkPart:
    """One worker's writer: write() stages, commit(epoch) publishes, close() ends.

    The base stages records per epoch in memory; `take(epoch)` hands a commit the staged
    epochs up to `epoch`, oldest first."""

    def __init__(self) -> None:
        self.pending: dict[int, list] = {}

    def write(self, epoch: int, records: list) -> None:
        self.pending.setdefault(epoch, []).extend(records)

    def take(self, epoch: int) -> list[tuple[int, list]]:
        due = sorted(e for e in self.pending if e <= epoch)
        return [(e, self.pending.pop(e)) for e in due]

    def commit(self, epoch: int) -> int:
        """Publishes everything staged for epochs <= `epoch`; returns how many records."""
        raise NotImplementedError

    def abort(self) -> None:
        """Drops what is staged and not committed."""
        self.pending.clear()

    def close(self) -> None:
        pass


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
                _declared_at(),
            )
        if format not in self.FORMATS:
            raise PipelineError(
                f"unknown format {format!r}; formats: {', '.join(self.FORMATS)}",
                "sinks.Files",
                _declared_at(),
            )
        self.directory = directory
        self.format = format

    def describe(self) -> str:
        return f"Files({self.directory}, {self.format})"

    def open_part(self, worker: int, run_id: str) -> SinkPart:
        return _FilesPart(self.directory, self.format, worker)

    def read_committed(self) -> list:
        """Every committed record, part files in name order (for tests and tools)."""
        out: list = []
        if not os.path.isdir(self.directory):
            return out
        for name in sorted(os.listdir(self.directory)):
            path = os.path.join(self.directory, name)
            if name.endswith(".jsonl"):
                with open(path, encoding="utf-8") as f:
                    out.extend(json.loads(line) for line in f if line.strip())
            elif name.endswith(".parquet"):
                out.extend(_parquet_records(path))
        return out


LAYOUT_KEY = b"nosync.layout"


def _arrow_table(recs: list) -> Any:
    """Records as an Arrow table, with the layout named in the schema metadata so that
    `read_committed` gives back what was written: "rows" (dicts as rows), "pairs" ((key, value)
    as two columns), "values" (one column), "json" (one column of JSON text, for records whose
    types Arrow cannot put in one column). The layout is chosen by the first record and checked
    by the conversion itself: a record of another shape falls through to the next layout."""
    import pyarrow as pa

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
    import pyarrow.parquet as pq

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


class _FilesPart(SinkPart):
    def __init__(self, directory: str, fmt: str, worker: int) -> None:
        super().__init__()
        self.dir = directory
        self.staging = os.path.join(directory, "_staging")
        os.makedirs(self.staging, exist_ok=True)
        self.fmt = fmt
        self.worker = worker

    def _name(self, epoch: int) -> str:
        return f"part-{epoch:010d}-w{self.worker:04d}.{self.fmt}"

    def commit(self, epoch: int) -> int:
        n = 0
        for e, recs in self.take(epoch):
            if not recs:
                continue
            staged = os.path.join(self.staging, self._name(e) + ".tmp")
            if self.fmt == "jsonl":
                with open(staged, "w", encoding="utf-8") as f:
                    f.write("\n".join(json.dumps(r, default=_json_default, separators=(",", ":")) for r in recs))
                    f.write("\n")
                    f.flush()
                    os.fsync(f.fileno())
            else:
                import pyarrow.parquet as pq

                with open(staged, "wb") as f:
                    pq.write_table(_arrow_table(recs), f)
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(staged, os.path.join(self.dir, self._name(e)))
            n += len(recs)
        if n:
            fsync_dir(self.dir)
        return n

class LevelDB(Sink):
    """A key-value sink: records are (key, value) pairs, upserted at commit; keys and values
    are stored as msgpack. One database per worker: `<directory>/part-W`."""

    def __init__(self, directory: str, **options: Any) -> None:
        if options:
            raise PipelineError(
                f"unknown option(s) {', '.join(sorted(options))}; LevelDB takes directory",
                "sinks.LevelDB",
                _declared_at(),
            )
        self.directory = directory

    def describe(self) -> str:
        return f"LevelDB({self.directory})"

    def open_part(self, worker: int, run_id: str) -> SinkPart:
        return _LevelDBPart(os.path.join(self.directory, f"part-{worker}"))

    def read_committed(self) -> dict:
        import msgpack
        import plyvel

        out: dict = {}
        if not os.path.isdir(self.directory):
            return out
        for name in sorted(os.listdir(self.directory)):
            db = plyvel.DB(os.path.join(self.directory, name))
            try:
                for k, v in db:
                    out[msgpack.unpackb(k, use_list=False)] = msgpack.unpackb(v)
            finally:
                db.close()
        return out


class _LevelDBPart(SinkPart):
    def __init__(self, path: str) -> None:
        import plyvel

        super().__init__()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.db = plyvel.DB(path, create_if_missing=True)

    def commit(self, epoch: int) -> int:
        import msgpack

        n = 0
        wb = self.db.write_batch(sync=True)
        for _, recs in self.take(epoch):
            for rec in recs:
                try:
                    k, v = rec
                except (TypeError, ValueError):
                    raise PipelineError(f"the LevelDB sink takes (key, value) records, got {rec!r:.80}") from None
                wb.put(msgpack.packb(k), msgpack.packb(v))
                n += 1
        wb.write()
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
                _declared_at(),
            )

    def open_part(self, worker: int, run_id: str) -> SinkPart:
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
        return _NullPart()


class _NullPart(SinkPart):
    """Stages only a count per epoch."""

    def write(self, epoch: int, records: list) -> None:
        self.pending[epoch] = self.pending.get(epoch, 0) + len(records)

    def commit(self, epoch: int) -> int:
        return sum(n for _, n in self.take(epoch))
