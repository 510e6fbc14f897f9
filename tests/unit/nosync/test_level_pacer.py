"""Which persistence levels fall behind when persistence takes more than its budget, and in
which order they catch up (`LevelPacer`). Shares are handed in as numbers: the pacer is pure
logic; the store's side (`Store.pace`) is tested with a real store in tests/unit/lsm."""

from __future__ import annotations

import pytest

from nosync.modes.nosync.levels import LevelPacer

BUDGET = 0.05
OVER, ROOM, WITHIN = 0.08, 0.01, 0.04
"""A share over the budget, one under half of it, and one between the two."""


def test_the_slowest_level_falls_behind_first_and_the_last_to_fall_catches_up_first():
    p = LevelPacer(["disk", "replicated", "remote"], commit="memory", budget=BUDGET)
    assert p.gaps == {"remote": 0.0, "disk": 0.0, "replicated": 0.0}
    seen = [p.update(OVER) for _ in range(9)]
    # remote: 1, 2, 4, 8, 16, 32, 60 s; then the disk tier's indexing: 0.5, 1 s
    assert seen == ["remote"] * 7 + ["disk"] * 2
    assert p.gaps == {"remote": 60.0, "disk": 1.0, "replicated": 0.0}
    assert p.update(WITHIN) is None and p.gaps["disk"] == 1.0
    # room: the disk tier catches up (1 -> 0.5 -> 0) before the remote tier starts to
    assert [p.update(ROOM) for _ in range(3)] == ["disk", "disk", "remote"]
    assert p.gaps == {"remote": 30.0, "disk": 0.0, "replicated": 0.0}
    assert p.peak == {"remote": 60.0, "disk": 1.0, "replicated": 0.0}


def test_the_replicated_level_falls_behind_only_once_the_others_are_at_their_longest():
    p = LevelPacer(["disk", "replicated"], commit="remote", budget=BUDGET)
    while p.update(OVER) == "disk":
        pass
    assert p.gaps == {"disk": 8.0, "replicated": 0.05}
    for _ in range(10):
        p.update(OVER)
    assert p.gaps == {"disk": 8.0, "replicated": 1.0}
    assert p.update(OVER) is None  # every level at its longest gap


@pytest.mark.parametrize(
    ("levels", "commit", "paced"),
    [
        (["disk"], "disk", {}),
        (["disk", "replicated"], "replicated", {"disk": 0.0}),
        (["disk", "replicated"], "disk", {"replicated": 0.0}),
        (["disk", "replicated", "remote"], "remote", {"disk": 0.0, "replicated": 0.0}),
    ],
)
def test_the_level_a_snapshot_waits_for_never_falls_behind(levels, commit, paced):
    p = LevelPacer(levels, commit=commit, budget=BUDGET)
    assert p.gaps == paced
    for _ in range(30):
        p.update(OVER)
    assert commit not in p.gaps
    if not paced:
        assert p.update(OVER) is None
