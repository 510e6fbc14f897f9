"""A run's stores as an offline tool reads them: always from a copy, never from the run's own
files (opening a store writes to it: LevelDB recovers its log, a torn tail is cut).

Where the copy comes from depends on where the run kept its stores (`nosync.places`):

- an embedded run's workers kept them on this host, in their local roots (`<run dir>/state`,
  or `--local-dir`): the tree is copied, LevelDB's tables linked where the file system allows;
- a run on a cluster kept them on its workers' hosts, which a tool cannot read. With
  `--checkpoint-tier remote` every store uploads to its remote tier on the run's shared tier
  (`--remote`): each store is rebuilt from there into the copy (its base image and log
  segments, everything a snapshot or checkpoint counted on);
- otherwise the stores are out of a tool's reach (on the workers' disks, or in their memory
  with `--checkpoint-tier replicated`), and the tool refuses, saying how to run so that it
  can read them.
"""

from __future__ import annotations

import os
import re

import lsm
from lsm.files import copy_store
from nosync import storage
from nosync.errors import NosyncError
from nosync.places import SHARED_STORES, Places, legacy_places

_WORKER_DIR = re.compile(r"^w(\d+)$")


def run_places(run_dir: str, run: dict) -> Places:
    """The places of the run in `run_dir` (its run.json `run`). A run directory moved or
    copied since the run took what lay inside it along: its shared tier and local roots when
    they were the run directory's own."""
    here = os.path.abspath(run_dir)
    if "places" not in run:
        return legacy_places(here)
    p = Places.from_wire(run["places"])
    if p.run_dir == here:
        return p
    shared = here if p.shared == p.run_dir else p.shared
    local = os.path.join(here, "state") if p.local == os.path.join(p.run_dir, "state") else p.local
    return Places(here, shared, local, p.run_name)


def local_base(run_dir: str, run: dict) -> str | None:
    """The tree of the run's local roots (`w<i>/<store>`) when it lies on this host (an
    embedded run's), else None."""
    places = run_places(run_dir, run)
    if run.get("embedded", True) and places.local != "spark":
        return places.local
    return None


def is_store(path: str) -> bool:
    """Whether `path` is an `lsm` store's directory (a local root also holds an output log's
    spill file and its sinks' staging)."""
    return os.path.isfile(os.path.join(path, "MANIFEST"))


def local_stores(base: str) -> list[tuple[int, str, str]]:
    """(worker, store name, directory) of every store in the tree of local roots `base`."""
    out = []
    for wdir in sorted(os.listdir(base)) if os.path.isdir(base) else ():
        m = _WORKER_DIR.match(wdir)
        if not m:
            continue
        for name in sorted(os.listdir(os.path.join(base, wdir))):
            path = os.path.join(base, wdir, name)
            if is_store(path):
                out.append((int(m.group(1)), name, path))
    return out


def shared_stores(run_dir: str, run: dict) -> list[tuple[int, str, str]]:
    """(worker, store name, URI of its remote tier) of every store of the run on its shared tier."""
    places = run_places(run_dir, run)
    root = places.shared_path(SHARED_STORES)
    out = []
    for wdir in storage.listdir(root):
        m = _WORKER_DIR.match(wdir)
        if m:
            out += [
                (int(m.group(1)), name, storage.join(root, wdir, name))
                for name in storage.listdir(storage.join(root, wdir))
            ]
    return sorted(out)


def out_of_reach(run_dir: str, run: dict) -> str:
    """Why a tool on this host cannot read the stores of the run in `run_dir`."""
    tier = run.get("checkpoint_tier") or "disk"
    where = "in its workers' memory" if tier == "replicated" else "on its workers' hosts"
    return (
        f"the stores of {run_dir} are {where} (a run on a cluster with --checkpoint-tier {tier}), which a tool "
        f"cannot read: a tool reads a cluster run's stores from its shared tier, so run it with --remote URI "
        f"--checkpoint-tier remote"
    )


def copy_stores(run_dir: str, run: dict, dest: str) -> str | None:
    """A copy at `dest` (a tree `w<i>/<store>`) of every store of the run in `run_dir`, for a
    tool to open; None when the run kept none. Raises NosyncError when the stores are out of
    this host's reach (`out_of_reach`)."""
    base = local_base(run_dir, run)
    if base is not None:
        if not local_stores(base):
            return None
        os.makedirs(dest, exist_ok=True)
        for w, name, path in local_stores(base):
            copy_store(path, os.path.join(dest, f"w{w}", name))
        return dest
    if run.get("checkpoint_tier") != "remote":
        raise NosyncError(out_of_reach(run_dir, run))
    found = shared_stores(run_dir, run)
    if not found:
        return None
    for w, name, uri in found:
        # an empty directory opened with its remote tier is rebuilt from it
        lsm.Store(os.path.join(dest, f"w{w}", name), remote=uri, budget=0, uploads=False).close()
    return dest
