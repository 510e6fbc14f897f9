"""Kill test: a writer process is SIGKILLed at random moments; every reopen must yield exactly a
prefix of the writer's batches that reaches at least the last durable point it reported.

One seeded random.Random chooses the kill moments (replay a run with LSM_CRASH_SEED=<seed>; the
seed is printed and is in every assertion message). The batches are a pure function of (seed,
seq), so the expected state is replayed in the test by `workload.Model`, never read back from
the store. Some rounds run the writer in "compact" mode and are killed just after it announced
a compact() (seal + upload, base image, LevelDB compaction, log deletion), so that at least
one kill per run lands in the middle of compaction or an upload.

Two more tests kill a single large compaction part-way (writer.py compact-once), with layouts
that make a half-done compaction visible: versions an as-of read at or after the horizon still
needs, and a deleted key's older versions that its tombstone hides.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

from workload import COMPACT_ONCE_RETENTION, Model, diff

import lsm

SEED = int(os.environ.get("LSM_CRASH_SEED", random.SystemRandom().randrange(2**32)))
ROUNDS = 24
COMPACT_ROUNDS = {3, 7, 11, 15, 19, 23}
KILL_IN_COMPACTION_ROUNDS = {7, 15, 23}
WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "writer.py")
STARTUP_TIMEOUT_S = 60.0


class Writer:
    """A writer.py process and the lines it printed, read by a thread as they come."""

    def __init__(self, store: str, seed: int, mode: str, stderr_path: str) -> None:
        self.stderr_path = stderr_path
        self._stderr = open(stderr_path, "w")  # noqa: SIM115 - closed in kill()
        self.proc = subprocess.Popen(
            [sys.executable, WRITER, store, str(seed), mode],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if not line.endswith("\n"):
                break  # cut by the kill: not a complete report
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def wait_for(self, word: str, after: int = 0) -> int:
        """Blocks until a line starting with `word` (at index >= after) is read; its index."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        with self._cond:
            while True:
                for i in range(after, len(self.lines)):
                    if self.lines[i].split()[0] == word:
                        return i
                if self._eof:
                    raise AssertionError(f"writer exited before printing {word!r}: {self.stderr()}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"writer printed no {word!r} in {STARTUP_TIMEOUT_S}s")
                self._cond.wait(left)

    def kill(self) -> list[str]:
        """SIGKILLs the writer; returns every complete line it printed."""
        self.proc.send_signal(signal.SIGKILL)
        rc = self.proc.wait()
        self._reader.join()
        self.proc.stdout.close()
        self._stderr.close()
        assert rc == -signal.SIGKILL, f"writer exited by itself (rc {rc}): {self.stderr()}"
        return self.lines

    def stderr(self) -> str:
        with open(self.stderr_path) as f:
            return f.read()[-3000:]


class Run:
    """The state the rounds of one run share: the store, the model, where the test closed it."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path
        self.store_path = str(tmp_path / "store")
        self.rng = random.Random(SEED)
        self.model = Model(SEED)
        self.closed_at = -1
        self.rounds = 0

    def round(self, mode: str, in_compaction: bool) -> bool:
        """Starts a writer, kills it, checks the reopened store; True if the kill landed
        inside a compact() call."""
        rnd = self.rounds
        self.rounds += 1
        where = f"seed {SEED} round {rnd} ({mode}{', in compaction' if in_compaction else ''})"
        w = Writer(self.store_path, SEED, mode, str(self.tmp_path / f"writer-{rnd}.err"))
        try:
            seen = w.wait_for("durable")
            if in_compaction:
                w.wait_for("compact", after=seen + 1)
                time.sleep(self.rng.uniform(0, 0.004))
            else:
                time.sleep(self.rng.uniform(0, 0.2))
        finally:
            lines = w.kill()
        opened = [int(x.split()[1]) for x in lines if x.startswith("open ")]
        assert opened == [self.closed_at], (
            f"{where}: the writer opened at {opened}, the test had closed at {self.closed_at}"
        )
        reported = max(int(x.split()[1]) for x in lines if x.startswith("durable "))

        store = lsm.Store(self.store_path)
        try:
            last = store.last_seq
            assert last >= reported, f"{where}: reopened at seq {last}, but the writer had reported {reported} durable"
            self.model.advance(last)
            got = dict(store.scan())
            want = self.model.state(last)
            assert got == want, f"{where}: state at seq {last} is not the model's:\n{diff(got, want)}"
            lo = max(store.horizon, 0)
            for as_of in sorted(self.rng.randint(lo, last) for _ in range(2)):
                got = dict(store.scan(as_of=as_of))
                want = self.model.state(as_of)
                assert got == want, (
                    f"{where}: state as of seq {as_of} (last {last}, horizon {store.horizon}) "
                    f"is not the model's:\n{diff(got, want)}"
                )
        finally:
            store.close()
        print(f"{where}: reported {reported} durable, last line {lines[-1]!r}, reopened at {last}")
        self.closed_at = last
        return lines[-1] == "compact"


def test_sigkill_leaves_a_prefix_reaching_the_durable_point(tmp_path) -> None:
    print(f"kill test: LSM_CRASH_SEED={SEED}")
    run = Run(tmp_path)
    in_compaction = 0
    for rnd in range(ROUNDS):
        mode = "compact" if rnd in COMPACT_ROUNDS else "plain"
        in_compaction += run.round(mode, rnd in KILL_IN_COMPACTION_ROUNDS)
    # A kill aimed at a compact() call (~5 ms) may land just after it; aim again until one hits.
    for _ in range(10):
        if in_compaction:
            break
        in_compaction += run.round("compact", True)
    assert in_compaction, f"seed {SEED}: none of the kills aimed at compact() landed inside it"


WIDE_KEYS = 1000
WIDE_SEQS = 60


def wide_batch(seq: int) -> list[tuple[str, int]]:
    """Every key, set to its seq: the state as of s is {every key: s}."""
    return [(f"w{k:04d}", seq * WIDE_KEYS + k) for k in range(WIDE_KEYS)]


def wide_state(as_of: int) -> dict[str, int]:
    return {f"w{k:04d}": as_of * WIDE_KEYS + k for k in range(WIDE_KEYS)}


def test_sigkill_inside_compaction_keeps_every_readable_version(tmp_path) -> None:
    """A compaction that drops ~60,000 versions is SIGKILLed part-way; after reopening, every
    seq the store still accepts for an as-of read (>= its horizon) reads exactly as before."""
    print(f"compaction kill test: LSM_CRASH_SEED={SEED}")
    rng = random.Random(f"{SEED}/wide")
    inside = 0
    for rnd in range(4):
        where = f"seed {SEED} round {rnd}"
        path = str(tmp_path / f"store-{rnd}")
        # Build with the default retention: compact() here only flushes, uploads and indexes
        # everything, so that the writer's compact() goes straight to dropping versions.
        with lsm.Store(path, compact_every_updates=0) as s:
            for seq in range(WIDE_SEQS):
                s.append(seq, wide_batch(seq))
            s.compact()
            assert s.horizon == -1
        w = Writer(path, SEED, "compact-once", str(tmp_path / f"compact-{rnd}.err"))
        try:
            w.wait_for("compact")
            time.sleep(rng.uniform(0, 0.06))
        finally:
            lines = w.kill()
        inside += lines[-1] == "compact"
        with lsm.Store(path) as s:
            last, horizon = s.last_seq, s.horizon
            assert last == WIDE_SEQS - 1, f"{where}: last seq {last}"
            assert horizon <= last - COMPACT_ONCE_RETENTION, f"{where}: horizon {horizon}"
            for as_of in sorted({max(horizon, 0), (max(horizon, 0) + last) // 2, last}):
                got, want = dict(s.scan(as_of=as_of)), wide_state(as_of)
                assert got == want, (
                    f"{where} (killed {'inside' if lines[-1] == 'compact' else 'after'} "
                    f"compact()): as of seq {as_of} (horizon {horizon}):\n{diff(got, want)}"
                )
        print(f"{where}: last line {lines[-1]!r}, horizon after reopen {horizon}")
    assert inside, f"seed {SEED}: no kill landed inside compact()"


TRAP_EVERY = 4095
TRAPS = 12


def trap_key(n: int) -> str:
    return f"t{n:06d}"


def test_sigkill_inside_compaction_resurrects_no_deleted_key(tmp_path) -> None:
    """Compaction drops a deleted key's tombstone together with its older versions; a crash
    part-way must not leave the older versions without the tombstone (the key would come back).

    Compaction writes its deletions to LevelDB in chunks of about 4096 versions visited
    (lsm/disk.py, collect). Keys are visited in order; most have one version, and every
    TRAP_EVERY-th key has two (value at seq 0, deletion at seq 1), placed so that its tombstone
    is exactly the 4096th, 8192nd, ... version visited: a chunk cut by count alone ends between
    the tombstone and the value it hides, and a kill between two chunk writes, wherever it
    lands, brings the key back."""
    print(f"compaction kill test (tombstones): LSM_CRASH_SEED={SEED}")
    rng = random.Random(f"{SEED}/traps")
    n_keys = TRAP_EVERY * TRAPS + 100
    traps = [n for n in range(TRAP_EVERY, n_keys, TRAP_EVERY)]
    last = 1 + COMPACT_ONCE_RETENTION + 2
    want = {trap_key(n): n for n in range(n_keys) if n not in set(traps)}
    want["zz"] = last
    inside = 0
    for rnd in range(4):
        where = f"seed {SEED} round {rnd}"
        path = str(tmp_path / f"store-{rnd}")
        with lsm.Store(path, compact_every_updates=0) as s:
            s.append(0, [(trap_key(n), n) for n in range(n_keys)])
            s.append(1, [(trap_key(n), lsm.TOMBSTONE) for n in traps])
            for seq in range(2, last + 1):
                s.append(seq, [("zz", seq)])
            s.compact()
            assert s.horizon == -1
        w = Writer(path, SEED, "compact-once", str(tmp_path / f"traps-{rnd}.err"))
        try:
            w.wait_for("compact")
            time.sleep(rng.uniform(0, 0.06))
        finally:
            lines = w.kill()
        inside += lines[-1] == "compact"
        with lsm.Store(path) as s:
            got = dict(s.scan())
            assert s.last_seq == last, f"{where}: last seq {s.last_seq}"
            assert got == want, (
                f"{where} (killed {'inside' if lines[-1] == 'compact' else 'after'} compact()):\n{diff(got, want)}"
            )
        print(f"{where}: last line {lines[-1]!r}")
    assert inside, f"seed {SEED}: no kill landed inside compact()"
