"""How `inspect` reads a run's stores: a store a live process holds is reported in use, and
one that is free is read from a copy, so that the run directory is left as it was."""

from __future__ import annotations

import json
import os

import lsm
from nosync.modes.abs import STATE
from nosync.tools.runinfo import _in_use, inspect_run


def files_of(root) -> dict:  # noqa: ANN001
    return {
        os.path.join(d, n): (os.stat(os.path.join(d, n)).st_size, os.stat(os.path.join(d, n)).st_mtime_ns)
        for d, _, names in os.walk(root)
        for n in names
    }


def make_run(tmp_path) -> str:  # noqa: ANN001
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"pipeline": "p", "mode": "none", "workers": 2}))
    for w in (0, 1):
        s = lsm.Store(str(run_dir / "state" / f"w{w}" / "abs"))
        s.append(1, {STATE: {"a": w}})
        s.append(2, {STATE: {"b": w}})
        s.close()
    return str(run_dir)


def test_a_store_held_by_a_process_is_in_use(tmp_path) -> None:  # noqa: ANN001
    path = str(tmp_path / "store")
    assert not _in_use(path), "no store there yet"
    s = lsm.Store(path)
    try:
        assert _in_use(path)
    finally:
        s.close()
    assert not _in_use(path)


def test_inspect_reads_stores_from_copies_and_reports_held_ones(tmp_path) -> None:  # noqa: ANN001
    run_dir = make_run(tmp_path)
    before = files_of(run_dir)
    info = inspect_run(run_dir)
    assert [(s["worker"], s["last_seq"], s["disk"]) for s in info["stores"]] == [(0, 2, 2), (1, 2, 2)]
    assert files_of(run_dir) == before, "inspect changed the run directory"
    held = lsm.Store(os.path.join(run_dir, "state", "w1", "abs"))
    try:
        info = inspect_run(run_dir)
    finally:
        held.close()
    assert info["stores"][0]["last_seq"] == 2 and not info["stores"][0].get("in_use")
    assert info["stores"][1].get("in_use") is True and "last_seq" not in info["stores"][1]
