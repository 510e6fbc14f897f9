"""Part files: how the Files sink (`nosync.api.sink_files`) turns records into files and back.

A part file holds the records one worker committed of one epoch (under one checkpoint, in
the modes that commit in two phases). Its name says so (`PART_NAME`), so that the committed
output can be read back by epoch and a worker can find its own files again after a crash.
Two formats:

- JSONL: one JSON value per line; a tuple becomes an array, bytes become text, a set the
  list of its sorted items.
- Parquet: records as rows of an Arrow table whose layout (`LAYOUT_KEY` in the schema
  metadata) says how to give the records back: dicts as rows, (key, value) pairs as two
  columns, scalars as one column, or JSON text for records no Arrow column can hold.

A `PartFile` is written on the worker's own disk while its records arrive, so that a commit
has only a flush and a move left to do. Reading (`parquet_records`, and the JSONL reading of
`Files.read_committed`) goes through `nosync.storage`, so committed output on an object
store reads back as from a local directory.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

from nosync import storage

PART_NAME = re.compile(r"^part-(\d+)-w(\d+)(?:-c(\d+))?(?:-(\d+))?\.")
"""A committed part file's name: epoch, worker, the checkpoint it was committed under (modes
that commit in two phases) and its index within the epoch."""
ROW_GROUP = 65_536
"""Records a Parquet part file buffers before it writes them as a row group."""
LAYOUT_KEY = b"nosync.layout"
"""The key of a Parquet part file's schema metadata that names its layout."""


def json_default(obj: Any) -> Any:
    """What `json.dumps` writes for the types JSON has not: bytes as text, a set as the list of
    its sorted items."""
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "backslashreplace")
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise TypeError(f"cannot write a {type(obj).__name__} as JSON")


def arrow_table(recs: list) -> Any:
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
        text = [json.dumps(r, default=json_default, separators=(",", ":")) for r in recs]
        return tagged(pa.table({"value": pa.array(text, pa.string())}), "json")


def parquet_records(where: str) -> list:
    """The records of the Parquet part file `where` (a local path or a URI), as `arrow_table`
    laid them out."""
    import pyarrow.parquet as pq  # lazy: pyarrow costs ~0.3 s to import and only this path needs it

    if storage.is_local(where):
        table = pq.read_table(storage.local_path(where))
    else:
        fs, path = storage.resolve(where)
        table = pq.read_table(path, filesystem=fs)
    layout = (table.schema.metadata or {}).get(LAYOUT_KEY, b"rows").decode()
    if layout == "pairs":
        keys = table.column("key").to_pylist()
        return [list(kv) for kv in zip(keys, table.column("value").to_pylist(), strict=True)]
    if layout == "values":
        return table.column("value").to_pylist()
    if layout == "json":
        return [json.loads(t) for t in table.column("value").to_pylist()]
    return table.to_pylist()


def jsonl_records(where: str) -> list:
    """The records of the JSONL part file `where` (a local path or a URI)."""
    if storage.is_local(where):
        with open(storage.local_path(where), encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    return [json.loads(line) for line in storage.read_bytes(where).splitlines() if line.strip()]


class PartFile:
    """One part file being written on this host while its records arrive, so that a commit or
    pre-commit has only a flush, an fsync and a move left to do. Without `fsync` (a file that
    an upload, not this disk, makes durable) `finish` only closes it."""

    def __init__(self, path: str, fmt: str, fsync: bool = True) -> None:
        self.path = path
        self.fmt = fmt
        self.fsync = fsync
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
                ("\n".join(json.dumps(r, default=json_default, separators=(",", ":")) for r in recs) + "\n").encode()
            )
        else:
            table = arrow_table(recs)
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
        """Writes what is buffered, fsyncs (unless made without `fsync`) and closes."""
        if self.f is not None:
            self.f.flush()
            if self.fsync:
                os.fsync(self.f.fileno())
            self.f.close()
            return
        if self.buffer:
            self._row_group()
        if self.writer is not None:
            self.writer.close()
            if not self.fsync:
                return
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def discard(self) -> None:
        """Closes the file, whatever state it is in, and deletes it."""
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

    def close(self) -> None:
        """Closes the file without finishing it (a part closed with records not committed)."""
        if self.f is not None:
            self.f.close()
        elif self.writer is not None:
            self.writer.close()
