"""The cyclic collector and state that lives as long as a generation.

A worker freezes what its generation was set up with (`Worker._loop`): the collector's full
passes then walk only what was made since. State restored in bulk - a checkpoint loaded,
a snapshot's runs applied - is millions of objects made at once, and the collector's rule for
a full pass (a quarter more objects promoted than the last pass left) then fires again and
again as it grows, each pass walking all of it: loading 5M keys with 100-byte values took
13.9 s with the collector on and 5.4 s with it off (a worker's store at 10^7 keys over 2
workers, 49 full passes). What is restored lives as long as the generation, so it is frozen
as it is made.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def build_long_lived() -> Iterator[None]:
    """The collector off while state that lives as long as the generation (or the task) is built
    in one go; everything alive frozen at the end (out of its passes; `thaw` gives it back),
    then the collector as it was. Cycles made meanwhile, on any thread, are frozen too."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()


def freeze_made() -> None:
    """Freezes what was made since the last freeze: what a generation was set up with, as its
    loop starts, and state built a part at a time between records (a restore's load in the
    worker's spare time), after each part. Cyclic garbage alive then is frozen with it, and
    stays until the generation ends (`thaw`)."""
    gc.freeze()


def thaw() -> None:
    """Everything frozen back in the collector's passes: at the end of a generation or of a
    task, what it held may be garbage now, cycles included (a reused Python worker runs other
    tasks after it)."""
    gc.unfreeze()
