"""Injected I/O faults: ENOSPC / EIO on the store's own file writes, and a failing remote tier.

The log's writes and fsyncs all go through lsm.files, so wrapping `files.write`,
`files.writev`, `files.fsync` and `files.write_durable` (a write and its sync in one call) injects
a fault at exactly the calls the store makes; `remote.write_table` is
where every remote file is written. While a fault is on: the error surfaces to the caller as a
PersistError carrying the OSError, nothing becomes durable that was not, nothing durable is
lost, and reads still see every append. Once it clears, the store goes on as if nothing had
happened: flush succeeds, and a reopen (after close or after a simulated crash) holds every
batch. LevelDB writes its own files, not through lsm.files: a failing disk tier is injected at
`DiskTier.write`, the one call through which runs reach it. Also here: rollbacks while the
persister cannot write, and a base image that cannot be uploaded. Expected states come from
workload.Model (the runs of several states per batch), never from the store.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from workload import STATES, Model, batch, diff, load_all, log_seqs

import lsm
from lsm import files, remote
from lsm.disk import DiskTier

SEED = 1234
BEFORE = 20
"""Batches 0..BEFORE-1 are durable before the fault; BEFORE..AFTER-1 are appended during it."""
AFTER = 45
OPTIONS = dict(segment_bytes=600, seal_interval_s=3600.0, budget=0)
"""No merges on their own (budget 0): they would delete indexed log segments, which the tests
read back whole."""


class DiskFault:
    """Wraps files.write / files.writev / files.fsync / files.write_durable: while `on`, they
    raise OSError(err).

    how: "write" (nothing written), "short-write" (half the bytes written, then the error),
    "fsync" (written, the fsync fails). thread: fault only the writes of the threads whose name
    starts with this (the persister's: "lsm-persister").
    """

    def __init__(self, monkeypatch, how: str, err: int, thread: str = "") -> None:
        self.how, self.err = how, err
        self.on = False
        self.hits = 0
        real_write, real_writev, real_fsync = files.write, files.writev, files.fsync
        real_durable = files.write_durable

        def faulted() -> bool:
            return self.on and threading.current_thread().name.startswith(thread)

        def write(fd: int, data: bytes) -> None:
            if faulted() and how in ("write", "short-write"):
                self.hits += 1
                if how == "short-write":
                    real_write(fd, bytes(data)[: len(data) // 2])
                raise OSError(err, os.strerror(err))
            real_write(fd, data)

        def writev(fd: int, parts: list[bytes]) -> None:
            if faulted() and how in ("write", "short-write"):
                self.hits += 1
                if how == "short-write":
                    data = b"".join(parts)
                    real_write(fd, data[: len(data) // 2])
                raise OSError(err, os.strerror(err))
            real_writev(fd, parts)

        def fsync(fd: int) -> None:
            if faulted() and how == "fsync":
                self.hits += 1
                raise OSError(err, os.strerror(err))
            real_fsync(fd)

        def write_durable(fd: int, parts: list[bytes], offset: int) -> None:
            # the write and its sync in one call: "fsync" writes the bytes, then fails
            if faulted():
                self.hits += 1
                data = b"".join(parts)
                if how == "short-write":
                    os.pwrite(fd, data[: len(data) // 2], offset)
                elif how == "fsync":
                    os.pwrite(fd, data, offset)
                raise OSError(err, os.strerror(err))
            real_durable(fd, parts, offset)

        monkeypatch.setattr(files, "write", write)
        monkeypatch.setattr(files, "writev", writev)
        monkeypatch.setattr(files, "fsync", fsync)
        monkeypatch.setattr(files, "write_durable", write_durable)


def append(s: lsm.Store, model: Model, seqs: range, log_now: bool = False) -> None:
    for seq in seqs:
        s.append(seq, batch(SEED, seq), log_now=log_now)
    model.advance(seqs[-1])


def check_state(s: lsm.Store, model: Model, last: int, where: str) -> None:
    assert s.last_seq == last, f"{where}: last seq {s.last_seq}, expected {last}"
    got, want = load_all(s), model.state(last)
    assert got == want, f"{where}:\n{diff(got, want)}"
    for state in STATES:
        for k, v in want[state].items():
            assert s.get(state, k) == v, f"{where}: get({state!r}, {k!r}) = {s.get(state, k)!r}, model {v!r}"


def check_reopen(path: str, model: Model, last: int, where: str, uploads: bool = False) -> None:
    """Reopens the store and checks its state; then that its log parses cleanly and holds
    seqs 0..last (with uploads, those the remote tier lacks: the log drops what is uploaded)."""
    with lsm.Store(path, uploads=uploads, budget=0) as s:
        check_state(s, model, last, where)
    seqs = log_seqs(path)
    if uploads:
        assert seqs == list(range(seqs[0] if seqs else last + 1, last + 1)), f"{where}: the log holds seqs {seqs}"
        assert sorted(set(seqs) | set(remote_seqs(path))) == list(range(last + 1)), f"{where}: seqs lost"
    else:
        assert seqs == list(range(last + 1)), f"{where}: the log is not seqs 0..{last}"


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO], ids=["ENOSPC", "EIO"])
@pytest.mark.parametrize("how", ["write", "short-write", "fsync"])
@pytest.mark.parametrize("end", ["close", "crash-after-recovery", "crash-during-fault"])
@pytest.mark.parametrize("segment", ["append", "roll"])
@pytest.mark.parametrize("log_now", [False, True], ids=["persister", "log_now"])
def test_disk_fault_surfaces_loses_nothing_and_clears(tmp_path, monkeypatch, how, err, end, segment, log_now) -> None:
    """segment: the faulted log write appends to the open segment, or starts a new one.
    log_now: every append asks to be logged on the appending thread (a lineage point's way),
    so that the faulted write is that thread's first, the persister's after it."""
    fault = DiskFault(monkeypatch, how, err)
    path = str(tmp_path / "store")
    model = Model(SEED)
    s = lsm.Store(path, **{**OPTIONS, "segment_bytes": 1 << 20 if segment == "append" else 1})
    try:
        append(s, model, range(BEFORE), log_now)
        # the first append, at least, finds an idle persister: logged on this thread
        assert s.stats.logged_now > 0 if log_now else s.stats.logged_now == 0
        assert s.flush(timeout=10) == BEFORE - 1
        assert s.durable("disk") == BEFORE - 1

        fault.on = True
        append(s, model, range(BEFORE, AFTER), log_now)
        with pytest.raises(lsm.PersistError) as ei:
            s.flush(timeout=10)
        e = ei.value
        assert fault.hits > 0
        assert isinstance(e.cause, OSError) and e.cause.errno == err, f"cause: {e.cause!r}"
        assert e.level == "disk", e
        assert s.error is not None and s.error.cause.errno == err
        assert s.durable("disk") == BEFORE - 1, "durability advanced over a failed write"
        check_state(s, model, AFTER - 1, "reads during the fault")
        if end == "crash-during-fault":
            s.abandon()
            fault.on = False
            check_reopen(path, model, BEFORE - 1, "reopen after a crash during the fault")
            return

        fault.on = False
        assert s.flush(timeout=10) == AFTER - 1
        assert s.durable("disk") == AFTER - 1
        append(s, model, range(AFTER, AFTER + 5), log_now)
        assert s.flush(timeout=10) == AFTER + 4
        if end == "crash-after-recovery":
            s.abandon()
        else:
            s.close()
    finally:
        fault.on = False
        s.abandon()
    check_reopen(path, model, AFTER + 4, f"reopen after {end}")


def test_a_rollback_below_what_is_indexed_is_logged_before_it_returns(tmp_path, monkeypatch) -> None:
    """rollback(to_seq) to a seq no batch has, below what LevelDB had indexed, makes LevelDB
    say to_seq at once: a crash right after it recovers to_seq, which the log must then hold
    (an empty record), or the remote tier could never reach it and flush("remote") would wait
    for ever. Here the persister cannot write anything after the rollback (EIO)."""
    fault = DiskFault(monkeypatch, "write", errno.EIO, thread="lsm-persister")
    path = str(tmp_path / "store")
    s = lsm.Store(path, **OPTIONS, uploads=True)
    try:
        s.append(1, {"s": {"a": 1}})
        s.append(3, {"s": {"a": 3}})
        assert s.flush("remote", timeout=10) == 3
        s._persister.drain_index()
        assert s.indexed == 3
        fault.on = True
        s.rollback(2)
        assert s.last_seq == 2 and s.get("s", "a") == 1
    finally:
        s.abandon()
    fault.on = False
    with lsm.Store(path, **OPTIONS, uploads=True) as s:
        assert s.last_seq == 2
        assert s.flush("remote", timeout=10) == 2
    shutil.rmtree(os.path.join(path, "disk"))
    shutil.rmtree(os.path.join(path, "log"))
    with lsm.Store(path, **OPTIONS) as s:
        assert s.last_seq == 2 and s.load("s") == {"a": 1}


def test_a_rollback_below_a_remote_base_image_is_what_the_remote_tier_restores(tmp_path) -> None:
    """The persister writes a base image at the last indexed seq when the remote tier has a gap
    the local log cannot fill (keeping the versions down to the retention horizon); a rollback
    below it must take it out of the remote tier, or a restore from that tier alone (disk and
    log lost) would start from the state the rollback undid."""
    path = str(tmp_path / "store")
    with lsm.Store(path, **{**OPTIONS, "retention": 5}, uploads=True) as s:
        for seq in range(8):
            s.append(seq, {"s": {f"k{seq}": seq, "a": seq}})
        assert s.flush("remote", timeout=10) == 7
        s._persister.drain_index()
        with s._tier_lock:  # as the persister's upload step does for a gap
            s._persister.compactor.write_base(7, 2)
        assert s.remote.base is not None and s.remote.base.last == 7
        s.rollback(2)
        assert s.flush("remote", timeout=10) == 2
    shutil.rmtree(os.path.join(path, "disk"))
    shutil.rmtree(os.path.join(path, "log"))
    with lsm.Store(path, **OPTIONS, uploads=True) as s:
        assert s.last_seq == 2 and s.load("s") == {"k0": 0, "k1": 1, "k2": 2, "a": 2}


def test_a_rollback_while_indexing_fails_still_logs_its_target(tmp_path, monkeypatch) -> None:
    """Batches logged but not indexed (LevelDB's writes fail: its files are not written through
    lsm.files, so the disk tier's write is what fails here), then rollback(to_seq) to a seq no
    batch has: the empty batch that carries to_seq must be logged like any append, or the
    remote tier could never reach to_seq."""
    failing = threading.Event()
    real_write = DiskTier.write

    def write(self, *args: object, **kwargs: object) -> object:
        if failing.is_set() and threading.current_thread().name.startswith("lsm-persister"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(DiskTier, "write", write)
    path = str(tmp_path / "store")
    with lsm.Store(path, **OPTIONS, uploads=True) as s:
        s.append(0, {"s": {"a": 0}})
        assert s.flush("remote", timeout=10) == 0
        s._persister.drain_index()
        failing.set()
        s.append(1, {"s": {"a": 1}})
        s.append(3, {"s": {"a": 3}})
        assert s.flush("disk", timeout=10) == 3
        assert s.indexed == 0
        s.rollback(2)
        failing.clear()
        assert s.flush("remote", timeout=10) == 2
    shutil.rmtree(os.path.join(path, "disk"))
    shutil.rmtree(os.path.join(path, "log"))
    with lsm.Store(path, **OPTIONS) as s:
        assert s.last_seq == 2 and s.load("s") == {"a": 1}


class RemoteFault:
    """Wraps remote.write_table: while `on`, it raises OSError(ENOSPC), after `delay_s` (an
    upload that times out) if set; `entered` is set whenever a faulted write starts."""

    def __init__(self, monkeypatch, delay_s: float = 0.0, only: str = "") -> None:
        """only: fault only the files whose name starts with this."""
        self.on = False
        self.hits = 0
        self.delay_s = delay_s
        self.entered = threading.Event()
        real = remote.write_table

        def write_table(fs, path, table) -> None:
            if self.on and os.path.basename(path).startswith(only):
                self.hits += 1
                self.entered.set()
                if self.delay_s:
                    threading.Event().wait(self.delay_s)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(fs, path, table)

        monkeypatch.setattr(remote, "write_table", write_table)


def remote_seqs(path: str) -> list[int]:
    """The seqs of the remote tier's log segments, read with pyarrow alone."""
    seqs: list[int] = []
    d = os.path.join(path, "remote")
    for name in sorted(os.listdir(d)):
        if name.startswith("log-") and name.endswith(".arrow"):
            with pa.memory_map(os.path.join(d, name)) as src:
                seqs.extend(ipc.open_file(src).read_all().column("seq").to_pylist())
    return sorted(seqs)


def test_remote_fault_surfaces_and_clears(tmp_path, monkeypatch) -> None:
    fault = RemoteFault(monkeypatch)
    path = str(tmp_path / "store")
    model = Model(SEED)
    # Large segments: no upload is due until flush("remote") asks, which the persister serves
    # after logging (and indexing) everything appended, so the disk tier is ahead at the raise.
    with lsm.Store(path, **{**OPTIONS, "segment_bytes": 1 << 20, "uploads": True}) as s:
        append(s, model, range(BEFORE))
        assert s.flush("remote", timeout=10) == BEFORE - 1
        assert s.durable("remote") == BEFORE - 1

        fault.on = True
        append(s, model, range(BEFORE, AFTER))
        with pytest.raises(lsm.PersistError) as ei:
            s.flush("remote", timeout=10)
        e = ei.value
        assert fault.hits > 0
        assert isinstance(e.cause, OSError) and e.cause.errno == errno.ENOSPC, f"cause: {e.cause!r}"
        assert e.level == "remote", f"a failed upload reported as level {e.level!r}: {e}"
        assert s.durable("remote") == BEFORE - 1
        assert s.durable("disk") == AFTER - 1, "the local log did not advance during the outage"
        check_state(s, model, AFTER - 1, "reads during the remote fault")

        fault.on = False
        assert s.flush("remote", timeout=10) == AFTER - 1
        assert s.durable("remote") == AFTER - 1
    assert remote_seqs(path) == list(range(AFTER)), "the remote tier lacks some seqs"
    check_reopen(path, model, AFTER - 1, "reopen after the remote fault", uploads=True)
    # The remote tier alone restores everything.
    shutil.rmtree(os.path.join(path, "disk"))
    shutil.rmtree(os.path.join(path, "log"))
    with lsm.Store(path, budget=0) as s:
        check_state(s, model, AFTER - 1, "restore from the remote tier")


def test_remote_outage_does_not_fail_local_flush_or_close(tmp_path, monkeypatch) -> None:
    """Local durability does not depend on the remote tier: with uploads failing (slowly, like
    a timeout), flush("disk") and close() still succeed once the batches are in the log."""
    fault = RemoteFault(monkeypatch, delay_s=0.3)
    path = str(tmp_path / "store")
    model = Model(SEED)
    s = lsm.Store(path, **OPTIONS, uploads=True)
    try:
        append(s, model, range(BEFORE))
        assert s.flush("remote", timeout=10) == BEFORE - 1
        fault.on = True
        append(s, model, range(BEFORE, AFTER))
        # Uploads are due once a segment is sealed by size; wait until one is failing.
        assert fault.entered.wait(10), "no upload was attempted"
        append(s, model, range(AFTER, AFTER + 5))
        assert s.flush("disk", timeout=10) == AFTER + 4
        assert s.durable("disk") == AFTER + 4
        fault.entered.clear()
        assert fault.entered.wait(10), "no upload was attempted"
        append(s, model, range(AFTER + 5, AFTER + 10))
        s.close()
    finally:
        fault.on = False
        s.abandon()
    check_reopen(path, model, AFTER + 9, "reopen after the remote outage", uploads=True)


def test_a_failed_base_image_upload_deletes_no_remote_log_segment(tmp_path, monkeypatch) -> None:
    """compact() with uploads folds every state's runs below the horizon, then writes a base
    image and deletes the remote log segments it replaces. While the base image cannot be
    written, the segments stay: the remote tier alone restores every seq, and once the fault
    clears a compact() writes the image."""
    fault = RemoteFault(monkeypatch, only="base-")
    path = str(tmp_path / "store")
    model = Model(SEED)
    with lsm.Store(path, **OPTIONS, uploads=True, retention=5) as s:
        append(s, model, range(AFTER))
        assert s.flush("remote", timeout=10) == AFTER - 1
        fault.on = True
        with pytest.raises((OSError, lsm.LsmError)) as ei:
            s.compact()
        cause = ei.value if isinstance(ei.value, OSError) else ei.value.__cause__
        assert fault.hits > 0 and isinstance(cause, OSError) and cause.errno == errno.ENOSPC, repr(ei.value)
        assert s.horizon == AFTER - 1 - 5
        check_state(s, model, AFTER - 1, "reads after the failed base image")
        assert remote_seqs(path) == list(range(AFTER)), "a remote log segment went without its base image"
        assert not [n for n in os.listdir(os.path.join(path, "remote")) if n.startswith("base-")]
        fault.on = False
        s.compact()
        assert [n for n in os.listdir(os.path.join(path, "remote")) if n.startswith("base-")]
    shutil.rmtree(os.path.join(path, "disk"))
    shutil.rmtree(os.path.join(path, "log"))
    with lsm.Store(path, budget=0) as s:
        check_state(s, model, AFTER - 1, "restore from the base image")
