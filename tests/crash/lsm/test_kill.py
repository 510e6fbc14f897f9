"""Kill test: a writer process is SIGKILLed at random moments; every reopen must yield exactly a
prefix of the writer's batches that reaches at least the last durable point it reported.

One seeded random.Random chooses the kill moments (replay a run with LSM_CRASH_SEED=<seed>; the
seed is printed and is in every assertion message). The batches (runs of several states) are a
pure function of (seed, seq), so the expected state is replayed in the test by
`workload.Model`, never read back from the store. Background merges run in every round; some
rounds run the writer in "compact" mode and are killed just after it announced a compact()
(seal + upload, merges and folds, base image, LevelDB compaction, log deletion), so that at
least one kill per run lands in the middle of merges or an upload. At the end, the remote tier
alone must restore a prefix of the batches too.

Two more tests kill a single compact() of many states part-way (writer.py compact-once: one
merge per state and fold, each one LevelDB write batch, then a base image), with layouts that
make a half-done compaction visible: versions an as-of read at or after the horizon still
needs, and deleted keys whose older versions a fold drops with their deletions.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

from workload import CHECK_OPTIONS, COMPACT_ONCE_RETENTION, Model, diff, load_all

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

    def __init__(self, tmp_path) -> None:  # noqa: ANN001
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

        store = lsm.Store(self.store_path, **CHECK_OPTIONS)
        try:
            last = store.last_seq
            assert last >= reported, f"{where}: reopened at seq {last}, but the writer had reported {reported} durable"
            self.model.advance(last)
            check_state(store, self.model, last, None, where)
            lo = max(store.horizon, 0)
            for as_of in sorted(self.rng.randint(lo, last) for _ in range(2)):
                check_state(store, self.model, last, as_of, where)
        finally:
            store.close()
        print(f"{where}: reported {reported} durable, last line {lines[-1]!r}, reopened at {last}")
        self.closed_at = last
        return lines[-1] == "compact"


def check_state(store: lsm.Store, model: Model, last: int, as_of: int | None, where: str) -> None:
    """Every state loads as the model says, and no deleted key comes back for get."""
    at = last if as_of is None else as_of
    got, want = load_all(store, as_of), model.state(at)
    assert got == want, (
        f"{where}: state as of seq {at} (last {last}, horizon {store.horizon}) is not the model's:\n{diff(got, want)}"
    )
    for state, keys in model.deleted(at).items():
        for k in keys:
            assert store.get(state, k, as_of=as_of, default=MISSING) is MISSING, (
                f"{where}: deleted key {state!r} {k} came back as of {at}"
            )


MISSING = object()


def restore_copy(path: str, dst: str) -> str:
    """A new store directory holding only `path`'s MANIFEST and remote tier: opening it
    restores from the remote tier alone."""
    os.makedirs(dst)
    shutil.copy2(os.path.join(path, "MANIFEST"), dst)
    shutil.copytree(os.path.join(path, "remote"), os.path.join(dst, "remote"))
    return dst


def test_sigkill_leaves_a_prefix_reaching_the_durable_point(tmp_path) -> None:  # noqa: ANN001
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
    # The remote tier alone restores a prefix of the batches, with every as-of read in it.
    with lsm.Store(restore_copy(run.store_path, str(tmp_path / "restored"))) as s:
        last, where = s.last_seq, f"seed {SEED}, restored from the remote tier"
        assert last <= run.closed_at, f"{where}: restored seq {last}, beyond the store's {run.closed_at}"
        check_state(s, run.model, last, None, where)
        for as_of in sorted({max(s.horizon, 0), (max(s.horizon, 0) + last) // 2, last}):
            check_state(s, run.model, last, as_of, where)
    print(f"{where}: seq {last} of {run.closed_at}")


WIDE_STATES = [f"w{i:02d}" for i in range(16)]
WIDE_KEYS = 100
WIDE_SEQS = 60
BUILD_OPTIONS = dict(budget=0, merge_fanout=1000, uploads=True)
"""How the compaction kill tests build their stores: no merge at all (every run is one append),
so that the writer's compact() does every merge and fold."""


def wide_batch(seq: int) -> dict[str, dict[str, int]]:
    """Every key of every state, set to its seq: the state as of s is {every key: s}."""
    return {state: {f"k{k:03d}": seq * WIDE_KEYS + k for k in range(WIDE_KEYS)} for state in WIDE_STATES}


def wide_state(as_of: int) -> dict[str, int]:
    return {f"k{k:03d}": as_of * WIDE_KEYS + k for k in range(WIDE_KEYS)}


def check_runs(s: lsm.Store, states: list, last: int, where: str) -> int:
    """Every state's runs cover seqs up to `last` without overlapping; returns how many
    states had their runs merged (a kill part-way leaves some merged, some not)."""
    merged = 0
    for state in states:
        runs = s.runs(state)
        assert runs and runs[-1][1] == last, f"{where}: {state} runs {runs}"
        assert all(a[1] < b[0] for a, b in zip(runs, runs[1:], strict=False)), f"{where}: {state} runs {runs}"
        merged += any(lo < hi for lo, hi, _ in runs)
    return merged


