"""Tests of `lineage.consistent_cut`: the newest consistent cut of the processes' own snapshots.

A rewind starts every process from one of its own snapshots, so the chosen snapshots must agree
on every link (src, dst): dst's snapshot consumed no frame that src's snapshot had not produced,
and every frame in flight between them must be readable from src's output log. A cut that is
inconsistent replays a frame twice or loses one; a cut older than needed throws work away.

Expected values come from hand-worked examples (the index each process ends at is worked out in
a comment) and, for random executions, from a brute force over every combination of snapshot
indices, never from the code under test. The random executions are simulated runs (frames are
consumed only after they were produced, counters only grow, every process starts with an empty
snapshot) plus arbitrary non-decreasing counters for the cases where no cut exists.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lineage import consistent_cut

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Snapshots = dict[int, list[dict[str, dict[int, int]]]]
Call = tuple[int, int, int, int, int]


def snap(consumed: dict[int, int] | None = None, produced: dict[int, int] | None = None) -> dict:
    """One snapshot: frames consumed per incoming link (src -> count), produced per outgoing link."""
    return {"consumed": consumed or {}, "produced": produced or {}}


def recorder(unreadable_seqs: dict[tuple[int, int], set[int]], calls: list[Call]) -> Callable[..., int | None]:
    """An `unreadable` callback over a fixed set of lost frames per link, recording its calls."""

    def unreadable(src: int, index: int, dst: int, lo: int, hi: int) -> int | None:
        calls.append((src, index, dst, lo, hi))
        lost = [q for q in unreadable_seqs.get((src, dst), set()) if lo <= q <= hi]
        return min(lost) if lost else None

    return unreadable


# --- hand-worked cases --------------------------------------------------------------------------


def test_newest_snapshots_already_consistent() -> None:
    # 0 <-> 1. At index 0: link (0, 1): 1 consumed 3 <= 0 produced 3; link (1, 0): 0 consumed
    # 2 <= 1 produced 2. Nothing to move: {0: 0, 1: 0}.
    snapshots = {
        0: [snap({1: 2}, {1: 3}), snap({1: 1}, {1: 1}), snap()],
        1: [snap({0: 3}, {0: 2}), snap({0: 1}, {0: 1}), snap()],
    }
    assert consistent_cut(snapshots) == {0: 0, 1: 0}


def test_a_receiver_ahead_of_its_sender_goes_back_one_snapshot() -> None:
    # 0 -> 1. 0 at index 0 produced 4; 1 at index 0 consumed 5 > 4, at index 1 consumed 3 <= 4.
    # 0 stays at 0, 1 goes to 1.
    snapshots = {
        0: [snap(produced={1: 4}), snap(produced={1: 2})],
        1: [snap({0: 5}), snap({0: 3}), snap({0: 0})],
    }
    assert consistent_cut(snapshots) == {0: 0, 1: 1}


def test_moving_a_receiver_back_forces_its_own_receiver_back() -> None:
    # 1 -> 2 -> 0 (2 also produces to 0). 1 produced 4 on (1, 2).
    # 2 at index 0 consumed 5 > 4 -> index 1 (consumed 4 <= 4), where it produced only 3 on (2, 0).
    # 0 at index 0 consumed 5 from 2: fine against 2's index 0 (produced 6) but not against
    # index 1 (3) -> 0 goes to index 1 (consumed 3 <= 3).
    # Result {0: 1, 1: 0, 2: 1}; 0 is checked before 2, so this needs a second pass.
    snapshots = {
        0: [snap({2: 5}), snap({2: 3}), snap({2: 0})],
        1: [snap(produced={2: 4})],
        2: [snap({1: 5}, {0: 6}), snap({1: 4}, {0: 3})],
    }
    assert consistent_cut(snapshots) == {0: 1, 1: 0, 2: 1}


def test_a_cascade_around_a_cycle_back_to_the_start() -> None:
    # 0 <-> 1, each new snapshot of one is ahead of the other's:
    # (0, 0): 1 consumed 6 > 0 produced 5            -> 1 to index 1 (consumed 4, produced 2)
    # (0, 1): 0 consumed 3 > 1 produced 2            -> 0 to index 1 (consumed 1, produced 2)
    # (1, 1): 1 consumed 4 > 0 produced 2            -> 1 to index 2 (nothing)
    # (1, 2): 0 consumed 1 > 1 produced 0            -> 0 to index 2 (nothing)
    # (2, 2): consistent.
    snapshots = {
        0: [snap({1: 3}, {1: 5}), snap({1: 1}, {1: 2}), snap({1: 0}, {1: 0})],
        1: [snap({0: 6}, {0: 3}), snap({0: 4}, {0: 2}), snap({0: 0}, {0: 0})],
    }
    assert consistent_cut(snapshots) == {0: 2, 1: 2}


def test_three_processes() -> None:
    # Links (0, 1), (0, 2), (1, 2), (2, 0).
    # At index 0: (2, 0): 0 consumed 3 > 2 produced 2 -> 0 to index 1 (consumed 2 from 2,
    # produced 4 to 1 and 2 to 2).
    # (0, 1): 1 consumed 4 <= 4: 1 stays at 0.
    # (0, 2): 2 consumed 4 > 2 -> 2 to index 1 (consumed 2 from 0, 2 from 1, produced 2 to 0).
    # (1, 2): 2 consumed 2 <= 3 (1 at index 0); (2, 0): 0 consumed 2 <= 2. Result {0: 1, 1: 0, 2: 1}.
    snapshots = {
        0: [snap({2: 3}, {1: 6, 2: 4}), snap({2: 2}, {1: 4, 2: 2}), snap()],
        1: [snap({0: 4}, {2: 3}), snap({0: 3}, {2: 2}), snap()],
        2: [snap({0: 4, 1: 3}, {0: 2}), snap({0: 2, 1: 2}, {0: 2}), snap()],
    }
    assert consistent_cut(snapshots) == {0: 1, 1: 0, 2: 1}


def test_no_consistent_cut_when_a_receiver_runs_out_of_snapshots() -> None:
    # 0 -> 1: 0 produced at most 3, every snapshot of 1 consumed more (5, 4).
    snapshots = {
        0: [snap(produced={1: 3}), snap(produced={1: 1})],
        1: [snap({0: 5}), snap({0: 4})],
    }
    assert consistent_cut(snapshots) is None


def test_no_consistent_cut_when_a_cascade_runs_a_process_out() -> None:
    # As the cycle case, but 1 kept no empty snapshot: after (1, 1) 1 must go to index 2,
    # which does not exist.
    snapshots = {
        0: [snap({1: 3}, {1: 5}), snap({1: 1}, {1: 2}), snap()],
        1: [snap({0: 6}, {0: 3}), snap({0: 4}, {0: 2})],
    }
    assert consistent_cut(snapshots) is None


def test_a_process_without_snapshots_means_no_cut() -> None:
    assert consistent_cut({0: [snap()], 1: []}) is None
    assert consistent_cut({0: [], 1: [snap()]}, recorder({}, [])) is None


def test_missing_links_count_as_zero_and_self_links_are_ignored() -> None:
    # 1 lists no produced count for (1, 0): 0. 0 consumed 1 from 1 at index 0 -> index 1.
    # 0's own counters for (0, 0) are nonsense on purpose and must not matter.
    snapshots = {
        0: [snap({1: 1, 0: 9}, {0: 2}), snap({0: 9}, {0: 2})],
        1: [snap({})],
    }
    assert consistent_cut(snapshots) == {0: 1, 1: 0}
    assert consistent_cut({7: [snap({7: 3}, {7: 1})]}) == {7: 0}


# --- unreadable frames in flight, hand-worked ---------------------------------------------------


def test_an_unreadable_frame_in_flight_sends_the_sender_back_then_the_receiver() -> None:
    # 0 -> 1. Consistent at (0, 0): 1 consumed 6 <= 8; frames 7..8 in flight; frame 7 is lost.
    # The callback is asked (src 0, index 0, dst 1, lo 7, hi 8) and answers 7. 0 goes back to
    # the first snapshot that had not produced 7: index 1 (produced 5). Now 1 consumed 6 > 5,
    # so 1 goes to index 1 (consumed 3). In flight 4..5, asked (0, 1, 1, 4, 5): readable.
    # Link (1, 0) carries nothing (lo 1 > hi 0), so the callback is never asked about it.
    snapshots = {
        0: [snap(produced={1: 8}), snap(produced={1: 5}), snap(produced={1: 2}), snap()],
        1: [snap({0: 6}), snap({0: 3}), snap()],
    }
    calls: list[Call] = []
    assert consistent_cut(snapshots, recorder({(0, 1): {7}}, calls)) == {0: 1, 1: 1}
    assert calls == [(0, 0, 1, 7, 8), (0, 1, 1, 4, 5)]


def test_the_sender_skips_every_snapshot_that_produced_the_lost_frame() -> None:
    # As above but frame 4 is lost as well and 0 has two snapshots that produced frame 7.
    # (0, 0): in flight 7..8 -> 7 lost; 0 skips index 1 (produced 7) to index 2 (produced 5).
    # 1 consumed 6 > 5 -> index 1 (consumed 3). In flight 4..5 -> 4 lost; 0 goes to index 3
    # (produced 2); 1 consumed 3 > 2 -> index 2 (consumed 0). In flight 1..2: readable.
    snapshots = {
        0: [snap(produced={1: 8}), snap(produced={1: 7}), snap(produced={1: 5}), snap(produced={1: 2})],
        1: [snap({0: 6}), snap({0: 3}), snap({0: 0})],
    }
    calls: list[Call] = []
    assert consistent_cut(snapshots, recorder({(0, 1): {4, 7}}, calls)) == {0: 3, 1: 2}
    assert calls == [(0, 0, 1, 7, 8), (0, 2, 1, 4, 5), (0, 3, 1, 1, 2)]


def test_an_unreadable_frame_on_one_link_moves_the_sender_on_all_its_links() -> None:
    # 0 -> 1 and 0 -> 2. (0, 0, 0) is consistent; in flight on (0, 1): 3..4, on (0, 2): 2..3.
    # Asked (0, 0, 1, 3, 4) first: frame 4 is lost -> 0 to index 1 (produced 3 to 1, 1 to 2).
    # On (0, 2) now nothing is in flight (2 consumed 1, 0 produced 1), so no question about it.
    # 1 consumed 2 <= 3, 2 consumed 1 <= 1: consistent. Asked (0, 1, 1, 3, 3): readable.
    # Result {0: 1, 1: 0, 2: 0}.
    snapshots = {
        0: [snap(produced={1: 4, 2: 3}), snap(produced={1: 3, 2: 1}), snap()],
        1: [snap({0: 2}), snap()],
        2: [snap({0: 1}), snap()],
    }
    calls: list[Call] = []
    assert consistent_cut(snapshots, recorder({(0, 1): {4}}, calls)) == {0: 1, 1: 0, 2: 0}
    assert calls == [(0, 0, 1, 3, 4), (0, 1, 1, 3, 3)]


def test_a_lost_frame_the_sender_cannot_go_back_past_means_no_cut() -> None:
    # 0 -> 1. In flight 2..3, frame 2 lost; every snapshot of 0 produced it -> None.
    snapshots = {
        0: [snap(produced={1: 3}), snap(produced={1: 2})],
        1: [snap({0: 1}), snap({0: 0})],
    }
    calls: list[Call] = []
    assert consistent_cut(snapshots, recorder({(0, 1): {2}}, calls)) is None
    assert calls == [(0, 0, 1, 2, 3)]


def test_a_lost_frame_outside_the_flight_changes_nothing() -> None:
    # Frame 2 of (0, 1) is lost but 1 consumed it already (consumed 3); in flight 4..5.
    snapshots = {0: [snap(produced={1: 5}), snap()], 1: [snap({0: 3}), snap()]}
    calls: list[Call] = []
    assert consistent_cut(snapshots, recorder({(0, 1): {2}}, calls)) == {0: 0, 1: 0}
    assert calls == [(0, 0, 1, 4, 5)]


# --- brute force over random executions ---------------------------------------------------------


def counts(s: dict, field: str) -> dict[int, int]:
    return {int(k): int(v) for k, v in s[field].items()}


def in_flight(snapshots: Snapshots, cut: dict[int, int], src: int, dst: int) -> range:
    """The chan_seqs of link (src, dst) produced by src's snapshot and not consumed by dst's."""
    consumed = counts(snapshots[dst][cut[dst]], "consumed").get(src, 0)
    produced = counts(snapshots[src][cut[src]], "produced").get(dst, 0)
    return range(consumed + 1, produced + 1)


def is_consistent(snapshots: Snapshots, cut: dict[int, int]) -> bool:
    return all(
        counts(snapshots[dst][cut[dst]], "consumed").get(src, 0)
        <= counts(snapshots[src][cut[src]], "produced").get(dst, 0)
        for src in snapshots
        for dst in snapshots
        if src != dst
    )


def all_cuts(snapshots: Snapshots) -> list[dict[int, int]]:
    procs = sorted(snapshots)
    return [dict(zip(procs, c, strict=True)) for c in itertools.product(*(range(len(snapshots[p])) for p in procs))]


def newest(valid: list[dict[int, int]], procs: list[int]) -> dict[int, int] | None:
    """The component-wise newest (least index) of the valid cuts, if it is itself one of them."""
    if not valid:
        return None
    return {p: min(c[p] for c in valid) for p in procs}


def record_snapshot(draw: st.DrawFn, me: int, w: int, consumed: dict, produced: dict) -> dict:
    """Process me's current counters; links with nothing on them may be left out."""
    others = [q for q in range(w) if q != me]
    c = {s: consumed[(s, me)] for s in others if consumed[(s, me)] or draw(st.booleans())}
    p = {d: produced[(me, d)] for d in others if produced[(me, d)] or draw(st.booleans())}
    return snap(c, p)


