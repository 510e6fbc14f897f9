"""Sources: partitioned, replayable inputs.

A source splits itself into partitions (`partitions()`), descriptions small enough to travel in
a task; partition i is read by worker i % W. A partition is read from an offset (`read(part,
offset)`) as an iterator of (records, next offset) chunks, so that a reader can resume exactly
where a checkpoint or a log says: offsets are record counts for the generator, byte offsets
for text/JSONL files, [rows, line of the last bad row] for CSV, rows of the row group for
Parquet. The runtime cuts each partition's records
into epochs (by count or interval).

A malformed record raises BadRecord from `read` through `on_bad`: the runtime's policy sends it
to the dead-letter file with its source and position, or fails the run.
"""

from __future__ import annotations

import glob
import json
import os
import random
import socket
from collections.abc import Callable, Iterator
from typing import Any

from nosync.api.where import declared_at
from nosync.errors import BadRecord, PipelineError

Chunk = tuple[list, Any]
BadHandler = Callable[[BadRecord], None]


def _raise(bad: BadRecord) -> None:
    raise bad


class Source:
    """Base of all sources."""

    replayable = True

    def partitions(self) -> list[dict]:
        """The source's partitions, descriptions small enough to travel in a task."""
        raise NotImplementedError

    def read(self, part: dict, offset: Any, chunk: int, on_bad: BadHandler = _raise) -> Iterator[Chunk]:
        """Partition `part` from `offset` on, as (records, next offset) chunks of about `chunk`
        records; a malformed record goes to `on_bad`."""
        raise NotImplementedError

    def describe(self) -> str:
        """A short description of the source, for messages (the base: its class name)."""
        return type(self).__name__


def _check_options(kind: str, options: dict, known: set[str]) -> None:
    unknown = set(options) - known
    if unknown:
        raise PipelineError(
            f"unknown option(s) {', '.join(sorted(unknown))}; {kind} takes {', '.join(sorted(known))}",
            kind,
            declared_at(),
        )


class Generator(Source):
    """A deterministic generator: record i is fn(i), or by default the key string of a keyed
    workload, str of a key drawn uniformly (skew 0) or Zipf-skewed from `keys` keys.

    >>> list(Generator(records=4, keys=2, partitions=1).read({"p": 0, "of": 1}, 0, 10))
    [(['0', '1', '0', '1'], 4)]
    """

    def __init__(
        self,
        records: int = 1000,
        keys: int = 100,
        skew: float = 0.0,
        fn: Callable[[int], Any] | None = None,
        partitions: int | None = None,
        seed: int = 1,
    ) -> None:
        bad = None
        if not isinstance(records, int) or records < 0:
            bad = f"records must be a non-negative int, got {records!r}"
        elif not isinstance(keys, int) or keys < 1:
            bad = f"keys must be a positive int, got {keys!r}"
        elif skew < 0:
            bad = f"skew must be >= 0 (0: uniform; Zipf exponent otherwise), got {skew!r}"
        if bad:
            raise PipelineError(bad, "Generator", declared_at())
        self.records, self.keys, self.skew, self.fn, self.seed = records, keys, skew, fn, seed
        self.partitions_ = partitions

    def partitions(self, workers: int | None = None) -> list[dict]:
        """`partitions` partitions if given, else one per worker: partition p of n holds records p,
        p + n, p + 2n..."""
        n = self.partitions_ or workers or 1
        return [{"p": i, "of": n} for i in range(n)]

    def _key_table(self) -> list[str] | None:
        if self.skew == 0:
            return None
        rng = random.Random(self.seed)
        weights = [1.0 / (r + 1) ** self.skew for r in range(self.keys)]
        return [str(k) for k in rng.choices(range(self.keys), weights, k=min(self.records, 1 << 20) or 1)]

    def read(self, part: dict, offset: Any, chunk: int, on_bad: BadHandler = _raise) -> Iterator[Chunk]:
        """The records of partition `part` from `offset` (a count of its records) on, in chunks of
        at most `chunk`."""
        p, of = part["p"], part["of"]
        # partition p holds records i = p, p + of, p + 2*of, ...; offset counts them
        total = (self.records - p + of - 1) // of if self.records > p else 0
        fn = self.fn
        keys = self.keys
        table = self._key_table()
        pos = int(offset or 0)
        while pos < total:
            end = min(total, pos + chunk)
            idx = range(p + pos * of, p + end * of, of)
            if fn is not None:
                recs = [fn(i) for i in idx]
            elif table is None:
                recs = [str(i % keys) for i in idx]
            else:
                n = len(table)
                recs = [table[i % n] for i in idx]
            yield recs, end
            pos = end


