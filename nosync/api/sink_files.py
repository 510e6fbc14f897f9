"""The Files sink: transactional part files (JSONL or Parquet) in a local directory or under
any `pyarrow.fs` URI, an object store included. See `nosync.api.sinks` for the commit protocol
every sink follows, and `nosync.api.part_files` for the files themselves.

Each worker writes its records, while they arrive, to part files on its own host's disk
(`PartFile`); committing one is a move. Where it moves to, and what makes the move atomic and
repeatable, depends on the kind of place the directory is:

- A local directory (a path, or a file:// URI): files are written under `<dir>/_staging/`,
  fsynced, and renamed into `<dir>/` at commit (atomic on a POSIX file system). A durable
  pre-commit renames them to their final names inside `_staging/` and fsyncs it. The
  directory is fsynced once for the commits before it (`sync`) when a snapshot or checkpoint
  records them (`SinkOp.snapshot_meta`) and before the worker reports its output done, not at
  each commit: a commit whose rename a machine crash took back is one that record does not
  hold yet, so a restore commits it again.
- An object store (s3://, gs://, and any other URI; `_ObjectStorePart`): there is no rename,
  and an object is written whole by one upload or not at all. Files are written in a local
  directory of the worker's host (the `local_dir` given to `open_part`); a durable pre-commit
  uploads each to `<uri>/_staging/<final name>`, and its upload returning is what makes it
  durable. The commit copies each staged object to `<uri>/<final name>` on the server, then
  deletes the staged one. A commit is repeatable without a rename because a final name is
  determined by what the file holds (epoch, worker, checkpoint, index within the epoch): a
  commit retried after a crash between the copy and the delete copies the same object to the
  same key again, and one retried after the delete finds the final object and leaves it. So a
  retried commit neither loses output (the staged object goes only once its copy exists) nor
  duplicates it (a key is written, never added to). Mode none's commit, and the commit of a
  pre-commit not yet made durable, upload straight to the final key. A finished upload is
  durable: `sync` has nothing to do.

Names carry the checkpoint, so one that cuts an epoch in two gives two files; `recover` finds a
worker's own staged and committed files by listing, on either kind of place.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

from lsm.files import fsync_dir
from nosync import storage
from nosync.api.part_files import PART_NAME, PartFile, jsonl_records, parquet_records
from nosync.api.sink_base import ALL, Sink, SinkPart
from nosync.api.where import declared_at
from nosync.errors import PipelineError, RunFailed


class Files(Sink):
    """Transactional files: JSONL (one JSON value per line) or Parquet (records as rows;
    non-dict records are stored in a column `value`), in a local directory or under a URI
    (`s3://bucket/out?endpoint_override=host:9000`, ...).

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
        """The sink's directory (without the secret of its credentials) and format, for messages."""
        return f"Files({storage.redact(self.directory)}, {self.format})"

    def check_writable(self) -> None:
        """Raises NosyncError naming the sink and its URI unless a file can be written there (the
        bucket exists, the credentials are good). A local directory is each worker's to make, on
        its own host, at `open_part`: nothing to check from here."""
        if not storage.is_local(self.directory):
            storage.check_writable(self.directory, f"sink {self.describe()}")

    def open_part(self, worker: int, run_id: str, local_dir: str | None = None) -> SinkPart:
        """The writer of worker `worker`: its part files in the sink's directory. Under a URI
        that is not local the sink is checked first, so that a worker fails before its first
        epoch, and the files are written in `local_dir` (None: the temporary directory) until
        they are uploaded."""
        if storage.is_local(self.directory):
            local = storage.local_path(self.directory) if storage.is_uri(self.directory) else self.directory
            return _FilesPart(local, self.format, worker)
        self.check_writable()
        return _ObjectStorePart(self.directory, self.format, worker, local_dir)

    def read_committed(self) -> list:
        """Every committed record, part files in name order (for tests and tools)."""
        return [r for _, r in self.read_committed_epochs()]

    def read_committed_epochs(self) -> list[tuple[int, Any]]:
        """(epoch, record) of every committed record, part files in name order; the epoch is
        the one its part file is named after."""
        out: list = []
        for name in storage.listdir(self.directory):
            m = PART_NAME.match(name)
            epoch = int(m.group(1)) if m else -1
            if name.endswith(".jsonl"):
                out.extend((epoch, r) for r in jsonl_records(storage.join(self.directory, name)))
            elif name.endswith(".parquet"):
                out.extend((epoch, r) for r in parquet_records(storage.join(self.directory, name)))
        return out


