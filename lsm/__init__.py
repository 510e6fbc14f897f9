"""lsm: a log-structured, sequence-numbered, versioned state store.

Every fault-tolerance mode of nosync keeps operator state here; the package knows nothing of
dataflow. A store is written by batches, each tagged with a strictly increasing sequence number
(`append(seq, updates)`), and read at any seq inside its retention window (`get(key, as_of=s)`,
`scan(prefix, as_of=s)`): the state right after batch s. `rollback(s)` makes the store exactly
what it was after s, on every tier.

Writes never wait on disk. `append` packs the batch into the active memtable and returns; a
background persister moves frozen memtables down three tiers, each with its own durable point
(`durable(level)`):

- memory: memtables, frozen copy-on-write when full, on flush or on a snapshot;
- disk: a local log of checksummed records (one write + fsync per flush: durability at the
  speed of a sequential write), then LevelDB, where each version is an MVCC entry
  `key | inverted seq`, so an as-of read is one seek;
- remote: immutable Arrow IPC segments of the same records, written through `pyarrow.fs` (a
  local directory by default; any URI it accepts), from which an empty directory restores.

Compaction drops versions older than the retention horizon and writes base images so that no
tier grows without bound. On open, a torn log tail is cut back to the last intact record;
damage in the middle raises CorruptLogError with the file and offset. One process owns a
store directory (StoreLockedError for the next). FORMAT.md defines every byte written.
"""

from lsm.codec import TOMBSTONE
from lsm.errors import (
    CorruptLogError,
    FormatVersionError,
    KeyEncodingError,
    LsmError,
    PersistError,
    RetentionError,
    SeqOrderError,
    StoreClosedError,
    StoreLockedError,
)
from lsm.store import Snapshot, Store, StoreOptions

__all__ = [
    "TOMBSTONE",
    "CorruptLogError",
    "FormatVersionError",
    "KeyEncodingError",
    "LsmError",
    "PersistError",
    "RetentionError",
    "SeqOrderError",
    "Snapshot",
    "Store",
    "StoreClosedError",
    "StoreLockedError",
    "StoreOptions",
]
