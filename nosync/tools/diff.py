"""Differences between two committed outputs of a sink, per key and per epoch.

A Files sink's output is a multiset of records per epoch (the epoch its part file names): a
record committed n times in A and m times in B differs by |n - m| copies. A LevelDB sink's
output is a map: a key differs when its value does, or when one side lacks it. The key of a
record is `key` of a dict record (given with `key=`), element 0 of a list or tuple, else the
record itself.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Any

from nosync import storage
from nosync.api import sinks
from nosync.errors import NosyncError

EPOCH_EOS = 1 << 62


def _canon(x: Any) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"), default=repr)


def _kind(directory: str) -> str:
    """ "files" or "map": what the committed output in `directory` (a path, or a URI of a Files
    sink's) holds."""
    listed = storage.listdir(directory)
    shown = storage.redact(directory)
    if not listed and not storage.exists(directory):
        raise NosyncError(f"{shown}: no such directory (a committed output of a Files or LevelDB sink)")
    names = [n for n in listed if n.startswith("part-")]
    if storage.is_local(directory) and any(os.path.isdir(os.path.join(directory, n)) for n in names):
        return "map"
    if any(n.endswith((".jsonl", ".parquet")) for n in names) or "_staging" in listed:
        return "files"
    raise NosyncError(f"{shown}: no committed part files here (part-*.jsonl, part-*.parquet or part-N/ LevelDB)")


def _key_of(record: Any, key: str | None) -> Any:
    if key is not None:
        if not isinstance(record, dict) or key not in record:
            raise NosyncError(f"--key {key}: a committed record has no field {key!r}: {_canon(record)[:200]}")
        return record[key]
    if isinstance(record, list | tuple) and record:
        return record[0]
    return record


def diff_outputs(a: str, b: str, out_path: str, key: str | None = None, top: int = 10) -> dict:
    """Compares the committed outputs in directories `a` and `b`; writes every difference to
    `out_path` (JSON lines) and returns a summary."""
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        raise NosyncError(f"{a} holds a {ka} output and {b} a {kb} output: they cannot be compared")
    diffs: list[dict] = []
    if ka == "files":
        count: dict[tuple[int, str], list] = collections.defaultdict(lambda: [0, 0, None])
        for side, d in ((0, a), (1, b)):
            for epoch, r in sinks.Files(d).read_committed_epochs():
                c = count[(epoch, _canon(r))]
                c[side] += 1
                c[2] = r
        records = [0, 0]
        whole: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for (epoch, text), (na, nb, r) in sorted(count.items()):
            records[0] += na
            records[1] += nb
            w = whole[text]
            w[0] += na
            w[1] += nb
            if na != nb:
                diffs.append({"epoch": epoch, "key": _key_of(r, key), "record": r, "in_a": na, "in_b": nb})
        summary: dict[str, Any] = {
            "kind": "multiset",
            "records_a": records[0],
            "records_b": records[1],
            # the same records in other epochs (a mode that does not align epochs tags output
            # with the newest epoch an instance has seen) differ per epoch, not as wholes
            "whole_only_in_a": sum(max(0, na - nb) for na, nb in whole.values()),
            "whole_only_in_b": sum(max(0, nb - na) for na, nb in whole.values()),
        }
    else:
        ma, mb = sinks.LevelDB(a).read_committed(), sinks.LevelDB(b).read_committed()
        for k in sorted(set(ma) | set(mb), key=_canon):
            va, vb = ma.get(k, None), mb.get(k, None)
            if k not in ma or k not in mb or _canon(va) != _canon(vb):
                diffs.append({"epoch": None, "key": k, "a": va if k in ma else None, "b": vb if k in mb else None})
        summary = {"kind": "map", "records_a": len(ma), "records_b": len(mb)}
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "w", encoding="utf-8") as f:
        for d in diffs:
            f.write(_canon(d) + "\n")
    per_epoch = collections.Counter(d["epoch"] for d in diffs if d["epoch"] is not None)
    per_key = collections.Counter(_canon(d["key"]) for d in diffs)
    summary.update(
        {
            "differences": len(diffs),
            "only_in_a": sum(max(0, d.get("in_a", 0) - d.get("in_b", 0)) for d in diffs),
            "only_in_b": sum(max(0, d.get("in_b", 0) - d.get("in_a", 0)) for d in diffs),
            "epochs": {("EOS" if e == EPOCH_EOS else str(e)): n for e, n in sorted(per_epoch.items())},
            "first_epoch": min(per_epoch) if per_epoch else None,
            "keys": len(per_key),
            "top_keys": [[json.loads(k), n] for k, n in per_key.most_common(top)],
            "file": out_path,
        }
    )
    return summary
