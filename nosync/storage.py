"""Where a run's files go: a local path, or any URI `pyarrow.fs` opens (`s3://`, `hdfs://`,
`file://`, `gs://`, ...).

A run keeps three kinds of file in three places (docs/cluster.md): the driver's own files in
its run directory (a local path), each worker's stores in a local root on its own host (a
local path), and what must outlive a host in the shared tier (`--remote`, any URI: abs
checkpoints, nosync's remote tier, the intermediate files of batch jobs). This module is the
one way the engine reaches a place that may be either kind, so that a local path keeps its
POSIX guarantees and an object store gets what it can give:

- `write_bytes` is atomic on both: on a local file system a temporary file, fsynced, renamed,
  and its directory fsynced; on an object store one PUT, which makes the object visible whole
  or not at all (S3, GCS and HDFS's create-and-close all do).
- an object store has no directories: `makedirs` is a no-op there, and `listdir` of a prefix
  nobody wrote under is empty, as a missing directory is.

A URI's query string stays attached to it as its parts are joined (`join`), so a URI with its
options (`s3://bucket/runs?endpoint_override=host:9000&scheme=http`) names every file under
it. File systems are opened once per scheme, host and options, and kept (an S3 client costs
milliseconds to make).
"""

from __future__ import annotations

import os
import posixpath
import re
import threading
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from nosync.errors import NosyncError

_FS: dict[tuple, Any] = {}
_FS_LOCK = threading.Lock()


def is_uri(where: str) -> bool:
    """Whether `where` is a URI (scheme://...) rather than a plain path."""
    return "://" in where


def is_local(where: str) -> bool:
    """Whether `where` is on this host's file system: a plain path or a file:// URI."""
    return not is_uri(where) or where.startswith("file://")


def local_path(where: str) -> str:
    """The absolute path of a local place (a plain path or a file:// URI).

    REQUIRES: is_local(where)."""
    if not is_uri(where):
        return os.path.abspath(where)
    return urlsplit(where).path


def join(where: str, *parts: str) -> str:
    """`where` with `parts` appended to its path (a URI keeps its scheme, host and query)."""
    if not is_uri(where):
        return os.path.join(where, *parts)
    u = urlsplit(where)
    path = posixpath.join(u.path or "/", *parts)
    return urlunsplit((u.scheme, u.netloc, path, u.query, u.fragment))


def name_of(where: str) -> str:
    """The last part of `where`'s path (a file's name)."""
    if not is_uri(where):
        return os.path.basename(where.rstrip("/"))
    return posixpath.basename(urlsplit(where).path.rstrip("/"))


_SECRET = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]*):[^@\s/]*@")


def redact(text: str) -> str:
    """`text` (a URI, or a message naming some) without the secrets of the credentials its
    URIs carry (`s3://key:secret@bucket` -> `s3://key:***@bucket`), for messages and files."""
    return _SECRET.sub(r"\1:***@", text)


def resolve(where: str) -> tuple[Any, str]:
    """The `pyarrow.fs` file system of `where` and the path inside it; raises NosyncError
    naming `where` when pyarrow cannot open it (unknown scheme, bad options)."""
    import pyarrow.fs as pafs  # lazy: pyarrow costs ~0.3 s to import; a plain path needs none of it

    if not is_uri(where):
        return _cached(("local",), pafs.LocalFileSystem), os.path.abspath(where)
    u = urlsplit(where)
    if u.scheme == "file":
        return _cached(("local",), pafs.LocalFileSystem), u.path
    try:
        if u.scheme not in _BUCKETS and u.scheme not in _HOSTS:
            return pafs.FileSystem.from_uri(where)  # a scheme whose paths this module does not know: as pyarrow says
        root = urlunsplit((u.scheme, u.netloc, "/", u.query, ""))
        fs = _cached((u.scheme, u.netloc, u.query), lambda: pafs.FileSystem.from_uri(root)[0])
    except Exception as e:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ValueError
        raise NosyncError(f"{redact(where)}: pyarrow.fs cannot open it: {_first_line(e)}") from None
    # an object store's paths start with the bucket, the host part of its URI; HDFS's with "/"
    path = (u.netloc.rsplit("@", 1)[-1] + u.path) if u.scheme in _BUCKETS else u.path
    return fs, path.rstrip("/") or "/"


