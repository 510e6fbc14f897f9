"""The part of a Files sink each worker writes (`Files.open_part`): one file per epoch under
`<dir>/_staging/`, written as its records arrive, finished (fsynced) when its epoch is sealed
or pre-committed, renamed into `<dir>/` at commit. A durable pre-commit's files are finished
and staged on a thread of the part's own (`settled`, `settle`); see `nosync.api.sinks` for
the commit protocol."""

from __future__ import annotations

import json
import os
import re
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from lsm.files import fsync_dir
from nosync.api.sink_base import ALL, SinkPart
from nosync.errors import RunFailed


def _json_default(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "backslashreplace")
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise TypeError(f"cannot write a {type(obj).__name__} as JSON")


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


def parquet_records(path: str) -> list:
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


class FilesPart(SinkPart):
    """One worker's part of a Files sink: a file per epoch (more when a record changes the
    Parquet schema), written as records arrive."""

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
        self._finisher: ThreadPoolExecutor | None = None
        self._jobs: deque[tuple[int, Future]] = deque()
        """The durable pre-commits being finished and staged on the finisher thread, in order."""

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
        """Writes `records` into the open file of `epoch` (a new one if they do not fit its
        schema)."""
        if not records:
            return
        files = self.open.get(epoch)
        f = files[-1] if files else self._new_file(epoch)
        if not f.write(records):
            self._new_file(epoch).write(records)

    def has_staged(self, upto: int = ALL) -> bool:
        """Whether files of epochs <= `upto` are open or sealed, not pre-committed."""
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
        """Finishes the files of epochs <= `epoch` and renames them into the directory (taking
        back this worker's earlier files of those epochs first when `replace`)."""
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
        """Takes the files of epochs <= `upto` into the pre-commit of `checkpoint`. Not
        durable: they are finished here and stay where they are (`harden` stages them).
        Durable: the handle names them at once; the finisher thread finishes and stages them
        (`settled`)."""
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
        # the files are taken out of the part now, under the names the handle gives them;
        # the finisher thread writes their last rows, fsyncs them and stages them (C and
        # system calls, mostly without the GIL), so the snapshot or checkpoint that records
        # the handle does not wait for the disk on the processing thread (`settled`)
        opened, moves = [], []
        for e in epochs:
            sealed = self.sealed.pop(e, [])  # finished by `seal`
            still = self.open.pop(e, [])
            opened.extend(still)
            live = sealed + [f for f in still if f.records]
            for i, f in enumerate(live):
                name = self._name(e, checkpoint, i)
                moves.append((f.path, os.path.join(self.staging, name)))
                names.append(name)
                n += f.records
        if opened or moves:
            self._later(checkpoint, self._stage, opened, moves)
        return {"files": names, "records": n}

    def _stage(self, opened: list[_OpenFile], moves: list[tuple[str, str]]) -> None:
        """On the finisher thread: finishes the files still open, then renames the files
        moved into the staging area and fsyncs it."""
        for f in opened:
            f.finish()
        for src, dst in moves:
            os.replace(src, dst)
        if moves:
            fsync_dir(self.staging)

    def _later(self, checkpoint: int, job: Any, *args: Any) -> None:
        """Runs `job(*args)` for the pre-commit of `checkpoint` on the finisher thread, after
        the jobs handed to it before."""
        if self._finisher is None:
            self._finisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sink-files-w{self.worker}")
        self._jobs.append((checkpoint, self._finisher.submit(job, *args)))

    def settled(self) -> bool:
        """Whether the finisher thread staged every durable pre-commit handed to it; raises
        its error, once."""
        jobs = self._jobs
        while jobs and jobs[0][1].done():
            jobs.popleft()[1].result()
        return not jobs

    def settle(self) -> None:
        """Waits for the finisher thread's pre-commits; raises its error."""
        self._settle(ALL)

    def _settle(self, upto: int) -> None:
        """Waits for the finisher thread's jobs of pre-commits <= `upto`."""
        jobs = self._jobs
        while jobs and jobs[0][0] <= upto:
            jobs.popleft()[1].result()

    def harden(self, checkpoint: int, handle: Any) -> Any:
        """Stages the files of a pre-commit made without `durable` and fsyncs the staging
        area."""
        if "paths" not in handle:
            return handle
        for path, name in zip(handle["paths"], handle["files"], strict=True):
            if os.path.exists(path):
                os.replace(path, os.path.join(self.staging, name))
        fsync_dir(self.staging)
        return {"files": handle["files"], "records": handle["records"]}

    def abort(self) -> None:
        """Waits for the finisher thread, then drops the files open or sealed."""
        try:
            self.settle()
        except Exception:  # noqa: BLE001 - what it staged is dropped or recovered anyway
            self._jobs.clear()
        for files in [*self.open.values(), *self.sealed.values()]:
            for f in files:
                f.discard()
        self.open, self.sealed = {}, {}
        super().abort()

    def commit_precommit(self, checkpoint: int, handle: Any) -> int:
        """Renames the pre-commit's files into the directory (a file already there was
        committed before: idempotent); a file in neither place fails the run."""
        if "paths" not in handle:
            self._settle(checkpoint)  # its files may still be on their way to the staging area
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
        """Fsyncs the directory if a commit renamed into it since the last sync (a commit
        waits for the finisher thread itself: this does not, as a snapshot calls it right
        after handing its pre-commit to that thread)."""
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
        """Commits `handles`, drops the staging of later checkpoints and files in progress,
        and takes back this worker's files committed under checkpoints above `retract_above`."""
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
        """Stops the finisher thread (after its pre-commits) and closes the files open."""
        if self._finisher is not None:
            self._finisher.shutdown(wait=True)
            self._finisher = None
            self._jobs.clear()
        for files in self.open.values():
            for f in files:
                if f.f is not None:
                    f.f.close()
                elif f.writer is not None:
                    f.writer.close()
