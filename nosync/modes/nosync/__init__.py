"""Mode `nosync`: no barrier, no alignment; a failed worker recovers alone from its own log.

Each worker numbers its steps and logs them as lineage entries that travel with its frames,
keeps what it sent in an output log in memory, and persists in the background, alone: lineage
points every few milliseconds (the steps taken and the sinks' pre-commits; a worker's durable
point, which its own sinks commit at, moves with them) and snapshots of its state
every `persist_ms` or, as resources permit, later (its changed keys as columnar runs, the output
log's residue, its metadata). No worker ever waits for another. A lost worker restores its last
snapshot, loads its state in bulk, and re-executes the steps after it in their logged order,
taking the frames the survivors resend, so it re-produces exactly what it had produced and no
survivor rolls back.

The modules, one concern each:

- `outlog`: the output log in memory, its residue, its spill;
- `hooks`: the worker half in steady state (steps, frames, lineage);
- `snapshots`: lineage points and snapshots, the persistence budget, durability;
- `recovery`: restore, bulk load, replay;
- `steps`: the re-execution of logged steps (a recovery's and a span job's);
- `span`: a long recovery span handed to a Spark batch job (`--replay-threshold-records`);
- `driver`: the coordinator's half (durable points, the safe point, recovery orchestration).

The worker's store and what each of its states holds (`nosync.state.layout`), and the input
log of sources that cannot restart from a position (`nosync.state.inputlog`), are read by the
offline tools too, so they live below the modes.

Left out: the rollback cascade for a fingerprint mismatch (a user function that is not
deterministic given its input order fails the run, naming the link and chan_seq).
"""

from nosync.modes.nosync.driver import NosyncMode
from nosync.modes.nosync.hooks import HEADER_LINEAGE, NosyncHooks
from nosync.state.inputlog import InputLog
from nosync.state.layout import (
    LINEAGE,
    META,
    OUT,
    input_store_path,
    iter_snapshots,
    logged_frames,
    store_path,
    store_state,
)

__all__ = [
    "HEADER_LINEAGE",
    "LINEAGE",
    "META",
    "OUT",
    "InputLog",
    "NosyncHooks",
    "NosyncMode",
    "input_store_path",
    "iter_snapshots",
    "logged_frames",
    "store_path",
    "store_state",
]
