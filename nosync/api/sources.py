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

import codecs
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

    def due(self, part: dict, offset: Any) -> float | None:
        """Seconds after the run's source clock started at which the record at `offset` of
        `part` is due, for a source paced in time (`Generator(rate=...)`); None (the base): the
        source is read as fast as the run can."""
        return None


def _check_options(kind: str, options: dict, known: set[str]) -> None:
    unknown = set(options) - known
    if unknown:
        raise PipelineError(
            f"unknown option(s) {', '.join(sorted(unknown))}; {kind} takes {', '.join(sorted(known))}",
            kind,
            declared_at(),
        )


def _encoding(kind: str, options: dict) -> str:
    """The `encoding` option, checked here so that a misspelt one fails where the pipeline
    declares the source, not in a worker; its canonical name ("UTF8" is "utf-8")."""
    name = options.get("encoding", "utf-8")
    try:
        return codecs.lookup(name).name
    except (LookupError, TypeError):
        raise PipelineError(f"unknown encoding {name!r}", kind, declared_at()) from None


class Generator(Source):
    """A deterministic generator: record i of the source is fn(i), or by default the key string
    of a keyed workload.

    - `records`: how many (None: unbounded, until the run is stopped).
    - `keys`, `draw`, `skew`: record i's key is str of a key in [0, keys): i % keys with
      draw="cycle" (the default), or drawn at random with draw="random", uniformly (skew 0) or
      Zipf-skewed (skew > 0, the exponent; a skew implies a random draw). A draw is a function
      of (seed, i) alone, so a partition read again from any position yields the same records.
    - `value_bytes`: when > 0, each record is (key, value), value a string of that many
      ASCII characters drawn like the key, so that a state holding it grows with the keys.
    - `rate`: records per second per partition, open loop. Record j of a partition is due
      j / rate seconds after the run's source clock started; it is not read before, and its
      event time (the latency's start) is when it was due, not when it was read, so the
      latency counts the queueing a slow run causes. None: as fast as the run reads.

    >>> list(Generator(records=4, keys=2, partitions=1).read({"p": 0, "of": 1}, 0, 10))
    [(['0', '1', '0', '1'], 4)]
    """

    DRAWS = ("cycle", "random")

    def __init__(
        self,
        records: int | None = 1000,
        keys: int = 100,
        skew: float = 0.0,
        fn: Callable[[int], Any] | None = None,
        partitions: int | None = None,
        seed: int = 1,
        rate: float | None = None,
        draw: str = "cycle",
        value_bytes: int = 0,
    ) -> None:
        bad = None
        if records is not None and (not isinstance(records, int) or isinstance(records, bool) or records < 0):
            bad = f"records must be a non-negative int or None (unbounded), got {records!r}"
        elif not isinstance(keys, int) or keys < 1:
            bad = f"keys must be a positive int, got {keys!r}"
        elif not isinstance(skew, (int, float)) or skew < 0:
            bad = f"skew must be >= 0 (0: uniform; Zipf exponent otherwise), got {skew!r}"
        elif rate is not None and (not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0):
            bad = f"rate must be > 0 records/s per partition (None: unpaced), got {rate!r}"
        elif draw not in self.DRAWS:
            bad = f"draw must be one of {', '.join(self.DRAWS)}, got {draw!r}"
        elif not isinstance(value_bytes, int) or isinstance(value_bytes, bool) or value_bytes < 0:
            bad = f"value_bytes must be an int >= 0, got {value_bytes!r}"
        elif partitions is not None and (not isinstance(partitions, int) or partitions < 1):
            bad = f"partitions must be a positive int or None (one per worker), got {partitions!r}"
        if bad:
            raise PipelineError(bad, "Generator", declared_at())
        self.records, self.keys, self.skew, self.fn, self.seed = records, keys, skew, fn, seed
        self.rate = None if rate is None else float(rate)
        self.draw = "random" if skew else draw
        self.value_bytes = value_bytes
        self.partitions_ = partitions

    def partitions(self, workers: int | None = None) -> list[dict]:
        """`partitions` partitions if given, else one per worker: partition p of n holds records p,
        p + n, p + 2n..."""
        n = self.partitions_ or workers or 1
        return [{"p": i, "of": n} for i in range(n)]

    def describe(self) -> str:
        """The generator's size and pace, for messages."""
        size = "unbounded" if self.records is None else f"{self.records} records"
        pace = "" if self.rate is None else f", {self.rate:g}/s per partition"
        return f"Generator({size}{pace})"

    def _total(self, part: dict) -> int | None:
        p, of = part["p"], part["of"]
        if self.records is None:
            return None
        return (self.records - p + of - 1) // of if self.records > p else 0

    def due(self, part: dict, offset: int) -> float | None:
        """Seconds after the source clock's start at which the record at `offset` (a count of
        the partition's records) is due; None when the generator is not paced. Past the last
        record, the last one's time."""
        if self.rate is None:
            return None
        total = self._total(part)
        if total is not None:
            offset = min(offset, max(total - 1, 0))
        return offset / self.rate

    def read(self, part: dict, offset: Any, chunk: int, on_bad: BadHandler = _raise) -> Iterator[Chunk]:
        """The records of partition `part` from `offset` (a count of its records) on, in chunks of
        at most `chunk`."""
        p, of = part["p"], part["of"]
        # partition p holds records i = p, p + of, p + 2*of, ...; offset counts them
        total = self._total(part)
        pos = int(offset or 0)
        while total is None or pos < total:
            end = pos + chunk if total is None else min(total, pos + chunk)
            yield self._records(range(p + pos * of, p + end * of, of)), end
            pos = end

    def _records(self, idx: range) -> list:
        if self.fn is not None:
            fn = self.fn
            return [fn(i) for i in idx]
        if self.draw == "cycle" and not self.value_bytes:
            keys = self.keys
            return [str(i % keys) for i in idx]
        import numpy as np  # lazy: only generated workloads that draw at random need it

        mixed = _mix(np.arange(idx.start, idx.stop, idx.step, dtype=np.uint64), self.seed)
        if self.draw == "cycle":
            ks = np.arange(idx.start, idx.stop, idx.step, dtype=np.int64) % self.keys
        elif self.skew:
            u = (mixed >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
            ks = np.searchsorted(_zipf_cdf(self.keys, self.skew), u, side="right")
        else:
            ks = mixed % np.uint64(self.keys)
        keys = [str(k) for k in ks.tolist()]
        if not self.value_bytes:
            return keys
        n = self.value_bytes
        blob = _blob(n)
        starts = ((mixed >> np.uint64(32)) % np.uint64(_BLOB_SPAN)).tolist()
        return [(k, blob[s : s + n]) for k, s in zip(keys, starts, strict=True)]


_BLOB_SPAN = 4096
_BLOBS: list[str] = [""]


def _blob(n: int) -> str:
    """The text values of `n` characters are cut from (one per process, grown as needed)."""
    if len(_BLOBS[0]) < _BLOB_SPAN + n:
        rng = random.Random(0)
        _BLOBS[0] = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(_BLOB_SPAN + n))
    return _BLOBS[0]