@st.composite
def executions(draw: st.DrawFn, max_snapshots: int = 4) -> Snapshots:
    """A simulated run over all links between W processes: each event sends a frame, consumes
    the next sent and not yet consumed frame of a link (FIFO), or snapshots a process's counters.
    Every process starts with a snapshot of nothing. Returned newest first."""
    w = draw(st.integers(2, 4))
    links = [(s, d) for s in range(w) for d in range(w) if s != d]
    produced = dict.fromkeys(links, 0)
    consumed = dict.fromkeys(links, 0)
    taken: dict[int, list[dict]] = {p: [record_snapshot(draw, p, w, consumed, produced)] for p in range(w)}
    for _ in range(draw(st.integers(0, 40))):
        p = draw(st.integers(0, w - 1))
        kind = draw(st.sampled_from(["send", "consume", "snapshot"]))
        if kind == "send":
            produced[(p, draw(st.sampled_from([q for q in range(w) if q != p])))] += 1
        elif kind == "consume":
            ready = [s for s in range(w) if s != p and produced[(s, p)] > consumed[(s, p)]]
            if ready:
                consumed[(draw(st.sampled_from(ready)), p)] += 1
        elif len(taken[p]) < max_snapshots:
            taken[p].append(record_snapshot(draw, p, w, consumed, produced))
    return {p: list(reversed(taken[p])) for p in range(w)}


