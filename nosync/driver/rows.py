"""The run's series that grow with its length, streamed to files as their rows are made.

A run may last days, so the driver keeps none of them whole: the events, the coordinator's
per-worker progress rows (every 0.1 s) and the runner's progress samples (every 0.25 s) each go
to a JSON-lines file in the run directory as they are made (one line per row, flushed, so an
observer reads what has happened so far), and only the last KEEP rows stay in memory. Whoever
needs a whole series again reads the file back a row at a time (iterating a `RowLog`); at the end
of the run `to_parquet` turns a series into its Parquet table a row group at a time.
"""

from __future__ import annotations

import json
import os
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

KEEP = 1000
"""Rows a `RowLog` keeps in memory: the newest."""
ROW_GROUP_ROWS = 10_000
"""Rows `to_parquet` holds at a time: one row group of the table it writes."""


class RowLog:
    """A series of rows (dicts) appended to a JSON-lines file at `path` as they come, the newest
    KEEP of them also in memory (`tail`). Without a path, only the tail is kept.

    Iterating yields every row appended so far, in order: from the file when there is one
    (read a line at a time), else (no path, or the file removed) the tail. Appends may come
    from several threads.

    >>> log = RowLog(None, keep=2)
    >>> log.extend([{"t": 1}, {"t": 2}, {"t": 3}])
    >>> [r["t"] for r in log]
    [2, 3]
    """

    def __init__(self, path: str | None, keep: int = KEEP, append: bool = False) -> None:
        self.path = path
        self.tail: deque[dict] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._file: Any = None
        self._removed = False
        if path is not None:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self._file = open(path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115 - open for the run

    def append(self, row: dict) -> None:
        """Adds `row` to the series (written and flushed at once)."""
        self.extend((row,))

    def extend(self, rows: Iterable[dict]) -> None:
        """Adds `rows` to the series, in order (one write and one flush)."""
        rows = list(rows)
        if not rows:
            return
        with self._lock:
            self.tail.extend(rows)
            if self.path is None or self._removed:
                return
            if self._file is None:
                self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
            self._file.write("".join(json.dumps(r, default=str) + "\n" for r in rows))
            self._file.flush()

    def close(self) -> None:
        """Closes the file (a row appended after opens it again, to append)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def remove(self) -> None:
        """Closes the file and deletes it (its table was written elsewhere); rows appended
        after are kept in the tail only."""
        self.close()
        with self._lock:
            self._removed = True
            if self.path is not None and os.path.exists(self.path):
                os.remove(self.path)

    def __iter__(self) -> Iterator[dict]:
        if self.path is None or self._removed:
            with self._lock:
                return iter(list(self.tail))
        return read_rows(self.path)


def read_rows(path: str) -> Iterator[dict]:
    """The rows of a JSON-lines file, a line at a time; a last line still being written (no
    newline yet) is not one."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                return
            if line.strip():
                yield json.loads(line)


def _batches(rows: Iterable[dict], size: int) -> Iterator[list[dict]]:
    batch: list[dict] = []
    for r in rows:
        batch.append(r)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def to_parquet(rows: Iterable[dict], path: str, batch_rows: int = ROW_GROUP_ROWS) -> int:
    """Writes `rows` (iterated twice: a list or a `RowLog`) as the Parquet table at `path`, a row
    group of `batch_rows` at a time: the first pass finds the schema all rows fit (a column
    null at first and an int later, an int that becomes a float), the second writes. Writes
    nothing for no rows; returns how many it wrote."""
    import pyarrow as pa  # lazy: pyarrow costs ~0.3 s to import and only this path needs it
    import pyarrow.parquet as pq  # lazy: pyarrow costs ~0.3 s to import and only this path needs it

    schema: Any = None
    for batch in _batches(rows, batch_rows):
        s = pa.Table.from_pylist(batch).schema
        schema = s if schema is None else pa.unify_schemas([schema, s], promote_options="permissive")
    if schema is None:
        return 0
    n = 0
    with pq.ParquetWriter(path, schema) as writer:
        for batch in _batches(rows, batch_rows):
            writer.write_table(pa.Table.from_pylist(batch, schema=schema), row_group_size=batch_rows)
            n += len(batch)
    return n


__all__ = ["KEEP", "ROW_GROUP_ROWS", "RowLog", "read_rows", "to_parquet"]
