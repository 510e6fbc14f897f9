"""Tests of the lineage package: safe points, the stash, recovery and rewind plans, the log.

Expected values come from the documented contract and from small models kept here (a simulated
run of processes exchanging frames, a dict per origin for the stash, a DFS for the cone, the
record framing written out by hand), never from the code under test.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
from typing import Any

import msgpack
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import lineage
from lineage import (
    EOS,
    CorruptLineageLogError,
    LineageError,
    LineageLog,
    Stash,
    merge_lineage,
    recovery_plan,
    rewind_plan,
    safe_point,
)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FILE_SETTINGS = settings(SETTINGS, max_examples=60)
"""For examples that create, fsync and reopen files."""


def as_lists(entries: list[tuple[int, tuple]]) -> list[list[Any]]:
    """Entries as they come back from msgpack."""
    return [[s, list(e)] for s, e in entries]


# --- safe_point ---------------------------------------------------------------------------------


def point(step: int = 0, frontier: int = 0, consumed: dict | None = None, produced: dict | None = None) -> dict:
    return {"step": step, "frontier": frontier, "consumed": consumed or {}, "produced": produced or {}}


def test_safe_point_is_the_least_frontier() -> None:
    assert safe_point({0: point(frontier=5), 1: point(frontier=3), 2: point(frontier=EOS)}, 3) == 3


def test_safe_point_is_minus_one_while_a_process_has_not_reported() -> None:
    assert safe_point({0: point(frontier=5), 2: point(frontier=7)}, 3) == -1
    assert safe_point({}, 2) == -1


def test_safe_point_ignores_other_process_numbers_and_reaches_eos() -> None:
    assert safe_point({0: point(frontier=EOS), 1: point(frontier=EOS), 5: point(frontier=0)}, 2) == EOS


def test_safe_point_of_no_processes() -> None:
    assert safe_point({}, 0) == -1


@SETTINGS
@given(
    processes=st.integers(1, 6),
    frontiers=st.dictionaries(st.integers(0, 7), st.integers(-1, 30) | st.just(EOS), max_size=8),
)
def test_safe_point_equals_the_min_frontier(processes: int, frontiers: dict[int, int]) -> None:
    points = {p: point(frontier=f) for p, f in frontiers.items()}
    reported = [frontiers[p] for p in range(processes) if p in frontiers]
    expected = sorted(reported)[0] if len(reported) == processes else -1
    assert safe_point(points, processes) == expected


# --- Stash --------------------------------------------------------------------------------------


def entry_of(origin: int, step: int) -> tuple:
    return ("i", origin, step * 10)


def test_stash_add_skips_repeats_and_keeps_entries_after_a_gap() -> None:
    s = Stash()
    s.add(1, [(1, ("s", 0, None)), (2, ("F",))])
    s.add(1, [(2, ("F",)), (1, ("s", 0, None)), (5, ["i", 0, 3])])
    s.add(1, [(3, ("F",))])  # below the highest held step (5): a repeat, skipped
    assert s.entries(1) == [(1, ("s", 0, None)), (2, ("F",)), (5, ("i", 0, 3))]
    assert s.contiguous(1, 0) == [(1, ("s", 0, None)), (2, ("F",))]
    assert s.contiguous(1, 2) == []
    assert s.contiguous(1, 4) == [(5, ("i", 0, 3))]
    assert s.contiguous(9, 0) == []
    assert s.origins() == [1]


def test_stash_delta_hands_each_entry_once_per_dest() -> None:
    s = Stash()
    s.add(0, [(1, ("F",)), (2, ("s", 1, 4))])
    assert s.delta(7, 0) == [(1, ("F",)), (2, ("s", 1, 4))]
    assert s.delta(7, 0) == []
    assert s.delta(8, 0) == [(1, ("F",)), (2, ("s", 1, 4))]
    s.add(0, [(3, ("f", 2, 1))])
    assert s.delta(7, 0) == [(3, ("f", 2, 1))]
    assert s.delta(7, 5) == []
    s.reset_marks(7)
    assert s.delta(7, 0) == [(1, ("F",)), (2, ("s", 1, 4)), (3, ("f", 2, 1))]
    assert s.delta(8, 0) == [(3, ("f", 2, 1))]


def test_stash_trim_drops_and_remembers() -> None:
    s = Stash()
    s.add(2, [(i, ("F",)) for i in range(1, 6)])
    s.trim(2, 3)
    assert s.entries(2) == [(4, ("F",)), (5, ("F",))]
    s.trim(2, 1)  # a lower trim never brings entries back or lowers the trimmed step
    assert s.trimmed(2) == 3
    s.trim(2, 9)
    assert s.entries(2) == [] and s.origins() == [] and s.trimmed(2) == 9
    s.add(2, [(8, ("F",)), (9, ("F",)), (10, ("F",))])
    assert s.entries(2) == [(10, ("F",))]
    s.trim(4, 6)
    s.add(4, [(6, ("F",)), (8, ("F",))])
    assert s.entries(4) == [(8, ("F",))]


def test_stash_msgpack_round_trip_keeps_entries_and_trims_but_not_marks() -> None:
    s = Stash()
    s.add(0, [(1, ("s", 0, None)), (3, ("i", 2, 1))])
    s.add(3, [(4, ("F",))])
    s.trim(3, 4)
    s.trim(5, 2)
    s.delta(1, 0)
    t = Stash.from_msgpack(s.to_msgpack())
    assert t.entries(0) == [(1, ("s", 0, None)), (3, ("i", 2, 1))]
    assert t.origins() == [0]
    assert t.trimmed(3) == 4 and t.trimmed(5) == 2
    t.add(5, [(2, ("F",))])
    assert t.entries(5) == []
    assert t.delta(1, 0) == [(1, ("s", 0, None)), (3, ("i", 2, 1))]


@pytest.mark.parametrize(
    "data", [b"", b"\xc1", msgpack.packb([99, []]), msgpack.packb([1, [[0, 0, [1], []]]]), b"x" * 5]
)
def test_stash_from_bad_bytes_raises(data: bytes) -> None:
    with pytest.raises(LineageError):
        Stash.from_msgpack(data)


def test_stash_delta_limit_hands_the_rest_later() -> None:
    s = Stash()
    s.add(0, [(i, ("F",)) for i in range(1, 11)])
    assert [st for st, _ in s.delta(1, 0, limit=4)] == [1, 2, 3, 4]
    assert [st for st, _ in s.delta(1, 0, limit=4)] == [5, 6, 7, 8]
    assert [st for st, _ in s.delta(1, 0)] == [9, 10]
    assert s.delta(1, 0) == []


ORIGINS = st.integers(0, 2)
DESTS = st.integers(0, 2)


class StashMachine(RuleBasedStateMachine):
    """The Stash beside a model: origin -> {step: entry}, trimmed steps, and per (dest, origin)
    the steps handed since the last reset."""

    def __init__(self) -> None:
        super().__init__()
        self.stash = Stash()
        self.held: dict[int, dict[int, tuple]] = {0: {}, 1: {}, 2: {}}
        self.trimmed = {0: 0, 1: 0, 2: 0}
        self.handed: dict[tuple[int, int], set[int]] = {}

    def high(self, origin: int) -> int:
        return max([self.trimmed[origin], *self.held[origin]])

    @rule(origin=ORIGINS, steps=st.lists(st.integers(1, 40), max_size=6), lists=st.booleans())
    def add(self, origin: int, steps: list[int], lists: bool) -> None:
        batch = [(s, entry_of(origin, s)) for s in steps]
        self.stash.add(origin, as_lists(batch) if lists else batch)
        for s in sorted(steps):
            if s > self.high(origin):
                self.held[origin][s] = entry_of(origin, s)

    @rule(dest=DESTS, origin=ORIGINS)
    def delta(self, dest: int, origin: int) -> None:
        got = self.stash.delta(dest, origin)
        handed = self.handed.setdefault((dest, origin), set())
        mark = max(handed, default=0)
        assert got == [(s, self.held[origin][s]) for s in sorted(self.held[origin]) if s > mark]
        assert not handed & {s for s, _ in got}, "an entry handed twice to the same dest"
        handed.update(s for s, _ in got)

    @rule(origin=ORIGINS, upto=st.integers(0, 40))
    def trim(self, origin: int, upto: int) -> None:
        self.stash.trim(origin, upto)
        self.trimmed[origin] = max(self.trimmed[origin], upto)
        self.held[origin] = {s: e for s, e in self.held[origin].items() if s > upto}

    @rule(dest=DESTS)
    def reset_marks(self, dest: int) -> None:
        self.stash.reset_marks(dest)
        for key in self.handed:
            if key[0] == dest:
                self.handed[key] = set()

    @rule()
    def reload(self) -> None:
        self.stash = Stash.from_msgpack(self.stash.to_msgpack())
        self.handed = {}

    @rule(origin=ORIGINS, after=st.integers(0, 40))
    def contiguous(self, origin: int, after: int) -> None:
        expected = []
        s = after + 1
        while s in self.held[origin]:
            expected.append((s, self.held[origin][s]))
            s += 1
        assert self.stash.contiguous(origin, after) == expected

    @invariant()
    def agrees(self) -> None:
        for origin, held in self.held.items():
            assert self.stash.entries(origin) == sorted(held.items())
        assert self.stash.origins() == [o for o in sorted(self.held) if self.held[o]]

    def teardown(self) -> None:
        # Eventually every held entry reaches every dest.
        for dest in range(3):
            for origin in range(3):
                handed = self.handed.get((dest, origin), set())
                got = {s for s, _ in self.stash.delta(dest, origin)}
                assert not handed & got
                assert set(self.held[origin]) <= handed | got


TestStashModel = StashMachine.TestCase
TestStashModel.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)


# --- merge_lineage ------------------------------------------------------------------------------


def test_merge_lineage_unions_holders_and_stops_at_the_first_gap() -> None:
    a = [(3, ("F",)), (4, ("s", 0, 1))]
    b = as_lists([(4, ("s", 0, 1)), (5, ("i", 1, 2)), (7, ("F",))])
    c = [(2, ("F",))]
    assert merge_lineage([a, b, c], 2) == [(3, ("F",)), (4, ("s", 0, 1)), (5, ("i", 1, 2))]
    assert merge_lineage([a, b, c], 1) == [(2, ("F",)), (3, ("F",)), (4, ("s", 0, 1)), (5, ("i", 1, 2))]
    assert merge_lineage([a, b, c], 0) == []
    assert merge_lineage([a, b, c], 6) == [(7, ("F",))]
    assert merge_lineage([], 0) == []


def test_merge_lineage_refuses_holders_that_disagree() -> None:
    with pytest.raises(LineageError) as e:
        merge_lineage([[(4, ("s", 0, 1))], [(4, ("s", 0, 2))]], 3)
    msg = str(e.value)
    assert "step 4" in msg and "('s', 0, 1)" in msg and "('s', 0, 2)" in msg


# --- recovery_plan: examples --------------------------------------------------------------------


def test_recovery_plan_example() -> None:
    # Process 1 of 3 consumes from 0 and produces to 2; durable at step 2.
    points = {1: point(step=2, frontier=0, consumed={0: 1}, produced={2: 1})}
    held = {1: [[(3, ("i", 0, 2)), (4, ("f", 0, 2))], as_lists([(4, ("f", 0, 2)), (5, ("i", 0, 3)), (7, ("F",))])]}
    plan = recovery_plan({1}, points, held, 3)
    assert plan == {
        1: {
            "restore_step": 2,
            "replay": [(3, ("i", 0, 2)), (4, ("f", 0, 2)), (5, ("i", 0, 3))],
            "resend_from": {0: 2, 2: 1},
            "check": {0: 1, 2: 2},
            "needs": {0: [2, 3], 2: []},
        }
    }


def test_recovery_plan_of_a_process_without_a_point_starts_from_nothing() -> None:
    plan = recovery_plan([0], {}, {0: [[(1, ("s", 0, None)), (2, ("f", 0, 1))]]}, 2)
    assert plan == {
        0: {
            "restore_step": 0,
            "replay": [(1, ("s", 0, None)), (2, ("f", 0, 1))],
            "resend_from": {1: 1},
            "check": {1: 1},
            "needs": {1: []},
        }
    }


def test_recovery_plan_refuses_a_replay_that_reads_a_frame_twice() -> None:
    points = {1: point(step=2, consumed={0: 3})}
    with pytest.raises(LineageError, match=r"step 3 would consume frame 3 of link \(0, 1\) again"):
        recovery_plan({1}, points, {1: [[(3, ("i", 0, 3))]]}, 2)


def test_recovery_plan_refuses_frames_out_of_order() -> None:
    points = {1: point(step=2, consumed={0: 3})}
    with pytest.raises(LineageError, match="consumes frame 5 .* expected frame 4"):
        recovery_plan({1}, points, {1: [[(3, ("i", 0, 5))]]}, 2)
    with pytest.raises(LineageError, match="consumes frame 4 .* expected frame 5"):
        recovery_plan({1}, points, {1: [[(3, ("i", 0, 4)), (4, ("i", 0, 4))]]}, 2)


def test_recovery_plan_passes_on_holders_that_disagree() -> None:
    with pytest.raises(LineageError, match="step 1"):
        recovery_plan({0}, {}, {0: [[(1, ("F",))], [(1, ("s", 0, None))]]}, 2)


def test_recovery_plan_refuses_an_unknown_process() -> None:
    with pytest.raises(ValueError, match="process 3"):
        recovery_plan({3}, {}, {}, 3)


# --- recovery_plan: simulated runs --------------------------------------------------------------


@st.composite
def simulated_runs(draw: st.DrawFn) -> dict[str, Any]:
    """A run of processes over random links (a DAG), executed step by step: each step consumes
    the next frame of an incoming link (FIFO), reads a source chunk, or flushes frames out."""
    processes = draw(st.integers(2, 5))
    order = draw(st.permutations(range(processes)))
    links = [(order[a], order[b]) for a in range(processes) for b in range(a + 1, processes) if draw(st.booleans())]
    incoming = {p: [s for s, d in links if d == p] for p in range(processes)}
    outgoing = {p: [d for s, d in links if s == p] for p in range(processes)}
    produced = dict.fromkeys(links, 0)
    consumed = dict.fromkeys(links, 0)
    steps: dict[int, list[tuple]] = {p: [] for p in range(processes)}
    # after[p][k]: (consumed, produced) counters of p after its step k (k = 0: before any)
    after: dict[int, list[tuple[dict, dict]]] = {p: [({}, {})] for p in range(processes)}
    for _ in range(draw(st.integers(0, 40))):
        p = draw(st.integers(0, processes - 1))
        kind = draw(st.sampled_from("isfF"))
        ready = [s for s in incoming[p] if produced[(s, p)] > consumed[(s, p)]]
        if kind == "i" and ready:
            src = draw(st.sampled_from(ready))
            consumed[(src, p)] += 1
            entry: tuple = ("i", src, consumed[(src, p)])
        elif kind == "f" and outgoing[p]:
            dst = draw(st.sampled_from(outgoing[p]))
            produced[(p, dst)] += 1
            entry = ("f", draw(st.integers(0, 2)), dst)
        elif kind == "F":
            for dst in outgoing[p]:
                produced[(p, dst)] += 1
            entry = ("F",)
        else:
            entry = ("s", draw(st.integers(0, 2)), draw(st.none() | st.integers(0, 9)))
        steps[p].append(entry)
        after[p].append(
            (
                {s: consumed[(s, p)] for s in incoming[p]},
                {d: produced[(p, d)] for d in outgoing[p]},
            )
        )
    return {"processes": processes, "steps": steps, "after": after}


@st.composite
def recoveries(draw: st.DrawFn) -> dict[str, Any]:
    run = draw(simulated_runs())
    processes, steps, after = run["processes"], run["steps"], run["after"]
    points: dict[int, dict] = {}
    for p in range(processes):
        if draw(st.integers(0, 4)) == 0:
            continue  # not reported yet
        d = draw(st.integers(0, len(steps[p])))
        c, prod = after[p][d]
        # a link with nothing consumed or produced yet may be left out of the point
        c = {s: n for s, n in c.items() if n or draw(st.booleans())}
        prod = {t: n for t, n in prod.items() if n or draw(st.booleans())}
        points[p] = {"step": d, "frontier": draw(st.integers(0, 9)), "consumed": c, "produced": prod}
    failed = draw(st.sets(st.integers(0, processes - 1), min_size=1, max_size=processes))
    survivors = [q for q in range(processes) if q not in failed]
    held: dict[int, list[list]] = {}
    for p in failed:
        n = len(steps[p])
        holders = []
        for _ in survivors:
            if draw(st.booleans()):
                # what it received (a prefix), less what it trimmed
                lo = draw(st.integers(1, n + 1))
                hi = draw(st.integers(lo - 1, n))
                chosen = list(range(lo, hi + 1))
            else:
                chosen = sorted(draw(st.sets(st.integers(1, max(n, 1)), max_size=n)))
            entries = [(s, steps[p][s - 1]) for s in chosen]
            holders.append(as_lists(entries) if draw(st.booleans()) else entries)
        held[p] = holders
    return {**run, "points": points, "failed": failed, "held": held}


@SETTINGS
@given(recoveries())
def test_recovery_plan_on_simulated_runs(r: dict[str, Any]) -> None:
    processes, steps, after, points, held = r["processes"], r["steps"], r["after"], r["points"], r["held"]
    plans = recovery_plan(r["failed"], points, held, processes)
    assert set(plans) == r["failed"]
    for p, plan in plans.items():
        d = points[p]["step"] if p in points else 0
        assert plan["restore_step"] == d
        covered = {s for holder in held[p] for s, _ in holder}
        expected_steps = []
        s = d + 1
        while s in covered:
            expected_steps.append(s)
            s += 1
        assert all(s > d for s, _ in plan["replay"])
        assert plan["replay"] == [(s, steps[p][s - 1]) for s in expected_steps]
        others = [q for q in range(processes) if q != p]
        at_restore_c, at_restore_p = after[p][d]
        assert plan["resend_from"] == {q: at_restore_c.get(q, 0) + 1 for q in others}
        assert plan["check"] == {q: at_restore_p.get(q, 0) + 1 for q in others}
        at_end_c, _ = after[p][d + len(expected_steps)]
        assert plan["needs"] == {q: list(range(at_restore_c.get(q, 0) + 1, at_end_c.get(q, 0) + 1)) for q in others}


# --- rewind_plan --------------------------------------------------------------------------------

DIAMOND = [("src", "map"), ("src", "filter"), ("map", "join"), ("filter", "join"), ("join", "sink")]


def test_rewind_plan_example() -> None:
    starts = {
        ("src", 0): [(0, 1), (1, 5)],
        ("map", 0): [(0, 1), (1, 4), (3, 9)],
        ("map", 1): [(0, 2)],
        ("join", 0): [(2, 7), (4, 12)],
        ("sink", 0): [],
    }
    plan = rewind_plan(DIAMOND, "map", 1, starts)
    assert plan == {
        "cone": ["join", "map", "sink"],
        "start": {("map", 0): 4, ("map", 1): None, ("join", 0): 7, ("sink", 0): None},
    }
    assert rewind_plan(DIAMOND, "map", 2, starts)["start"][("map", 0)] == 9
    assert rewind_plan(DIAMOND, "src", 0, starts)["cone"] == ["filter", "join", "map", "sink", "src"]


def test_rewind_plan_of_an_operator_without_edges() -> None:
    assert rewind_plan([], "only", 0, {("only", 0): [(0, 3)]}) == {"cone": ["only"], "start": {("only", 0): 3}}


def test_rewind_plan_refuses_an_unknown_operator() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        rewind_plan(DIAMOND, "nope", 0, {})


def reachable(edges: list[tuple[str, str]], start: str) -> set[str]:
    seen: set[str] = set()

    def visit(op: str) -> None:
        if op not in seen:
            seen.add(op)
            for up, down in edges:
                if up == op:
                    visit(down)

    visit(start)
    return seen


@st.composite
def rewinds(draw: st.DrawFn) -> dict[str, Any]:
    ops = [f"op{i}" for i in range(draw(st.integers(1, 7)))]
    edges = [(ops[a], ops[b]) for a in range(len(ops)) for b in range(a + 1, len(ops)) if draw(st.booleans())]
    epoch_starts: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for op in ops:
        for instance in range(draw(st.integers(0, 3))):
            epochs = sorted(draw(st.sets(st.integers(0, 12), max_size=5)))
            first_steps = sorted(draw(st.sets(st.integers(1, 100), min_size=len(epochs), max_size=len(epochs))))
            epoch_starts[(op, instance)] = list(zip(epochs, first_steps, strict=True))
    in_graph = sorted({op for e in edges for op in e} | {op for op, _ in epoch_starts})
    if not in_graph:
        ops.append("lone")
        epoch_starts[("lone", 0)] = [(0, 1)]
        in_graph = ["lone"]
    return {
        "edges": edges,
        "operator": draw(st.sampled_from(in_graph)),
        "epoch": draw(st.integers(0, 13)),
        "epoch_starts": epoch_starts,
    }


@SETTINGS
@given(rewinds())
def test_rewind_plan_cone_and_starts(r: dict[str, Any]) -> None:
    plan = rewind_plan(r["edges"], r["operator"], r["epoch"], r["epoch_starts"])
    cone = reachable(r["edges"], r["operator"])
    assert plan["cone"] == sorted(cone)
    expected: dict[tuple[str, int], int | None] = {}
    for (op, instance), starts in r["epoch_starts"].items():
        if op in cone:
            expected[(op, instance)] = next((s for e, s in starts if e >= r["epoch"]), None)
    assert plan["start"] == expected


# --- LineageLog ---------------------------------------------------------------------------------


def frame(step: int, entry: tuple) -> bytes:
    """The documented record framing, written out independently of lineage.log."""
    payload = msgpack.packb([step, list(entry)])
    return struct.pack("<IQ", len(payload), xxhash.xxh64_intdigest(payload, seed=len(payload))) + payload


SAMPLE = [(1, ("s", 0, None)), (2, ("i", 3, 1)), (4, ("f", 1, 2)), (5, ("F",)), (9, ("s", 1, 7))]


def test_log_round_trip_and_bytes(tmp_path: Any) -> None:
    path = str(tmp_path / "lineage.log")
    with LineageLog(path) as log:
        log.append(SAMPLE[:3])
        assert log.read() == SAMPLE[:3]  # buffered entries are read too
        log.flush()
        log.append(as_lists(SAMPLE[3:]))
        assert log.read(2) == SAMPLE[2:]
        assert log.last_step == 9
    with open(path, "rb") as f:
        assert f.read() == b"".join(frame(s, e) for s, e in SAMPLE)
    with LineageLog(path) as log:
        assert log.read() == SAMPLE
        assert log.read(after_step=4) == SAMPLE[3:]
        assert log.last_step == 9
        log.append([(10, ("F",))])
    with LineageLog(path) as log:
        assert log.read() == [*SAMPLE, (10, ("F",))]


def test_log_refuses_steps_that_do_not_increase(tmp_path: Any) -> None:
    path = str(tmp_path / "lineage.log")
    with LineageLog(path) as log:
        log.append([(3, ("F",))])
        with pytest.raises(LineageError, match="step 3 appended after step 3"):
            log.append([(3, ("F",))])
    with LineageLog(path) as log, pytest.raises(LineageError, match="step 2"):
        log.append([(2, ("F",))])


def test_log_truncate_before(tmp_path: Any) -> None:
    path = str(tmp_path / "lineage.log")
    with LineageLog(path) as log:
        log.append(SAMPLE[:4])
        log.flush()
        log.append(SAMPLE[4:])
        log.truncate_before(2)
        assert log.read() == SAMPLE[2:]
        log.append([(11, ("F",))])
    assert sorted(os.listdir(tmp_path)) == ["lineage.log"]
    with open(path, "rb") as f:
        assert f.read() == b"".join(frame(s, e) for s, e in [*SAMPLE[2:], (11, ("F",))])
    with LineageLog(path) as log:
        log.truncate_before(100)
        assert log.read() == []
    assert os.path.getsize(path) == 0


def write_sample(path: str, entries: list[tuple[int, tuple]]) -> list[int]:
    """Writes entries as records by hand; returns each record's start offset and the end."""
    offsets = [0]
    with open(path, "wb") as f:
        for s, e in entries:
            f.write(frame(s, e))
            offsets.append(f.tell())
    return offsets