_BUCKETS = ("s3", "gs", "gcs")
"""Schemes whose URI's host part is a bucket, the first part of every path in the file system."""
_HOSTS = ("hdfs", "viewfs")
"""Schemes whose URI's host part is the file system's server, and whose paths start with "/"."""


def _cached(key: tuple, make: Any) -> Any:
    with _FS_LOCK:
        fs = _FS.get(key)
        if fs is None:
            fs = _FS[key] = make()
        return fs


def write_bytes(where: str, data: bytes, durable: bool = True) -> None:
    """Writes `data` to the file `where`, atomically: a reader sees the whole file or none.
    `durable`: once this returns the file survives a crash of this host, not only of this
    process (an object store's PUT always does)."""
    if is_local(where):
        path = local_path(where)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        if durable:
            fsync_dir(os.path.dirname(path))
        return
    fs, path = resolve(where)
    with fs.open_output_stream(path) as out:
        out.write(data)


def read_bytes(where: str) -> bytes:
    """The bytes of the file `where`; FileNotFoundError if there is none."""
    if is_local(where):
        with open(local_path(where), "rb") as f:
            return f.read()
    fs, path = resolve(where)
    try:
        with fs.open_input_stream(path) as src:
            return src.read()
    except FileNotFoundError:
        raise
    except OSError as e:
        if _missing(e):
            raise FileNotFoundError(where) from None
        raise


def exists(where: str) -> bool:
    """Whether a file or directory is at `where`."""
    if is_local(where):
        return os.path.exists(local_path(where))
    import pyarrow.fs as pafs  # lazy, as in resolve

    fs, path = resolve(where)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def listdir(where: str) -> list[str]:
    """The names directly under `where`, sorted; empty when nothing is there."""
    if is_local(where):
        try:
            return sorted(os.listdir(local_path(where)))
        except (FileNotFoundError, NotADirectoryError):
            return []
    import pyarrow.fs as pafs  # lazy, as in resolve

    fs, path = resolve(where)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as e:
        if _missing(e):
            return []
        raise
    return sorted(posixpath.basename(i.path.rstrip("/")) for i in infos)


def makedirs(where: str) -> None:
    """Makes the directory `where` and its parents (nothing to do on an object store)."""
    if is_local(where):
        os.makedirs(local_path(where), exist_ok=True)
        return
    fs, path = resolve(where)
    fs.create_dir(path, recursive=True)


def delete(where: str) -> None:
    """Deletes the file `where`, if it is there."""
    if is_local(where):
        try:
            os.unlink(local_path(where))
        except FileNotFoundError:
            pass
        return
    fs, path = resolve(where)
    _unless_missing(fs.delete_file, path)


def delete_tree(where: str) -> None:
    """Deletes the directory `where` and all under it, if it is there."""
    if is_local(where):
        import shutil

        shutil.rmtree(local_path(where), ignore_errors=True)
        return
    fs, path = resolve(where)
    _unless_missing(fs.delete_dir, path)


def _unless_missing(call: Any, path: str) -> None:
    """`call(path)`, a missing `path` being no error."""
    try:
        call(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        if not _missing(e):
            raise


def tree_bytes(where: str) -> int:
    """The bytes of every file under `where` (0 when nothing is there)."""
    import pyarrow.fs as pafs  # lazy, as in resolve

    fs, path = resolve(where)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except OSError as e:
        if _missing(e):
            return 0
        raise
    return sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)


def check_writable(where: str, what: str) -> None:
    """Raises NosyncError naming `what` and `where` unless a file can be written under `where`
    and deleted again: the scheme opens, the bucket exists, the credentials are good. Makes
    the directory when it can."""
    probe = join(where, f".nosync-probe-{uuid.uuid4().hex[:12]}")
    try:
        makedirs(where)
        write_bytes(probe, b"probe")
        delete(probe)
    except NosyncError as e:
        raise NosyncError(f"{what}: {e}") from None
    except Exception as e:  # noqa: BLE001 - OSError, pyarrow's errors: all mean "cannot write there"
        raise NosyncError(f"{what} {redact(where)}: cannot write there: {_first_line(e)}") from None


