"""A store rebuilt from a copy held elsewhere: a base image and the log records after it.

A replica of a store (another process's memory, say) holds what `Store.image` made of it and
the records the persister reported logging since (`StoreOptions.on_logged`). `seed` writes
them into a directory that holds no store, as the store itself would have: the image's runs
on the disk tier with its applied marker and its horizon, its records and the later ones in
the local log. `Store(path)` then opens it like any other: it replays the records, and reads
whatever its remote tier holds beyond them.
"""

from __future__ import annotations

import os
import shutil
from typing import NamedTuple

from lsm import files
from lsm.disk import DiskTier
from lsm.errors import LsmError
from lsm.log import Log
from lsm.manifest import Manifest, read_manifest, write_manifest


class Image(NamedTuple):
    """A copy of a store (`Store.image`): the runs of its disk tier, as stored, up to seq
    `applied`, and the log records after it up to `seq`; reads as of `horizon` or later see
    what the store saw."""

    seq: int
    horizon: int
    rows: list[tuple[bytes, bytes]]
    """(encoded state name, run bytes) of each run of the disk tier."""
    records: tuple | list = ()
    """(seq, body) of the log records above `applied`, in seq order."""
    applied: int | None = None
    """The last seq the runs cover (None: `seq`)."""


def seed(
    path: str,
    base: Image | None,
    records: list[tuple[int, bytes]],
    remote: str | None = None,
    segment_bytes: int = 64 << 20,
) -> int:
    """Makes `path`, which must hold no store yet, a store holding `base` (its runs and its
    records) and the log `records` ((seq, body), in seq order) above it, a seq `base` holds
    already taken once; `remote` is its remote tier (default: `<path>/remote`). Returns the last seq it holds
    (-1: none). Raises LsmError when `path` holds a store already, StoreLockedError when a
    process holds its lock."""
    os.makedirs(path, exist_ok=True)
    fd = files.lock_directory(path)
    try:
        if read_manifest(path) is not None:
            raise LsmError(f"{path} holds a store already: a store is seeded only into an empty directory")
        # no manifest: what is there is a seed cut short (a store writes its manifest before
        # anything else), and goes
        for part in ("disk", "log"):
            shutil.rmtree(os.path.join(path, part), ignore_errors=True)
        last = -1
        disk = DiskTier(os.path.join(path, "disk"))
        try:
            if base is not None:
                last = base.seq if base.applied is None else base.applied
                disk.write(base.rows, applied=last, sync=True)
                disk.set_horizon(base.horizon)
        finally:
            disk.close(settle=True)
        # the image's own records, then those after it: each seq once, in order
        mine = base.records if base is not None else ()
        after = sorted({seq: body for seq, body in [*mine, *records] if seq > last}.items())
        if after:
            log = Log(os.path.join(path, "log"), segment_bytes)
            log.open(after=last)
            try:
                log.append(after)
            finally:
                log.close()
            last = after[-1][0]
        # the manifest last: a directory without one is no store, and is seeded again
        write_manifest(path, Manifest.new(remote or ""))
        return last
    finally:
        os.close(fd)