def _mix(x: Any, seed: int) -> Any:
    """A 64-bit hash of each index (splitmix64's finalizer over index and seed), as uint64."""
    import numpy as np  # lazy: see Generator._records

    with np.errstate(over="ignore"):
        z = x + np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


_CDFS: dict[tuple[int, float], Any] = {}


def _zipf_cdf(keys: int, skew: float) -> Any:
    """The cumulative Zipf(skew) probabilities of ranks 0..keys-1 (cached per process)."""
    import numpy as np  # lazy: see Generator._records

    cdf = _CDFS.get((keys, skew))
    if cdf is None:
        w = 1.0 / np.arange(1, keys + 1, dtype=np.float64) ** skew
        cdf = np.cumsum(w)
        cdf /= cdf[-1]
        cdf[-1] = 1.0
        _CDFS.clear()
        _CDFS[(keys, skew)] = cdf
    return cdf


class Files(Source):
    """Files matching a glob, one partition per file (per row group for Parquet).

    format: "text" (lines), "jsonl" (one JSON value per line), "csv" (rows as dicts, header
    line first, parsed by pyarrow.csv), "parquet" (rows as dicts, via pyarrow).

    encoding: of text, JSONL and CSV files (Parquet is read as stored). A text or JSONL line it
    cannot decode is a malformed record. A CSV file in another encoding than UTF-8 is transcoded
    to UTF-8 as a stream before it is parsed, block by block as UTF-8 CSV is, so offsets and
    bad-row lines are the same; but a byte it cannot decode fails the read of the file (the
    transcoder has no row to blame), not a dead letter.
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
        self.encoding = _encoding("Files", options)

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
            try:
                yield from self._read_csv(part, offset, chunk, on_bad)
            except UnicodeDecodeError as e:  # from pyarrow's transcoder, which has no row to blame
                raise PipelineError(f"{part['file']} is not {self.encoding} text: {e}", "Files") from None
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
            read_options=pacsv.ReadOptions(block_size=1 << 20, use_threads=False, encoding=self.encoding),
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
        self.encoding = _encoding("TcpLines", options)

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