class Files(Source):
    """Files matching a glob, one partition per file (per row group for Parquet).

    format: "text" (lines), "jsonl" (one JSON value per line), "csv" (rows as dicts, header
    line first, parsed by pyarrow.csv), "parquet" (rows as dicts, via pyarrow).
    """

    FORMATS = ("text", "jsonl", "csv", "parquet")

    def __init__(self, path: str, format: str | None = None, **options: Any) -> None:
        _check_options("Files", options, {"encoding"})
        self.path = path
        fmt = format or os.path.splitext(path)[1].lstrip(".").lower() or "text"
        fmt = {"txt": "text", "json": "jsonl", "ndjson": "jsonl", "pq": "parquet"}.get(fmt, fmt)
        if fmt not in self.FORMATS:
            raise PipelineError(
                f"unknown file format {fmt!r} for {path}; formats: {', '.join(self.FORMATS)}",
                "Files",
                declared_at(),
            )
        self.format = fmt
        self.encoding = options.get("encoding", "utf-8")

    def _files(self) -> list[str]:
        files = sorted(glob.glob(self.path)) if any(c in self.path for c in "*?[") else [self.path]
        files = [f for f in files if os.path.isfile(f)]
        if not files:
            raise PipelineError(f"no input files match {self.path}", "Files")
        return files

    def partitions(self, workers: int | None = None) -> list[dict]:
        """One partition per matching file (per row group for Parquet); raises PipelineError when no
        file matches."""
        parts = []
        for f in self._files():
            if self.format == "parquet":
                import pyarrow.parquet as pq  # lazy: pyarrow costs ~0.3 s to import and only this path needs it

                for rg in range(pq.ParquetFile(f).num_row_groups):
                    parts.append({"file": f, "row_group": rg})
            else:
                parts.append({"file": f})
        return parts

    def describe(self) -> str:
        """The source's path and format, for messages."""
        return f"Files({self.path}, {self.format})"

    def read(self, part: dict, offset: Any, chunk: int, on_bad: BadHandler = _raise) -> Iterator[Chunk]:
        """The records of a file (or row group) from `offset` on, read as the format says, in chunks
        sized after `chunk`; a malformed record goes to `on_bad`."""
        if self.format == "parquet":
            yield from self._read_parquet(part, offset, chunk)
        elif self.format == "csv":
            yield from self._read_csv(part, offset, chunk, on_bad)
        else:
            yield from self._read_lines(part, offset, chunk, on_bad)

    def _read_lines(self, part: dict, offset: Any, chunk: int, on_bad: BadHandler) -> Iterator[Chunk]:
        path = part["file"]
        jsonl = self.format == "jsonl"
        enc = self.encoding
        with open(path, "rb") as f:
            pos = int(offset or 0)
            f.seek(pos)
            while True:
                lines = f.readlines(max(chunk * 64, 1 << 16))
                if not lines:
                    return
                recs = []
                for raw in lines:
                    start = pos
                    pos += len(raw)
                    line = raw.rstrip(b"\r\n")
                    try:
                        text = line.decode(enc)
                        if jsonl:
                            if not text.strip():
                                continue
                            recs.append(json.loads(text))
                        else:
                            recs.append(text)
                    except (UnicodeDecodeError, ValueError) as e:
                        on_bad(
                            BadRecord(
                                f"{type(e).__name__}: {e}",
                                path,
                                {"byte": start, "raw": line[:200].decode("utf-8", "replace")},
                            )
                        )
                yield recs, pos

    def _read_csv(self, part: dict, offset: Any, chunk: int, on_bad: BadHandler) -> Iterator[Chunk]:
        import pyarrow.csv as pacsv  # lazy: pyarrow costs ~0.3 s to import and only this path needs it

        path = part["file"]
        bad_rows: list[BadRecord] = []

        def invalid(row: Any) -> str:
            bad_rows.append(
                BadRecord(
                    f"{row.expected_columns} columns expected, {row.actual_columns} found",
                    path,
                    {"row": row.number, "raw": row.text[:200]},
                )
            )
            return "skip"

        # the offset is [good rows consumed, line of the last bad row reported], so that a
        # resumed read neither repeats good rows nor reports a bad row twice
        skip, reported = (int(offset[0]), int(offset[1])) if offset else (0, 0)
        # use_threads=False: only a single-threaded parse knows the line number of a bad row
        reader = pacsv.open_csv(
            path,
            parse_options=pacsv.ParseOptions(invalid_row_handler=invalid),
            read_options=pacsv.ReadOptions(block_size=1 << 20, use_threads=False),
        )

        def report() -> None:
            nonlocal reported
            for b in bad_rows:
                line = b.position["row"] or 0
                if line > reported:
                    on_bad(b)
                    reported = line
            bad_rows.clear()

        row = 0
        for batch in reader:
            recs = batch.to_pylist()
            report()
            first = row
            row += len(recs)
            if row <= skip:
                continue
            if first < skip:
                recs = recs[skip - first :]
            yield recs, [row, reported]
        report()  # bad rows of a last block that had no good row

    def _read_parquet(self, part: dict, offset: Any, chunk: int) -> Iterator[Chunk]:
        import pyarrow.parquet as pq  # lazy: pyarrow costs ~0.3 s to import and only this path needs it

        table = pq.ParquetFile(part["file"]).read_row_group(part["row_group"])
        pos = int(offset or 0)
        n = table.num_rows
        while pos < n:
            end = min(n, pos + chunk)
            yield table.slice(pos, end - pos).to_pylist(), end
            pos = end


