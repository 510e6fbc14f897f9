"""Where a nosync worker keeps what it persists, and how tools read it back.

Each worker owns one `lsm` store, `nosync` in its local root (`<local root>/nosync`,
`nosync.places`: `<run dir>/state/w<i>/nosync` on an embedded Spark), and, when a source
cannot restart from a position, an input store beside it (`input`). The worker store holds these
states, every append at a new seq (a counter of the store, not the worker's step):

- `i` (the worker's operator number) for each keyed operator: its changed keys, one run per
  snapshot (a join: its increments, keyed (key, side, index));
- `META`, key 0: a snapshot's metadata (`snapshot_meta`): its step, frontiers and source
  positions, the frame counters per link, the lineage held for others, the sinks'
  pre-commits, the records in the exchange buffers;
- `OUT`, key d: the residue of the output log to worker d at a snapshot (the frames d's
  durable point did not cover yet), one blob per destination, so that a sender restored
  from that snapshot can still serve them: `{"zstd": blob, "n": size}`, the msgpack array
  of [chan_seq, frame] pairs compressed by zstd at level 1 (`pack_residue`; a store written
  before holds the array itself);
- `LINEAGE`, key 0: a lineage point (`lineage_point`): the step it was taken at, the lineage
  entries held that no earlier point persisted (this worker's own and the others' it holds),
  the sinks' pre-commits made there, and the worker's frontier there. Points are appended
  every few milliseconds and with every snapshot: a recovery replays the steps they name
  after its snapshot, so a worker's durable point is its last durable point, not its last
  snapshot.
"""

from __future__ import annotations

import os
from typing import Any

from lsm import RetentionError
from nosync.codec import pack, unpack
from nosync.state.stores import load_keyed

META = "meta"
OUT = "out"
LINEAGE = "lineage"


STORE = "nosync"
"""The name of a nosync worker's store in its local root."""
INPUT = "input"
"""The name of a nosync worker's input store in its local root (sources that cannot restart
from a position)."""


def store_path(state_dir: str, worker: int) -> str:
    """The directory of worker `worker`'s store in a tree of the run's local roots
    `state_dir/w<i>` (an embedded run's `<run dir>/state`, or a tool's copy of the stores)."""
    return os.path.join(state_dir, f"w{worker}", STORE)


def input_store_path(state_dir: str, worker: int) -> str:
    """The directory of worker `worker`'s input store in a tree of the run's local roots."""
    return os.path.join(state_dir, f"w{worker}", INPUT)


def iter_snapshots(store: Any) -> Any:
    """The metadata of each snapshot a worker's store still holds in full (its keyed state
    readable as of the snapshot's seq, `meta["seq"]`), newest first, without the lineage
    held for others."""
    try:
        versions = store.versions(META, 0, after=store.horizon - 1)
    except RetentionError:
        return
    for seq, raw in reversed(versions):
        if seq < store.horizon:
            return
        meta = unpack(raw)
        yield {**{k: v for k, v in meta.items() if k != "stash"}, "seq": seq}


def _zstd() -> Any:
    import pyarrow as pa  # lazy: pyarrow costs ~0.3 s to import (the Spark daemon loads it before its forks)

    return pa.Codec("zstd", compression_level=1)


def pack_residue(frames: list) -> dict:
    """The value under `OUT` of the frames [[chan_seq, frame], ...] to one destination:
    compressed, as frames of keyed records repeat their framing and small values (a residue of
    keyed_count's shrinks about six times)."""
    raw = pack(frames)
    return {"zstd": _zstd().compress(raw, asbytes=True), "n": len(raw)}


def unpack_residue(value: Any) -> list:
    """The [chan_seq, frame] pairs of a value under `OUT` (`pack_residue`'s, or the msgpack
    array a store written before holds)."""
    if isinstance(value, dict):
        value = _zstd().decompress(value["zstd"], decompressed_size=int(value["n"]), asbytes=True)
    return unpack(value)


def logged_frames(store: Any, dest: int, as_of: int) -> dict[int, bytes]:
    """chan_seq -> frame of the output log to worker `dest` that the snapshot at seq `as_of`
    holds (the frames `dest` had not durably consumed when it was taken)."""
    value = store.get(OUT, dest, as_of=as_of)
    return {} if value is None else {int(seq): frame for seq, frame in unpack_residue(value)}


def store_state(store: Any, i: int, op: Any, as_of: int | None = None) -> None:
    """Loads the keyed state of keyed operator `op` (the worker's operator number `i`) as it
    stood after seq `as_of` (None: the last), all of it at once."""
    load_keyed(op, store, i, as_of)