@st.composite
def monotone_snapshots(draw: st.DrawFn) -> Snapshots:
    """Arbitrary non-decreasing counters, not necessarily from a possible run: a cut may not exist."""
    w = draw(st.integers(2, 4))
    out: Snapshots = {}
    for p in range(w):
        k = draw(st.integers(1, 4))
        lists = {}
        for q in range(w):
            if q != p:
                for field in ("consumed", "produced"):
                    lists[(field, q)] = sorted(draw(st.lists(st.integers(0, 5), min_size=k, max_size=k)), reverse=True)
        out[p] = [
            snap(
                {q: lists[("consumed", q)][i] for q in range(w) if q != p},
                {q: lists[("produced", q)][i] for q in range(w) if q != p},
            )
            for i in range(k)
        ]
    return out


def max_produced(snapshots: Snapshots, src: int, dst: int) -> int:
    return max((counts(s, "produced").get(dst, 0) for s in snapshots[src]), default=0)


@st.composite
def lost_frames(draw: st.DrawFn, snapshots: Snapshots) -> dict[tuple[int, int], set[int]]:
    """A fixed random set of frames per link that no log can supply."""
    lost: dict[tuple[int, int], set[int]] = {}
    for src in snapshots:
        for dst in snapshots:
            n = max_produced(snapshots, src, dst)
            if src != dst and n:
                lost[(src, dst)] = draw(st.sets(st.integers(1, n), max_size=2))
    return lost


