"""lineage: the dependency graph of a nosync run and the plans computed from it.

Pure logic with its own persistence; it imports nothing of `nosync`. In nosync mode no worker
waits for a checkpoint: each process records, per step, what the step did (which frame of which
link it consumed, which source chunk it read, which buffer it flushed), and those lineage
entries travel with the frames it sends. Receivers hold them in a `Stash` until the producer's
durable point covers them. A failed process is restored at its durable point and re-executes
the steps the survivors' stashes describe, in the recorded order, so what it re-produces is
identical and no survivor rolls back; its consumers check re-produced frames by fingerprint.

- `safe_point`: the epoch every process has durably completed (sinks commit there);
- `Stash`, `merge_lineage`: the entries held for other processes, and the gap-free run of them
  a recovery can trust (two holders that disagree are an error, never a choice);
- `recovery_plan`: per failed process, where it restores, what it replays, which frames its
  upstreams resend and from which chan_seq its downstreams check fingerprints;
- `rewind_plan`: the downstream cone of an operator and the step each instance restarts at;
- `consistent_cut`: the newest snapshots of all processes that agree on every link (a rewind's start);
- `LineageLog`: a process's own entries on disk, checksummed, torn tail cut on open;
- `Step`: the kinds of lineage entries.

The package computes plans; the runtime executes them.
"""

from lineage.errors import CorruptLineageLogError, LineageError
from lineage.log import LineageLog
from lineage.plan import (
    EOS,
    DurablePoint,
    Entry,
    Lineage,
    RecoveryPlan,
    RewindPlan,
    Stash,
    Step,
    consistent_cut,
    merge_lineage,
    recovery_plan,
    rewind_plan,
    safe_point,
)

__all__ = [
    "EOS",
    "CorruptLineageLogError",
    "DurablePoint",
    "Entry",
    "Lineage",
    "LineageError",
    "LineageLog",
    "RecoveryPlan",
    "RewindPlan",
    "Stash",
    "Step",
    "consistent_cut",
    "merge_lineage",
    "recovery_plan",
    "rewind_plan",
    "safe_point",
]