def fsync_dir(path: str) -> None:
    """fsyncs the directory `path`, so that a file created or renamed in it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _missing(e: OSError) -> bool:
    """Whether a pyarrow.fs error says the path is not there (S3 reports some as plain OSError)."""
    text = str(e)
    return "NoSuchKey" in text or "Path does not exist" in text or "NOT_FOUND" in text or "404" in text


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def upload_tree(local_dir: str, where: str, skip: tuple[str, ...] = ()) -> None:
    """Writes every file under the local directory `local_dir` (but those named in `skip`) to
    the same relative place under `where`, an object store or a remote file system."""
    fs, root = resolve(where)
    for top, _dirs, names in os.walk(local_dir):
        rel = os.path.relpath(top, local_dir)
        for name in names:
            if name in skip:
                continue
            target = posixpath.join(root, *([] if rel == "." else rel.split(os.sep)), name)
            with open(os.path.join(top, name), "rb") as src, fs.open_output_stream(target) as out:
                while chunk := src.read(1 << 22):
                    out.write(chunk)


def download_tree(where: str, local_dir: str) -> None:
    """Copies every file under `where` (an object store or a remote file system) to the same
    relative place under the local directory `local_dir`."""
    import pyarrow.fs as pafs  # lazy, as in resolve

    fs, root = resolve(where)
    for info in fs.get_file_info(pafs.FileSelector(root, recursive=True)):
        if info.type != pafs.FileType.File:
            continue
        rel = posixpath.relpath(info.path, root)
        target = os.path.join(local_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with fs.open_input_stream(info.path) as src, open(target, "wb") as out:
            while chunk := src.read(1 << 22):
                out.write(chunk)


def upload_file(local_file: str, where: str) -> None:
    """Writes the local file `local_file` to the file `where`, atomically as `write_bytes`:
    on an object store one upload, visible whole only once it completes, and durable once this
    returns. An upload that fails leaves nothing at `where`, as far as it can: pyarrow cannot
    abort an output stream, and closing it (which its destructor does too) publishes what it
    got, so the part written is closed and deleted here, before anyone can take it for whole."""
    if is_local(where):
        _copy_local(local_file, local_path(where))
        return
    fs, path = resolve(where)
    out = fs.open_output_stream(path, compression=None)  # never compressed because of the name's suffix
    try:
        with open(local_file, "rb") as src:
            out.upload(src, buffer_size=1 << 22)
    except BaseException:
        try:
            out.close()
        except Exception:  # noqa: BLE001 - the object, if any, goes below
            pass
        delete(where)
        raise
    out.close()


def _copy_local(src: str, dst: str) -> None:
    """Copies the local file `src` to `dst` as `write_bytes` writes: a temporary file, fsynced,
    renamed, its directory fsynced."""
    import shutil

    os.makedirs(os.path.dirname(dst), exist_ok=True)
    tmp = f"{dst}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        shutil.copyfile(src, tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(os.path.dirname(dst))


def copy_file(src: str, dst: str) -> None:
    """Copies the file `src` to `dst` (replacing it) on the same file system, atomically as
    `write_bytes`; FileNotFoundError if `src` is not there. On an object store the server
    copies it: the bytes do not pass through this host, and `dst` appears whole or not at all."""
    if is_local(src) and is_local(dst):
        _copy_local(local_path(src), local_path(dst))
        return
    a, b = urlsplit(src), urlsplit(dst)
    if (a.scheme, a.netloc, a.query) != (b.scheme, b.netloc, b.query):
        raise NosyncError(f"cannot copy {redact(src)} to {redact(dst)}: not on the same file system")
    fs, src_path = resolve(src)
    dst_path = resolve(dst)[1]
    try:
        fs.copy_file(src_path, dst_path)
    except OSError as e:
        # each store words a missing source its own way (S3: NO_SUCH_KEY): ask, on the failure path only
        if not isinstance(e, FileNotFoundError) and exists(src):
            raise
        raise FileNotFoundError(src) from None
