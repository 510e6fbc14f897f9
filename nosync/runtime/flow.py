"""Flow control between workers: how far a worker's sources may read ahead of its peers.

A worker that reads faster than a peer only stages output that no sink can commit before the
peer's epochs, so its sources read at most MAX_EPOCHS_AHEAD epochs past the least epoch its
peers have closed on their exchange channels to it, while every peer is up. While a peer is
away (a mode that recovers a worker alone: it restores and replays), the others read on; the
gap that leaves is not closed by stopping them once the peer is back, which would idle their
cores for as long as the peer was away, but gradually (CATCH_UP_SHARE)."""

from __future__ import annotations

from collections.abc import Callable

MAX_EPOCHS_AHEAD = 6
"""How many epochs a worker's sources may read past the least epoch its peers have closed on
their exchange channels to it, while every peer is up: without a bound, the gap between
workers (and the latency of committed output) grows for as long as the run lasts. Nothing
closes a gap short of the bound (the workers read at the same pace), so a worker held up for a
while (a snapshot, 45 to 60 ms under nosync) leaves one that lasts: the latency of committed
output sits near the bound. At 16 epochs (about 300 ms at keyed_count's pace on two cores)
nosync's p99 was 380 to 545 ms and none's 76 to 294; at 6, 119 to 259 and 77 to 124, with no
change in records/s beyond the rounds' spread (docs/performance.md). 6 epochs still hold
more than such a pause, so that one worker's pause does not stop the other."""
CATCH_UP_SHARE = 0.2
"""While the gap a recovered peer left closes, by how many epochs it must shrink for each
epoch this worker's sources read: this worker reads at about 1 / (1 + share) of its peer's
pace (83%) instead of stopping, and the gap closes in about 1 / share times the time it took
to open."""


class FlowBound:
    """Whether a worker's sources are too far ahead of its peers to read now (`holds`)."""

    def __init__(self) -> None:
        self.catch_up: tuple[int, int] | None = None
        """(the sources' epoch, the gap in epochs) when a peer came back from being away with
        this worker ahead by more than MAX_EPOCHS_AHEAD; None when no gap is closing."""
        self._peer_was_away = False

    def holds(self, ahead: int, low: int, peers_up: Callable[[], bool]) -> bool:
        """Whether sources at epoch `ahead` wait, the peers having closed epoch `low` on their
        exchange channels to this worker; `peers_up()` (asked only when ahead) says whether
        every peer is up and running with this worker."""
        gap = ahead - low
        if gap <= MAX_EPOCHS_AHEAD:
            self.catch_up = None
            return False
        if not peers_up():
            self._peer_was_away = True
            return False
        if self._peer_was_away:
            self._peer_was_away = False
            self.catch_up = (ahead, gap)
        if self.catch_up is None:
            return True
        start, gap0 = self.catch_up
        allowed = gap0 - CATCH_UP_SHARE * (ahead - start)
        if allowed <= MAX_EPOCHS_AHEAD:
            self.catch_up = None
            return True
        return gap > allowed