def check_calls(snapshots: Snapshots, calls: list[Call], result: dict[int, int] | None) -> None:
    """Each call asks about frames in flight at a cut the search passed through: hi is what src's
    snapshot at `index` produced on the link, lo - 1 what one of dst's snapshots consumed that is
    no older than where dst ends up."""
    for src, index, dst, lo, hi in calls:
        assert src != dst and src in snapshots and dst in snapshots
        assert 0 <= index < len(snapshots[src])
        if result is not None:
            assert index <= result[src]
        assert hi == counts(snapshots[src][index], "produced").get(dst, 0)
        assert 1 <= lo <= hi
        reached = len(snapshots[dst]) if result is None else result[dst] + 1
        assert lo - 1 in {counts(snapshots[dst][i], "consumed").get(src, 0) for i in range(reached)}


@SETTINGS
@given(executions())
def test_the_cut_of_a_simulated_run_is_the_newest_consistent_one(snapshots: Snapshots) -> None:
    before = copy.deepcopy(snapshots)
    result = consistent_cut(snapshots)
    assert snapshots == before
    valid = [c for c in all_cuts(snapshots) if is_consistent(snapshots, c)]
    # the all-empty initial snapshots are always consistent, so a cut exists
    assert valid and result is not None
    assert is_consistent(snapshots, result)
    for c in valid:
        assert all(c[p] >= result[p] for p in snapshots), (c, result)
    assert result == newest(valid, sorted(snapshots))


