"""The flow bound between workers (`nosync.runtime.flow`): at most MAX_EPOCHS_AHEAD epochs
ahead of the peers while they are up; unbounded while one is away; the gap an away peer left
closed gradually once it is back, the worker reading on more slowly rather than stopping.
Driven step by step: a peer closing one epoch a step, the worker reading one whenever the
bound lets it."""

from __future__ import annotations

from nosync.runtime.flow import CATCH_UP_SHARE, MAX_EPOCHS_AHEAD, FlowBound


def test_with_every_peer_up_the_sources_wait_past_the_bound():
    bound = FlowBound()
    assert not bound.holds(100 + MAX_EPOCHS_AHEAD, 100, lambda: True)
    assert bound.holds(101 + MAX_EPOCHS_AHEAD, 100, lambda: True)


def test_the_peers_are_asked_only_when_ahead():
    asked = []
    FlowBound().holds(100 + MAX_EPOCHS_AHEAD, 100, lambda: asked.append(1) or True)
    assert asked == []


def test_while_a_peer_is_away_the_sources_read_on_however_far_ahead():
    bound = FlowBound()
    assert not bound.holds(10_000, 100, lambda: False)


def catch_up(gap0: int, steps: int) -> tuple[list[int], list[bool]]:
    """A worker `gap0` epochs ahead when its peer comes back; each step the peer closes one
    epoch, and the worker reads one unless the bound holds. Returns the gap and whether the
    bound held, step by step."""
    bound = FlowBound()
    low, ahead = 0, gap0
    assert not bound.holds(ahead, low, lambda: False)  # the peer is away
    gaps, held = [], []
    for _ in range(steps):
        h = bound.holds(ahead, low, lambda: True)
        held.append(h)
        if not h:
            ahead += 1
        low += 1
        gaps.append(ahead - low)
    return gaps, held


def test_a_gap_left_by_a_peer_that_was_away_closes_without_stopping_the_worker():
    gap0 = 200
    gaps, held = catch_up(gap0, 3000)
    # the worker is not stopped until its peer has caught up: it reads at about 1 / (1 + share)
    # of the peer's pace all along
    closing = next(i for i, g in enumerate(gaps) if g <= MAX_EPOCHS_AHEAD)
    read = closing + 1 - sum(held[: closing + 1])
    pace = read / (closing + 1)
    assert abs(pace - 1 / (1 + CATCH_UP_SHARE)) < 0.02, pace
    longest_stop = max(len(run) for run in "".join("x" if h else " " for h in held[:closing]).split(" "))
    assert longest_stop <= 2
    # the gap shrinks throughout, and it closes in about 1 / share times what it was, in epochs
    assert all(b <= a for a, b in zip(gaps, gaps[1:closing], strict=False))
    expected = (gap0 - MAX_EPOCHS_AHEAD) * (1 + CATCH_UP_SHARE) / CATCH_UP_SHARE
    assert 0.9 * expected <= closing <= 1.1 * expected, (closing, expected)
    # and once it has, the bound is the strict one again
    assert max(gaps[closing:]) <= MAX_EPOCHS_AHEAD + 1


def test_without_a_peer_away_a_gap_is_not_let_close_slowly():
    """A worker that is ahead because a peer is slow (every peer up all along) is held at the
    bound at once, as before."""
    bound = FlowBound()
    assert bound.holds(MAX_EPOCHS_AHEAD + 50, 0, lambda: True)
    assert bound.catch_up is None
