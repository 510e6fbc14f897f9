"""The store's own file writes, in one place.

Every byte the store writes to its own files (log segments, the manifest, the lock file) goes
through these functions, so that a fault (ENOSPC, EIO) can be injected at exactly the calls the
store makes, and so that the durability steps (fsync of a file, then of its directory after a
create or rename) are written once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator

from lsm.errors import StoreLockedError


def write(fd: int, data: bytes) -> None:
    """Writes all of `data` at the file's position, or raises OSError."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _write_parts(parts: list, write_chunk: Callable[[list, int], int]) -> None:
    """Writes `parts` laid end to end through `write_chunk(chunk, done)` (a gathering write of
    at most IOV_MAX parts, `done` bytes after the first; returns the bytes it wrote), again
    from where a short write stopped."""
    limit = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
    i = done = 0
    while i < len(parts):
        chunk = parts[i : i + limit]
        n = write_chunk(chunk, done)
        done += n
        for p in chunk:
            if n >= len(p):
                n -= len(p)
                i += 1
                continue
            # a short write: the rest of this part, then on from the next one
            parts = [*parts[:i], memoryview(p)[n:], *parts[i + 1 :]]
            break


def writev(fd: int, parts: list[bytes]) -> None:
    """Writes `parts` laid end to end at the file's position (gathered by the kernel, not
    copied here), or raises OSError."""
    _write_parts(parts, lambda chunk, _done: os.writev(fd, chunk))


_RWF_DSYNC = getattr(os, "RWF_DSYNC", None) if hasattr(os, "pwritev") else None
"""pwritev's flag for a write that returns once its data is durable (Linux), or None."""


def write_durable(fd: int, parts: list[bytes], offset: int) -> None:
    """Writes `parts` laid end to end at `offset` and makes them durable (as fdatasync does), or
    raises OSError. Where the platform has it, one system call does both (pwritev with
    RWF_DSYNC): a background thread that logs a small record then gives up the GIL once for it,
    not twice (a write, then an fsync)."""
    if _RWF_DSYNC is None:
        os.lseek(fd, offset, os.SEEK_SET)
        writev(fd, parts)
        fsync(fd)
        return
    _write_parts(parts, lambda chunk, done: os.pwritev(fd, chunk, offset + done, _RWF_DSYNC))


def lock_directory(path: str) -> int:
    """Takes the lock of the store directory `path` (its LOCK file, flock LOCK_EX|LOCK_NB) and
    returns its fd, which holds it until closed; StoreLockedError when a process holds it."""
    fd = os.open(os.path.join(path, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(path) from None
    return fd


def fsync(fd: int) -> None:
    """Makes the file's data durable."""
    os.fsync(fd)


def truncate(fd: int, size: int) -> None:
    """Cuts the file to `size` bytes and leaves the position at its end."""
    os.ftruncate(fd, size)
    os.lseek(fd, size, os.SEEK_SET)


def fsync_dir(path: str) -> None:
    """Makes a directory's entries (a create, rename or unlink in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_atomically(path: str, data: bytes) -> None:
    """Writes `data` to `path` so that a crash leaves either the old file or the new one.

    Write a temporary file, fsync it, rename it over `path`, fsync the directory.
    """
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write(fd, data)
        fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def tree_bytes(path: str) -> int:
    """Bytes of the files under `path`; a file removed meanwhile counts nothing."""
    total = 0
    for root, _, names in os.walk(path):
        for n in names:
            try:
                total += os.path.getsize(os.path.join(root, n))
            except FileNotFoundError:
                pass
    return total


TABLE_SUFFIXES = (".ldb", ".sst")
"""LevelDB's sorted tables: written once, never opened for writing again (a compaction writes
new ones and deletes the old)."""


def copy_store(src: str, dst: str) -> None:
    """A copy at `dst` of the store (or tree of stores) at `src`, to open in its place: opening
    a store writes to its files (LevelDB recovers its log into a new table and writes a new
    manifest; a torn tail of the store's log is cut). LevelDB's tables are hard links where
    the file system allows (they are never written again, and removing a link leaves the
    other), every other file a copy; lock files are left out."""

    def link_or_copy(s: str, d: str) -> str:
        if s.endswith(TABLE_SUFFIXES):
            try:
                os.link(s, d)
                return d
            except OSError:
                pass  # another file system, or links not allowed: a copy
        return shutil.copy2(s, d)

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("LOCK"), copy_function=link_or_copy)


@contextlib.contextmanager
def scratch_near(path: str, prefix: str) -> Iterator[str]:
    """A new empty directory, removed on exit, to copy the store (or tree of stores) at `path`
    into, on the same file system where it can be, so that `copy_store` links its tables
    rather than copying them: under the temporary directory when that is on the store's file
    system, else beside `path` (a hidden name), else under the temporary directory after
    all."""
    made = None
    try:
        if os.stat(tempfile.gettempdir()).st_dev != os.stat(path).st_dev:
            made = tempfile.mkdtemp(prefix="." + prefix, dir=os.path.dirname(os.path.abspath(path)))
    except OSError:
        pass  # beside it is not writable: the temporary directory, with copies
    made = made or tempfile.mkdtemp(prefix=prefix)
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)