@SETTINGS
@given(monotone_snapshots())
def test_the_cut_of_monotone_snapshots_is_the_newest_consistent_one_or_none(snapshots: Snapshots) -> None:
    result = consistent_cut(snapshots)
    valid = [c for c in all_cuts(snapshots) if is_consistent(snapshots, c)]
    if not valid:
        assert result is None
        return
    assert result is not None
    assert is_consistent(snapshots, result)
    assert all(all(c[p] >= result[p] for p in snapshots) for c in valid)
    assert result == newest(valid, sorted(snapshots))


def readable(snapshots: Snapshots, lost: dict[tuple[int, int], set[int]], cut: dict[int, int]) -> bool:
    return not any(
        q in lost.get((src, dst), set())
        for src in snapshots
        for dst in snapshots
        if src != dst
        for q in in_flight(snapshots, cut, src, dst)
    )


def check_with_lost_frames(snapshots: Snapshots, lost: dict[tuple[int, int], set[int]]) -> dict[int, int] | None:
    calls: list[Call] = []
    result = consistent_cut(snapshots, recorder(lost, calls))
    valid = [c for c in all_cuts(snapshots) if is_consistent(snapshots, c) and readable(snapshots, lost, c)]
    check_calls(snapshots, calls, result)
    if not valid:
        assert result is None
        return None
    assert result is not None
    assert is_consistent(snapshots, result)
    assert readable(snapshots, lost, result)
    for c in valid:
        assert all(c[p] >= result[p] for p in snapshots), (c, result)
    assert result == newest(valid, sorted(snapshots))
    return result


@SETTINGS
@given(st.data())
def test_the_cut_of_a_simulated_run_has_no_lost_frame_in_flight_and_is_the_newest(data: st.DataObject) -> None:
    snapshots = data.draw(executions())
    lost = data.draw(lost_frames(snapshots))
    # the initial snapshots have nothing in flight, so a cut exists whatever is lost
    assert check_with_lost_frames(snapshots, lost) is not None


@SETTINGS
@given(st.data())
def test_monotone_snapshots_with_lost_frames(data: st.DataObject) -> None:
    snapshots = data.draw(monotone_snapshots())
    check_with_lost_frames(snapshots, data.draw(lost_frames(snapshots)))


@SETTINGS
@given(st.data())
def test_a_log_that_loses_more_the_older_the_sender_stands(data: st.DataObject) -> None:
    """The runtime's callback looks for a frame in the logs of the sender's snapshot and the older
    ones, so a frame lost at one snapshot is lost at every older one too. Each lost frame gets the
    newest index from which on it is lost; the function must still find the newest cut."""
    snapshots = data.draw(executions())
    lost_from: dict[tuple[int, int, int], int] = {}
    for (src, dst), seqs in data.draw(lost_frames(snapshots)).items():
        for q in seqs:
            lost_from[(src, dst, q)] = data.draw(st.integers(0, len(snapshots[src]) - 1))

    def lost_at(src: int, index: int, dst: int, q: int) -> bool:
        return (src, dst, q) in lost_from and index >= lost_from[(src, dst, q)]

    calls: list[Call] = []

    def unreadable(src: int, index: int, dst: int, lo: int, hi: int) -> int | None:
        calls.append((src, index, dst, lo, hi))
        return next((q for q in range(lo, hi + 1) if lost_at(src, index, dst, q)), None)

    result = consistent_cut(snapshots, unreadable)
    check_calls(snapshots, calls, result)
    valid = [
        c
        for c in all_cuts(snapshots)
        if is_consistent(snapshots, c)
        and not any(
            lost_at(src, c[src], dst, q)
            for src in snapshots
            for dst in snapshots
            if src != dst
            for q in in_flight(snapshots, c, src, dst)
        )
    ]
    assert valid and result is not None
    assert result in valid
    assert result == newest(valid, sorted(snapshots))