def test_sigkill_inside_compaction_keeps_every_readable_version(tmp_path) -> None:  # noqa: ANN001
    """A compact() that folds and merges the runs of 16 states (~90,000 versions dropped) is
    SIGKILLed part-way; after reopening, every seq the store still accepts for an as-of read
    (>= its horizon) reads exactly as before, in every state, merged or not."""
    print(f"compaction kill test: LSM_CRASH_SEED={SEED}")
    rng = random.Random(f"{SEED}/wide")
    inside = 0
    for rnd in range(4):
        where = f"seed {SEED} round {rnd}"
        path = str(tmp_path / f"store-{rnd}")
        with lsm.Store(path, **BUILD_OPTIONS) as s:
            for seq in range(WIDE_SEQS):
                s.append(seq, wide_batch(seq))
            s.compact()
            assert s.horizon == -1 and len(s.runs(WIDE_STATES[0])) == WIDE_SEQS
        w = Writer(path, SEED, "compact-once", str(tmp_path / f"compact-{rnd}.err"))
        try:
            w.wait_for("compact")
            time.sleep(rng.uniform(0, 0.06))
        finally:
            lines = w.kill()
        inside += lines[-1] == "compact"
        killed = "inside" if lines[-1] == "compact" else "after"
        with lsm.Store(path, budget=0) as s:
            last, horizon = s.last_seq, s.horizon
            assert last == WIDE_SEQS - 1, f"{where}: last seq {last}"
            assert horizon <= last - COMPACT_ONCE_RETENTION, f"{where}: horizon {horizon}"
            merged = check_runs(s, WIDE_STATES, last, where)
            for as_of in sorted({max(horizon, 0), (max(horizon, 0) + last) // 2, last}):
                for state in WIDE_STATES:
                    got, want = s.load(state, as_of=as_of), wide_state(as_of)
                    assert got == want, (
                        f"{where} (killed {killed} compact()): {state} as of seq {as_of} (horizon {horizon}):\n"
                        + diff({state: got}, {state: want})
                    )
                    assert s.get(state, "k042", as_of=as_of) == want["k042"], f"{where}: {state} as of {as_of}"
        print(f"{where}: last line {lines[-1]!r}, horizon after reopen {horizon}, {merged} states merged")
    assert inside, f"seed {SEED}: no kill landed inside compact()"


TRAP_STATES = [("t", i) for i in range(24)]
TRAP_KEYS = 2000
TRAP_EVERY = 7


def trap_key(n: int) -> str:
    return f"t{n:06d}"


def test_sigkill_inside_compaction_resurrects_no_deleted_key(tmp_path) -> None:  # noqa: ANN001
    """A fold drops a deleted key's deletion together with the older versions it hides; a
    crash part-way must not leave the older versions without the deletion (the key would come
    back), neither in the local tiers nor in the remote tier's base image.

    Each of 24 states has TRAP_KEYS keys at seq 0, one more key set at each seq up to `last`,
    and every TRAP_EVERY-th key deleted at seq 3, the last seq of the fold: the writer's
    compact() folds seqs 0..3 of each state into one run (one merge each, its LevelDB entry
    that of the run of seq 3) and uploads a base image. A kill between two folds leaves states
    folded and states not: each must read the same."""
    print(f"compaction kill test (deletions): LSM_CRASH_SEED={SEED}")
    rng = random.Random(f"{SEED}/traps")
    traps = set(range(0, TRAP_KEYS, TRAP_EVERY))
    last = 1 + COMPACT_ONCE_RETENTION + 2
    fold_hi = last - COMPACT_ONCE_RETENTION
    want = {trap_key(n): n for n in range(TRAP_KEYS) if n not in traps}
    want["zz"] = last
    inside = 0
    for rnd in range(4):
        where = f"seed {SEED} round {rnd}"
        path = str(tmp_path / f"store-{rnd}")
        with lsm.Store(path, **BUILD_OPTIONS) as s:
            s.append(0, {state: {trap_key(n): n for n in range(TRAP_KEYS)} for state in TRAP_STATES})
            for seq in range(1, last + 1):
                deleted = {trap_key(n): lsm.TOMBSTONE for n in traps} if seq == fold_hi else {}
                s.append(seq, {state: {"zz": seq, **deleted} for state in TRAP_STATES})
            s.compact()
            assert s.horizon == -1
        w = Writer(path, SEED, "compact-once", str(tmp_path / f"traps-{rnd}.err"))
        try:
            w.wait_for("compact")
            time.sleep(rng.uniform(0, 0.06))
        finally:
            lines = w.kill()
        inside += lines[-1] == "compact"
        killed = "inside" if lines[-1] == "compact" else "after"
        restored = restore_copy(path, str(tmp_path / f"restored-{rnd}"))
        for copy, opened in ((path, "reopened"), (restored, "restored from the remote tier")):
            with lsm.Store(copy, budget=0) as s:
                assert s.last_seq == last, f"{where}, {opened}: last seq {s.last_seq}"
                merged = check_runs(s, TRAP_STATES, last, f"{where}, {opened}")
                for state in TRAP_STATES:
                    got = s.load(state)
                    assert got == want, f"{where} (killed {killed} compact()), {opened}: {state}\n" + diff(
                        {state: got}, {state: want}
                    )
                    for n in sorted(traps)[:20]:
                        assert s.get(state, trap_key(n), default=MISSING) is MISSING, f"{where}: {state} {n} came back"
            print(f"{where}, {opened}: last line {lines[-1]!r}, {merged} states merged")
    assert inside, f"seed {SEED}: no kill landed inside compact()"