ENTRIES = st.lists(
    st.tuples(st.integers(1, 5), st.sampled_from([("F",), ("s", 1, None), ("i", 2, 7), ("f", 0, 3)])),
    min_size=1,
    max_size=8,
).map(lambda xs: [(sum(d for d, _ in xs[: i + 1]), e) for i, (_, e) in enumerate(xs)])


@FILE_SETTINGS
@given(entries=ENTRIES, data=st.data())
def test_log_cuts_a_torn_tail(entries: list[tuple[int, tuple]], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "lineage.log")
        offsets = write_sample(path, entries)
        last, end = offsets[-2], offsets[-1]
        if data.draw(st.booleans(), label="flip a byte instead of cutting"):
            at = data.draw(st.integers(last, end - 1), label="flipped byte")
            with open(path, "r+b") as f:
                f.seek(at)
                byte = f.read(1)[0]
                f.seek(at)
                f.write(bytes([byte ^ data.draw(st.integers(1, 255), label="mask")]))
        else:
            os.truncate(path, data.draw(st.integers(last + 1, end - 1), label="cut at"))
        with LineageLog(path) as log:
            assert log.read() == entries[:-1]
            assert os.path.getsize(path) == last
            log.append([(entries[-1][0] + 1, ("F",))])
        with LineageLog(path) as log:
            assert log.read() == [*entries[:-1], (entries[-1][0] + 1, ("F",))]


