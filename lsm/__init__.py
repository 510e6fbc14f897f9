"""lsm: a log-structured, sequence-numbered, versioned state store.

Every fault-tolerance mode of nosync keeps operator state here; the package knows nothing of
dataflow. A store holds named states. Each `append(seq, runs)`, at a strictly increasing seq,
gives some states a **run**: their changed keys and values (deletions marked) as columns, each
encoded by one msgpack call (an append's run is neither hashed nor sorted: a merge adds the
sorted key-hash column); no Python runs per key on the caller's thread or in the background.
Reads name a seq inside the retention window: `get(state, key, as_of=s)` looks in the state's
runs newest first (an append's run as a dict decoded once; a merged run by binary search of its
hashes, whose range skips runs that cannot hold the key, then one block of 64 keys and values
decoded); `load(state, as_of=s)` applies the
runs in order, each by `dict.update` over its decoded columns. `rollback(s)` makes the store
exactly what it was after s, on every tier.

Writes never wait on disk. A background persister encodes the runs, writes them to a local log
of checksummed records (one write + fsync for everything appended since the last, so
`durable("disk")` moves at the speed of a sequential write), then puts each run into LevelDB
as one entry, and with uploads copies the log to the remote tier (Arrow IPC files through
`pyarrow.fs`), from which an empty directory restores. A compactor merges a state's small runs
into bigger ones in the background, at most a budgeted share of a core (the levels), keeping
every version a read inside the retention window can see.

On open, a torn log tail is cut back to the last intact record; damage in the middle raises
CorruptLogError with the file and offset, a damaged run with the store, state and seq. One
process owns a store directory (StoreLockedError for the next). FORMAT.md defines every byte
written, and its version (4).
"""

from lsm.codec import TOMBSTONE
from lsm.errors import (
    CorruptLogError,
    FormatVersionError,
    KeyEncodingError,
    LookupTooDearError,
    LsmError,
    PersistError,
    RetentionError,
    SeqOrderError,
    StoreClosedError,
    StoreLockedError,
    ValueEncodingError,
)
from lsm.seed import Image, seed
from lsm.store import Snapshot, Store, StoreOptions, Updates

__all__ = [
    "TOMBSTONE",
    "CorruptLogError",
    "FormatVersionError",
    "Image",
    "KeyEncodingError",
    "LookupTooDearError",
    "LsmError",
    "PersistError",
    "RetentionError",
    "SeqOrderError",
    "Snapshot",
    "Store",
    "StoreClosedError",
    "StoreLockedError",
    "StoreOptions",
    "Updates",
    "ValueEncodingError",
    "seed",
]