def _parts_of(worker: int, names: list[str]) -> list[tuple[str, int | None]]:
    """The part files of `worker` among `names`, and the checkpoint each names (None: none)."""
    out = []
    for name in names:
        m = PART_NAME.match(name)
        if m and int(m.group(2)) == worker:
            out.append((name, None if m.group(3) is None else int(m.group(3))))
    return out


class _FilesPart(SinkPart):
    """A worker's part files in a local directory: committed by rename (module docstring)."""

    order_matters = False
    fsync_files = True
    """Whether a part file is fsynced when finished (it is what makes a local pre-commit durable)."""

    def __init__(self, directory: str, fmt: str, worker: int, work: str | None = None) -> None:
        super().__init__()
        self.dir = directory
        self.staging = os.path.join(directory, "_staging")
        self.work = self.staging if work is None else work
        """Where part files are written while their records arrive: `_staging/`, or a local
        directory of an object store's part."""
        os.makedirs(self.work, exist_ok=True)
        self.fmt = fmt
        self.worker = worker
        self.open: dict[int, list[PartFile]] = {}
        self.sealed: dict[int, list[PartFile]] = {}
        self._serial = 0
        self.unsynced = False
        """Whether a commit renamed files into the directory since it was last fsynced."""

    def _name(self, epoch: int, checkpoint: int | None = None, index: int = 0) -> str:
        c = "" if checkpoint is None else f"-c{checkpoint:010d}"
        k = f"-{index:03d}" if index else ""
        return f"part-{epoch:010d}-w{self.worker:04d}{c}{k}.{self.fmt}"

    def _new_file(self, epoch: int) -> PartFile:
        self._serial += 1
        path = os.path.join(self.work, f"part-{epoch:010d}-w{self.worker:04d}.{self._serial}.inprogress")
        f = PartFile(path, self.fmt, self.fsync_files)
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
        later pre-commit only moves them."""
        for e in sorted(e for e in self.open if e <= epoch):
            self.sealed[e] = self._close_epoch(e)

    def _close_epoch(self, epoch: int) -> list[PartFile]:
        """Finishes the files of `epoch`."""
        files = self.open.pop(epoch)
        for f in files:
            f.finish()
        return [f for f in files if f.records]

    def _files(self, epoch: int) -> list[PartFile]:
        """Takes out the files of `epoch`, finished."""
        return self.sealed.pop(epoch, []) + (self._close_epoch(epoch) if epoch in self.open else [])

    def _due(self, upto: int) -> list[int]:
        """The epochs <= `upto` with files, oldest first."""
        return sorted(e for e in {*self.open, *self.sealed} if e <= upto)

    def _publish(self, epoch: int, target_dir: str, checkpoint: int | None) -> tuple[list[str], int]:
        names, n = [], 0
        for i, f in enumerate(self._files(epoch)):
            name = self._name(epoch, checkpoint, i)
            os.replace(f.path, os.path.join(target_dir, name))
            names.append(name)
            n += f.records
        return names, n

    def commit(self, epoch: int) -> int:
        n = 0
        for e in self._due(epoch):
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
        epochs = self._due(upto)
        if not durable:
            # the finished files stay where they were written, under their names in progress:
            # one move, at the commit
            paths = []
            for e in epochs:
                for i, f in enumerate(self._files(e)):
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
        return _parts_of(self.worker, os.listdir(directory))

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
                f.close()


class _ObjectStorePart(_FilesPart):
    """A worker's part files under a URI of an object store: written on this host, uploaded,
    committed by a copy on the server and a delete (module docstring). The handles are those
    of the local part, so a checkpoint stores the same thing for both."""

    fsync_files = False  # an upload, not this host's disk, makes a file durable

    def __init__(self, uri: str, fmt: str, worker: int, local_dir: str | None) -> None:
        # one local directory per sink URI, so that two sinks on one host do not share files; the
        # URI's secret is not part of its name
        digest = hashlib.sha256(storage.redact(uri).encode()).hexdigest()[:16]
        work = os.path.join(local_dir or tempfile.gettempdir(), f"nosync-sink-{digest}")
        super().__init__(uri, fmt, worker, work)
        self.staging = storage.join(uri, "_staging")

    def _publish(self, epoch: int, target_dir: str, checkpoint: int | None) -> tuple[list[str], int]:
        names, n = [], 0
        for i, f in enumerate(self._files(epoch)):
            name = self._name(epoch, checkpoint, i)
            storage.upload_file(f.path, storage.join(target_dir, name))
            os.unlink(f.path)
            names.append(name)
            n += f.records
        return names, n

    def commit(self, epoch: int) -> int:
        due = self._due(epoch)
        if self.replace and due:
            for name, c in self._mine(self.dir):
                if c is None and int(PART_NAME.match(name).group(1)) in due:
                    storage.delete(storage.join(self.dir, name))
        return sum(self._publish(e, self.dir, None)[1] for e in due)

    def precommit(self, checkpoint: int, upto: int = ALL, durable: bool = True) -> Any:
        if not durable:
            return super().precommit(checkpoint, upto, durable=False)  # the files stay on this host
        names, n = [], 0
        for e in self._due(upto):
            got, k = self._publish(e, self.staging, checkpoint)
            names.extend(got)
            n += k
        return {"files": names, "records": n}

    def harden(self, checkpoint: int, handle: Any) -> Any:
        if "paths" not in handle:
            return handle
        for path, name in zip(handle["paths"], handle["files"], strict=True):
            if os.path.exists(path):
                storage.upload_file(path, storage.join(self.staging, name))
                os.unlink(path)
        return {"files": handle["files"], "records": handle["records"]}

    def commit_precommit(self, checkpoint: int, handle: Any) -> int:
        paths = handle.get("paths") or [None] * len(handle["files"])
        for path, name in zip(paths, handle["files"], strict=True):
            final = storage.join(self.dir, name)
            if path is not None and os.path.exists(path):
                storage.upload_file(path, final)  # not made durable yet: straight to its final key
                os.unlink(path)
                continue
            staged = storage.join(self.staging, name)
            try:
                storage.copy_file(staged, final)
            except FileNotFoundError:
                # Invariant: a staged object is deleted only once its copy is at the final key, so
                # a final object without its staged one is a commit done before; neither is a loss
                if storage.exists(final):
                    continue
                raise RunFailed(
                    f"sink {storage.redact(self.dir)}: the pre-committed file {name} of checkpoint {checkpoint} "
                    "is missing"
                ) from None
            # a crash here leaves both objects: the commit retried copies the same bytes to the same
            # key again (the name says which epoch, worker, checkpoint and index they are)
            storage.delete(staged)
        return handle["records"]

    def sync(self) -> None:
        """Nothing to do: a finished upload, or a copy, is durable."""

    def _mine(self, directory: str) -> list[tuple[str, int | None]]:
        return _parts_of(self.worker, storage.listdir(directory))

    def recover(self, checkpoint: int, handles: list, retract_above: int | None = None) -> int:
        self.abort()
        n = sum(self.commit_precommit(c, h) for c, h in handles)
        for name, c in self._mine(self.staging):
            if name.endswith((".tmp", ".inprogress")) or c is None or c > checkpoint:
                storage.delete(storage.join(self.staging, name))
        above = checkpoint if retract_above is None else retract_above
        for name, c in self._mine(self.dir):
            if c is not None and c > above:
                storage.delete(storage.join(self.dir, name))
        # what is left of this worker on this host was written by a process of it that crashed, or
        # is a pre-commit not made durable that recovery drops: neither is ever committed
        for name, _ in _parts_of(self.worker, os.listdir(self.work)):
            os.unlink(os.path.join(self.work, name))
        return n
