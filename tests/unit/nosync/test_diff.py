"""`nosync diff` over outputs committed through the real sink parts."""

from __future__ import annotations

import json

from click.testing import CliRunner

from cli.main import main
from nosync.api import sinks


def commit_files(directory, epochs: dict[int, list], workers: int = 2) -> None:
    """Commits records epoch by epoch, spread over `workers` parts, as workers do."""
    parts = [sinks.Files(str(directory)).open_part(w, "run") for w in range(workers)]
    for epoch, records in sorted(epochs.items()):
        for i, r in enumerate(records):
            parts[i % workers].write(epoch, [r])
        for p in parts:
            p.commit(epoch)
    for p in parts:
        p.close()


def test_the_same_output_differs_nowhere(tmp_path):
    epochs = {0: [["a", 1], ["b", 1]], 1: [["a", 2]]}
    commit_files(tmp_path / "a", epochs)
    commit_files(tmp_path / "b", epochs, workers=3)
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "d")])
    assert r.exit_code == 0, r.output
    assert "the same" in r.output
    assert (tmp_path / "d").read_text() == ""


def test_differences_per_key_and_epoch(tmp_path):
    commit_files(tmp_path / "a", {0: [["a", 1], ["b", 1]], 1: [["a", 2], ["b", 2]], 2: [["a", 3]]})
    # from epoch 1 on, key b counts differently, and a record of key c appears twice
    commit_files(tmp_path / "b", {0: [["a", 1], ["b", 1]], 1: [["a", 2], ["b", 20]], 2: [["a", 3], ["c", 1], ["c", 1]]})
    out = tmp_path / "diff.jsonl"
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--json"])
    assert r.exit_code == 1, r.output
    s = json.loads(r.output)
    assert (s["records_a"], s["records_b"]) == (5, 7)
    assert s["first_epoch"] == 1
    assert s["epochs"] == {"1": 2, "2": 1}
    assert (s["only_in_a"], s["only_in_b"]) == (1, 3)
    assert (s["whole_only_in_a"], s["whole_only_in_b"]) == (1, 3)
    assert sorted(k for k, _ in s["top_keys"]) == ["b", "c"]
    rows = sorted(
        (d["epoch"], d["record"], d["in_a"], d["in_b"]) for d in map(json.loads, out.read_text().splitlines())
    )
    assert rows == [(1, ["b", 2], 1, 0), (1, ["b", 20], 0, 1), (2, ["c", 1], 0, 2)]


def test_the_same_records_in_other_epochs_differ_per_epoch_not_as_wholes(tmp_path):
    # B holds every record of A, but ["b", 2] one epoch later and ["a", 3] one earlier
    commit_files(tmp_path / "a", {0: [["a", 1], ["b", 1]], 1: [["a", 2], ["b", 2]], 2: [["a", 3]]})
    commit_files(tmp_path / "b", {0: [["a", 1], ["b", 1]], 1: [["a", 2], ["a", 3]], 2: [["b", 2]]})
    out = tmp_path / "diff.jsonl"
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out), "--json"])
    assert r.exit_code == 1, r.output
    s = json.loads(r.output)
    assert (s["differences"], s["only_in_a"], s["only_in_b"]) == (4, 2, 2)
    assert (s["whole_only_in_a"], s["whole_only_in_b"]) == (0, 0)
    text = CliRunner().invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]).output
    assert "as wholes (epochs aside): the same records" in text


def test_dict_records_by_a_key_field(tmp_path):
    commit_files(tmp_path / "a", {0: [{"id": 1, "n": 5}, {"id": 2, "n": 6}]})
    commit_files(tmp_path / "b", {0: [{"id": 1, "n": 5}, {"id": 2, "n": 7}]})
    r = CliRunner().invoke(
        main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--key", "id", "--out", str(tmp_path / "d"), "--json"]
    )
    assert r.exit_code == 1, r.output
    assert json.loads(r.output)["top_keys"] == [[2, 2]]
    bad = CliRunner().invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--key", "nope"])
    assert bad.exit_code == 2
    assert "--key nope" in bad.output and "no field 'nope'" in bad.output


def test_upsert_outputs_compare_as_maps(tmp_path):
    for d, pairs in (("a", [("x", 1), ("y", 2)]), ("b", [("x", 1), ("y", 3), ("z", 4)])):
        part = sinks.LevelDB(str(tmp_path / d)).open_part(0, "run")
        part.write(0, [list(p) for p in pairs])
        part.commit(0)
        part.close()
    r = CliRunner().invoke(
        main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "d"), "--json"]
    )
    assert r.exit_code == 1, r.output
    s = json.loads(r.output)
    assert s["kind"] == "map" and s["differences"] == 2
    rows = [json.loads(line) for line in (tmp_path / "d").read_text().splitlines()]
    assert [(d["key"], d["a"], d["b"]) for d in rows] == [("y", 2, 3), ("z", None, 4)]


def test_what_cannot_be_compared_is_named(tmp_path):
    commit_files(tmp_path / "a", {0: [["a", 1]]})
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "missing")])
    assert r.exit_code == 2
    assert "missing: no such directory" in r.output
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "empty")])
    assert r.exit_code == 2 and "no committed part files" in r.output
