"""The compactor's choices: which runs a merge takes (size tiers), and when the budget lets it start.

The runs here are refs with made-up sizes: a merge's choice reads only their headers. The budget
is checked by letting seconds pass on the compactor's credit clock, not by sleeping."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lsm import Store
from lsm.compaction import MANY_RUNS, Compactor, _tiers
from lsm.disk import RunRef

MB = 1 << 20


def refs(*sizes_mb: float, full_at: int = -1) -> list[RunRef]:
    """Runs of one state at seqs 1, 2, ... of the given sizes (MB), oldest first, with
    100,000 entries per MB; the one at index `full_at` holds every live key."""
    return [
        RunRef(b"s", i + 1, i + 1, int(mb * 100_000), 0, 0, 0, 0, int(mb * MB), 0, i == full_at)
        for i, mb in enumerate(sizes_mb)
    ]


def seqs(groups: list[list[RunRef]]) -> list[list[int]]:
    return [[r.hi for r in g] for g in groups]


def test_a_tier_of_many_runs_merges_its_oldest_fanout_at_a_time() -> None:
    """Thirty equal runs waiting (the merges fell behind) make one merge of four, the oldest:
    its cost does not grow with the wait, and the runs left are all newer than its result."""
    assert seqs(_tiers(refs(*[1] * 30), fanout=4, least=4 * MB)) == [[1, 2, 3, 4]]


def test_runs_under_a_bigger_run_still_merge() -> None:
    """Small runs below a run more than fanout times their size are a tier of their own: they
    merge though the newest runs do not call for a merge."""
    groups = _tiers(refs(1, 1, 1, 1, 20, 1), fanout=4, least=4 * MB)
    assert seqs(groups) == [[1, 2, 3, 4]]


def test_every_tier_that_calls_for_a_merge_gives_one() -> None:
    groups = _tiers(refs(16, 16, 16, 16, 1, 1, 1, 1), fanout=4, least=4 * MB)
    assert sorted(seqs(groups)) == [[1, 2, 3, 4], [5, 6, 7, 8]]


def test_nothing_older_than_a_run_of_every_key_joins_its_merge() -> None:
    """A run that holds every live key is the oldest of its tier: newer runs merge into it, and
    the runs under it (which the next fold drops) are a tier of their own."""
    groups = _tiers(refs(1, 1, 1, 1, 1, full_at=2), fanout=3, least=0)
    assert seqs(groups) == [[3, 4, 5]]  # not [[1, 2, 3], ...]: runs 1 and 2 are two, too few
    groups = _tiers(refs(1, 1, 1, 1, 1, 1, 1, full_at=3), fanout=3, least=0)
    assert sorted(seqs(groups)) == [[1, 2, 3], [4, 5, 6]]


def test_small_runs_wait_until_they_are_many() -> None:
    tiny = [0.0001] * (MANY_RUNS - 1)
    assert _tiers(refs(*tiny), fanout=4, least=4 * MB) == []
    assert seqs(_tiers(refs(*tiny, 0.0001), fanout=4, least=4 * MB)) == [list(range(1, MANY_RUNS + 1))]


def test_small_runs_of_uneven_sizes_are_one_tier() -> None:
    """A worker's metadata and output residue: one run a snapshot, of a few KB, every so often
    ten times more. Were the size ratio to split them, no tier would ever hold MANY_RUNS and
    none would merge (a run directory that grows with the run's length); under least / fanout
    bytes every run counts alike, and they merge once they are many."""
    uneven = [0.004 if i % 3 else 0.06 for i in range(MANY_RUNS)]
    assert seqs(_tiers(refs(*uneven), fanout=4, least=4 * MB)) == [list(range(1, MANY_RUNS + 1))]
    assert _tiers(refs(*uneven[:-1]), fanout=4, least=4 * MB) == []
    # a run over the floor still splits them by size: the ratio holds between big runs
    groups = _tiers(refs(*uneven, 8, 8, 8, 8), fanout=4, least=4 * MB)
    assert sorted(seqs(groups)) == [list(range(1, MANY_RUNS + 1)), list(range(MANY_RUNS + 1, MANY_RUNS + 5))]


def test_a_whole_compaction_merges_each_tier_whole() -> None:
    assert seqs(_tiers(refs(*[1] * 10), fanout=4, least=0, whole=True)) == [list(range(1, 11))]


@pytest.fixture
def compactor(tmp_path) -> Iterator[Compactor]:  # noqa: ANN001 - pytest's tmp_path
    s = Store(str(tmp_path / "store"), budget=0.05)
    yield s._persister.compactor
    s.abandon()


def test_a_big_merge_is_not_starved_by_small_ones(compactor: Compactor) -> None:
    """With a merge of 1 s of CPU called for at a budget of 0.05, and small merges called for all
    the time: the small ones run as soon as they are called for, the big one after about
    1 / 0.05 = 20 s, and never sooner. Merges meanwhile spend no more than the budget."""
    c = compactor
    small = (b"s", refs(0.001, 0.001), False, False, [])  # 200 entries
    big = (b"t", refs(2, 2, 2, 2, 2)[:4], False, False, [])  # 4 runs, 800,000 entries
    c._entry_cpu_s = 1.0 / 800_000
    spent, first_big = 0.0, None
    for second in range(1, 41):
        c._credit_at -= 1.0  # a second passes on the credit's clock
        with c.s._cond:
            chosen = c._affordable([small, big])
        assert small in chosen or c._credit_s < c._estimate(small[1])
        for plan in chosen:
            cost = c._estimate(plan[1])
            c._credit_s -= cost
            spent += cost
        if big in chosen and first_big is None:
            first_big = second
        assert spent <= 0.05 * second + 1e-9
    assert first_big is not None, "the big merge never started"
    assert 20 <= first_big <= 22


def test_a_merge_waits_before_it_starts_not_only_after(compactor: Compactor) -> None:
    """After a long idle time the credit holds only what the merges called for cost: a merge
    called for then waits its own cost / budget."""
    c = compactor
    plan = (b"t", refs(2, 2, 2, 2), False, False, [])
    c._entry_cpu_s = 1.0 / 800_000
    c._credit_at -= 3600.0
    with c.s._cond:
        assert c._affordable([]) == []
        c._credit_at -= 10.0
        assert c._affordable([plan]) == []  # 10 s x 0.05 = 0.5 s of credit for a 1 s merge
        c._credit_at -= 10.0
        assert c._affordable([plan]) == [plan]


def test_a_state_of_small_uneven_runs_keeps_few_of_them(tmp_path) -> None:  # noqa: ANN001
    """A worker's metadata as a long run writes it: one key, a run a snapshot of 4 KB and every
    third one of 60 KB, the merges running after every 20 appends. The state's runs stay fewer
    than MANY_RUNS plus the runs of one round, however many were appended, and a read sees the
    last value."""
    s = Store(str(tmp_path / "store"), retention=5, budget=0)
    try:
        most = 0
        for seq in range(1, 601):
            s.append(
                seq, {"meta": {0: (b"m" if seq % 3 else b"M") * (60_000 if seq % 3 == 0 else 4_000) + b"%d" % seq}}
            )
            if seq % 20 == 0:
                s.flush()
                s._persister.drain_index()
                s._persister.compactor.run(full=False)
                most = max(most, len(s.runs("meta")))
        assert most <= MANY_RUNS + 20, most
        assert s.get("meta", 0).endswith(b"600")
    finally:
        s.abandon()
