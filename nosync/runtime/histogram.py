"""A latency histogram of fixed size: log-linear buckets, as in HdrHistogram.

A run may last days, so a sink cannot keep one latency per committed batch: it records into a
`Histogram`, whose memory is the same after ten records or ten billion. Values are seconds,
counted in whole microseconds. Below 2·SUB microseconds every microsecond has a bucket of its
own; above, each power of two [2^e, 2^(e+1)) is cut into SUB equal buckets, so a bucket is at
most 1/SUB of its lower bound wide. A quantile is the midpoint of the bucket holding it:

    Invariant: |quantile(q) - exact| <= max(exact / (2·SUB), 0.5 µs) for values up to
    MAX_S (with SUB = 128: 0.39%, or half a microsecond); the count, min, max and mean are exact.

Values past MAX_S (about 51 days) count in the last bucket; negative ones (clocks that
disagree) in the first. Histograms merge by adding their buckets, so the workers' histograms
make the run's, and the merge of two is the histogram of all their records. The wire form
(`to_wire`, `from_wire`) carries only the nonzero buckets, as msgpack-friendly lists of ints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

SUB_BITS = 7
SUB = 1 << SUB_BITS
"""Buckets per power of two above 2·SUB µs: the relative width of a bucket is at most 1/SUB."""
SHIFTS = 34
"""Powers of two above 2·SUB µs that have buckets: up to 2^(SUB_BITS + 1 + SHIFTS) µs."""
BUCKETS = (SHIFTS << SUB_BITS) + 2 * SUB
"""How many buckets every histogram has, whatever it recorded."""
UNIT_S = 1e-6
MAX_S = (1 << (SUB_BITS + 1 + SHIFTS)) * UNIT_S
"""Values up to this (about 51 days) have buckets; larger ones count in the last."""


def bucket_of(value_s: float) -> int:
    """The index of the bucket that counts `value_s` (seconds)."""
    us = int(value_s * 1e6) if value_s > 0 else 0
    if us < 2 * SUB:
        return us
    shift = us.bit_length() - 1 - SUB_BITS
    if shift > SHIFTS:
        return BUCKETS - 1
    return (shift << SUB_BITS) + (us >> shift)


def bucket_bounds(index: int) -> tuple[float, float]:
    """The values (seconds) bucket `index` counts: [low, high)."""
    if index < 2 * SUB:
        return index * UNIT_S, (index + 1) * UNIT_S
    shift = (index >> SUB_BITS) - 1
    low = (index - (shift << SUB_BITS)) << shift
    return low * UNIT_S, (low + (1 << shift)) * UNIT_S


class Histogram:
    """Counts of values (seconds) in BUCKETS log-linear buckets, with their exact count, sum,
    min and max. Fixed memory: one list of BUCKETS ints.

    >>> h = Histogram()
    >>> h.record(0.010, 99)
    >>> h.record(2.0)
    >>> h.count, round(h.quantile(0.5), 4), h.quantile(1.0), h.max
    (100, 0.01, 2.0, 2.0)
    """

    __slots__ = ("counts", "count", "total_s", "min", "max")

    def __init__(self) -> None:
        self.counts = [0] * BUCKETS
        self.count = 0
        self.total_s = 0.0
        """The sum of every value recorded (times its count): the mean is exact."""
        self.min: float | None = None
        self.max: float | None = None

    def record(self, value_s: float, count: int = 1) -> None:
        """Counts `value_s` `count` times. REQUIRES: count >= 0."""
        if count <= 0:
            return
        self.counts[bucket_of(value_s)] += count
        self.count += count
        self.total_s += value_s * count
        if self.min is None or value_s < self.min:
            self.min = value_s
        if self.max is None or value_s > self.max:
            self.max = value_s

    def merge(self, other: Histogram) -> None:
        """Adds `other`'s records to this one's (as if each had been recorded here)."""
        if not other.count:
            return
        counts = self.counts
        for i, n in enumerate(other.counts):
            if n:
                counts[i] += n
        self.count += other.count
        self.total_s += other.total_s
        assert other.min is not None and other.max is not None  # Invariant: count > 0
        self.min = other.min if self.min is None else min(self.min, other.min)
        self.max = other.max if self.max is None else max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        """The q-quantile (0 <= q <= 1): the least recorded value v such that at least q of the
        count is <= v, to within a bucket's half width (see the module's invariant), and never
        outside [min, max]; q = 0 and q = 1 are the exact min and max. None when nothing was
        recorded."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"a quantile is between 0 and 1, not {q}")
        if not self.count:
            return None
        assert self.min is not None and self.max is not None
        if q >= 1.0:
            return self.max
        if q <= 0.0:
            return self.min
        target = q * self.count
        acc = 0
        for i, n in enumerate(self.counts):
            if not n:
                continue
            acc += n
            if acc >= target:
                low, high = bucket_bounds(i)
                return min(max((low + high) / 2, self.min), self.max)
        return self.max

    @property
    def mean(self) -> float | None:
        """The exact mean of the values recorded; None when nothing was."""
        return self.total_s / self.count if self.count else None

    def nonzero(self) -> int:
        """How many buckets count something."""
        return sum(1 for n in self.counts if n)

    def to_wire(self) -> dict[str, Any]:
        """A msgpack-friendly map: the layout (`sub_bits`, `shifts`), the nonzero buckets as two
        lists of ints (`index`, `count`, ascending index), and the exact count, sum, min, max."""
        index = [i for i, n in enumerate(self.counts) if n]
        return {
            "sub_bits": SUB_BITS,
            "shifts": SHIFTS,
            "index": index,
            "count": [self.counts[i] for i in index],
            "n": self.count,
            "sum": self.total_s,
            "min": self.min,
            "max": self.max,
        }

    @classmethod
    def from_wire(cls, wire: dict[str, Any]) -> Histogram:
        """The histogram of a `to_wire` map (lists may arrive as tuples). Raises ValueError for
        another bucket layout or counts that do not add up."""
        if wire.get("sub_bits") != SUB_BITS or wire.get("shifts") != SHIFTS:
            raise ValueError(
                f"a histogram of layout sub_bits={wire.get('sub_bits')}, shifts={wire.get('shifts')}; "
                f"this build's is sub_bits={SUB_BITS}, shifts={SHIFTS}"
            )
        index: Sequence[int] = wire["index"]
        count: Sequence[int] = wire["count"]
        if len(index) != len(count) or sum(count) != wire["n"] or any(n <= 0 for n in count):
            raise ValueError("a histogram whose bucket counts do not add up to its count")
        h = cls()
        for i, n in zip(index, count, strict=True):
            if not 0 <= i < BUCKETS:
                raise ValueError(f"a histogram bucket {i} outside 0..{BUCKETS - 1}")
            h.counts[i] += n
        h.count = int(wire["n"])
        h.total_s = float(wire["sum"])
        h.min = None if wire["min"] is None else float(wire["min"])
        h.max = None if wire["max"] is None else float(wire["max"])
        if h.count and (h.min is None or h.max is None or not math.isfinite(h.total_s)):
            raise ValueError("a histogram with a count but no min, max or sum")
        return h


__all__ = ["BUCKETS", "MAX_S", "SUB", "Histogram", "bucket_bounds", "bucket_of"]
