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

- Files (`nosync.api.sink_files`): part files, JSONL or Parquet, one per (epoch, worker[,
  checkpoint]), written on the worker's host as records arrive; committed by rename in a local
  directory, and by a server-side copy of an uploaded object under an object store's URI, where
  there is no rename. Names carry the checkpoint, so one that cuts an epoch in two gives two
  files, and a commit repeated after a crash writes the same names with the same bytes.
- LevelDB: a key-value sink of (key, value) records; the upserts go in one write batch at
  commit (idempotent: a replayed commit writes the same values). One LevelDB per worker
  (`<dir>/part-W`), since LevelDB allows one process per database; pre-commits are msgpack
  files under `<dir>/_staging/`.
- Console: prints committed records.
"""

from __future__ import annotations

__all__ = ["ALL", "PART_NAME", "Console", "Files", "LevelDB", "Null", "Sink", "SinkPart"]

import os
import sys
from typing import Any

import msgpack
import plyvel

from lsm.files import fsync_dir
from nosync import storage
from nosync.api.part_files import PART_NAME
from nosync.api.sink_base import ALL, Sink, SinkPart
from nosync.api.sink_files import Files
from nosync.api.where import declared_at
from nosync.errors import PipelineError


def _msgpack_default(obj: Any) -> Any:
    # a set is written as the list of its items, in order when they can be ordered (so that
    # equal sets give equal bytes), as the JSON sink writes it
    if isinstance(obj, set | frozenset):
        try:
            return sorted(obj)
        except TypeError:
            return list(obj)
    raise TypeError(f"cannot write a {type(obj).__name__} as msgpack")


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
        if not storage.is_local(directory):
            # every worker opens its own database where it runs, and LevelDB writes through POSIX
            raise PipelineError(
                f"LevelDB needs a local path on every worker's host, not {storage.redact(directory)}; "
                "a sink to an object store is Files",
                "sinks.LevelDB",
                declared_at(),
            )
        self.directory = storage.local_path(directory) if storage.is_uri(directory) else directory

    def describe(self) -> str:
        """The sink's directory, for messages."""
        return f"LevelDB({self.directory})"

    def open_part(self, worker: int, run_id: str, local_dir: str | None = None) -> SinkPart:
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

    def open_part(self, worker: int, run_id: str, local_dir: str | None = None) -> SinkPart:
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

    def open_part(self, worker: int, run_id: str, local_dir: str | None = None) -> SinkPart:
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