@FILE_SETTINGS
@given(entries=ENTRIES.filter(lambda xs: len(xs) >= 2), data=st.data())
def test_log_refuses_corruption_in_the_middle(entries: list[tuple[int, tuple]], data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "lineage.log")
        offsets = write_sample(path, entries)
        k = data.draw(st.integers(0, len(entries) - 2), label="damaged record")
        at = data.draw(st.integers(offsets[k], offsets[k + 1] - 1), label="flipped byte")
        with open(path, "r+b") as f:
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ data.draw(st.integers(1, 255), label="mask")]))
        size = os.path.getsize(path)
        with pytest.raises(CorruptLineageLogError) as e:
            LineageLog(path)
        assert e.value.offset == offsets[k]
        assert path in str(e.value) and f"offset {offsets[k]}" in str(e.value)
        assert os.path.getsize(path) == size, "a corrupt log must be left as it is"


def test_log_refuses_steps_out_of_order_on_disk(tmp_path: Any) -> None:
    path = str(tmp_path / "lineage.log")
    with open(path, "wb") as f:
        f.write(frame(2, ("F",)) + frame(2, ("F",)))
    with pytest.raises(CorruptLineageLogError, match="step 2 does not follow step 2"):
        LineageLog(path)


def test_package_imports_nothing_of_nosync() -> None:
    code = "import sys, lineage; print(any(m == 'nosync' or m.startswith('nosync.') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert lineage.__all__