class TcpLines(Source):
    """Lines from a TCP server (host:port), one partition, read by worker 0. Not replayable by
    itself: only the nosync mode's input log makes it so."""

    replayable = False

    def __init__(self, host: str, port: int, **options: Any) -> None:
        _check_options("TcpLines", options, {"encoding"})
        if not isinstance(port, int) or not 0 < port < 65536:
            raise PipelineError(f"port must be 1..65535, got {port!r}", "TcpLines", declared_at())
        self.host, self.port = host, port
        self.encoding = options.get("encoding", "utf-8")

    def partitions(self, workers: int | None = None) -> list[dict]:
        """The one partition: the server's address (whatever `workers`)."""
        return [{"addr": f"{self.host}:{self.port}"}]

    def describe(self) -> str:
        """The server's address, for messages."""
        return f"TcpLines({self.host}:{self.port})"

    def read(self, part: dict, offset: Any, chunk: int, on_bad: BadHandler = _raise) -> Iterator[Chunk]:
        """Connects to the server and yields its lines after the first `offset` (read and skipped),
        decoded, in chunks of `chunk`; an undecodable line goes to `on_bad`."""
        pos = int(offset or 0)
        with socket.create_connection((self.host, self.port), timeout=30) as s, s.makefile("rb") as f:
            recs: list = []
            n = 0
            for raw in f:
                n += 1
                if n <= pos:
                    continue
                try:
                    recs.append(raw.rstrip(b"\r\n").decode(self.encoding))
                except UnicodeDecodeError as e:
                    on_bad(BadRecord(str(e), self.describe(), {"line": n}))
                if len(recs) >= chunk:
                    yield recs, n
                    recs = []
            if recs:
                yield recs, n
