"""Checkpoint metadata files: written whole, read back equal, refused when damaged.

The expected bytes of a file are built here from the layout in nosync/state/checkpoints.py's
docstring (magic "NSCK" | format u8 | xxh64 of the body u64 LE | msgpack body), not by the code
under test; so are damaged files.
"""

from __future__ import annotations

import os
import struct

import msgpack
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nosync.state import checkpoints
from nosync.state.checkpoints import CheckpointError

SETTINGS = settings(max_examples=60, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])

HEAD = 4 + 1 + 8


def as_read(v: object) -> object:
    """What msgpack gives back for `v` when arrays are read as tuples (as checkpoints.read does)."""
    if isinstance(v, list | tuple):
        return tuple(as_read(x) for x in v)
    if isinstance(v, dict):
        return {as_read(k): as_read(x) for k, x in v.items()}
    return v


def file_bytes(body_bytes: bytes, magic: bytes = b"NSCK", fmt: int = 1, digest: int | None = None) -> bytes:
    if digest is None:
        digest = xxhash.xxh64_intdigest(body_bytes)
    return magic + bytes([fmt]) + struct.pack("<Q", digest) + body_bytes


def sample_body(checkpoint: int) -> dict:
    meta = {
        "inputs": {("f", 1): 4, ("x", 2, 0): 3},
        "wm": {("f", 1): 17.5, ("x", 2, 0): None},
        "frontier": 3,
        "last_epoch": 4,
        "precommitted": [[checkpoint, {"file": "part-0", "bytes": b"\x00\x01"}]],
    }
    return checkpoints.body("wordcount", checkpoint, {0: {"ops": {"count": meta}}, 1: {"ops": {}}})


def write_raw(run_dir: str, checkpoint: int, raw: bytes) -> str:
    path = checkpoints.path_of(run_dir, checkpoint)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(raw)
    return path


# -- write / read ----------------------------------------------------------------------------

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=6)
    | st.binary(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4) | st.integers(0, 9), inner, max_size=4)
    ),
    max_leaves=20,
)


@SETTINGS
@given(
    checkpoint=st.integers(0, 10**10 - 1),
    body=st.dictionaries(st.text(max_size=6) | st.integers(-5, 5), msgpack_values, max_size=5),
)
def test_write_read_round_trip(tmp_path_factory, checkpoint, body):
    run_dir = str(tmp_path_factory.mktemp("run"))
    path = checkpoints.write(run_dir, checkpoint, body)
    assert path == os.path.join(run_dir, "checkpoints", f"chk-{checkpoint:010d}.msgpack")
    assert checkpoints.read(path) == as_read(body)
    assert os.listdir(os.path.dirname(path)) == [os.path.basename(path)]  # no temporary left


def test_written_file_has_the_documented_layout(tmp_path):
    body = sample_body(7)
    path = checkpoints.write(str(tmp_path), 7, body)
    with open(path, "rb") as f:
        raw = f.read()
    magic, fmt, digest = struct.unpack_from("<4sBQ", raw)
    assert (magic, fmt) == (b"NSCK", 1)
    assert digest == xxhash.xxh64_intdigest(raw[HEAD:])
    assert msgpack.unpackb(raw[HEAD:], use_list=False, strict_map_key=False) == as_read(body)


def test_read_of_a_file_built_from_the_documented_layout(tmp_path):
    body = {"format": 1, "pipeline": "p", "checkpoint": 2, "workers": {0: {"ops": {"op": {"frontier": 1}}}}}
    path = write_raw(str(tmp_path), 2, file_bytes(msgpack.packb(body, use_bin_type=True)))
    assert checkpoints.read(path) == body


def test_body_names_pipeline_checkpoint_and_workers(tmp_path):
    body = sample_body(12)
    assert body == {
        "format": 1,
        "pipeline": "wordcount",
        "checkpoint": 12,
        "workers": {0: {"ops": {"count": body["workers"][0]["ops"]["count"]}}, 1: {"ops": {}}},
    }
    read = checkpoints.read(checkpoints.write(str(tmp_path), 12, body))
    assert read["workers"][0]["ops"]["count"]["inputs"] == {("f", 1): 4, ("x", 2, 0): 3}  # tuple channels kept
    assert read["workers"][1] == {"ops": {}}
    extra = checkpoints.body("p", 1, {}, {"note": "x"})
    assert extra == {"format": 1, "pipeline": "p", "checkpoint": 1, "workers": {}, "note": "x"}


def test_rewriting_a_checkpoint_replaces_it(tmp_path):
    checkpoints.write(str(tmp_path), 3, {"v": 1})
    path = checkpoints.write(str(tmp_path), 3, {"v": 2})
    assert checkpoints.read(path) == {"v": 2}
    assert checkpoints.completed(str(tmp_path)) == [3]


# -- completed -------------------------------------------------------------------------------


@SETTINGS
@given(ids=st.lists(st.integers(0, 10**10 - 1), unique=True, max_size=8))
def test_completed_lists_ids_oldest_first(tmp_path_factory, ids):
    run_dir = str(tmp_path_factory.mktemp("run"))
    for c in ids:
        checkpoints.write(run_dir, c, {"c": c})
    assert checkpoints.completed(run_dir) == sorted(ids)


def test_completed_ignores_other_files(tmp_path):
    run_dir = str(tmp_path)
    assert checkpoints.completed(run_dir) == []  # no checkpoints directory at all
    for c in (20, 3, 100):
        checkpoints.write(run_dir, c, {})
    d = os.path.join(run_dir, "checkpoints")
    for name in (
        "chk-0000000050.msgpack.tmp",
        "chk-51.msgpack",
        "chk-00000000052.msgpack",
        "notes.txt",
        "chk-x.msgpack",
    ):
        with open(os.path.join(d, name), "wb") as f:
            f.write(b"x")
    assert checkpoints.completed(run_dir) == [3, 20, 100]


# -- damaged files ---------------------------------------------------------------------------


def assert_refused(path: str, reason: str) -> None:
    with pytest.raises(CheckpointError) as ei:
        checkpoints.read(path)
    assert path in str(ei.value)
    assert reason in str(ei.value)
    assert ei.value.path == path


@SETTINGS
@given(data=st.data())
def test_any_flipped_byte_is_refused(tmp_path_factory, data):
    run_dir = str(tmp_path_factory.mktemp("run"))
    path = checkpoints.write(run_dir, 5, sample_body(5))
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    i = data.draw(st.integers(0, len(raw) - 1), label="offset")
    bit = data.draw(st.integers(0, 7), label="bit")
    raw[i] ^= 1 << bit
    with open(path, "wb") as f:
        f.write(raw)
    with pytest.raises(CheckpointError) as ei:
        checkpoints.read(path)
    assert path in str(ei.value)


def test_flipped_body_byte_is_a_checksum_mismatch(tmp_path):
    path = checkpoints.write(str(tmp_path), 5, sample_body(5))
    with open(path, "r+b") as f:
        f.seek(HEAD + 10)
        b = f.read(1)
        f.seek(HEAD + 10)
        f.write(bytes([b[0] ^ 0x40]))
    assert_refused(path, "checksum mismatch")


@SETTINGS
@given(data=st.data())
def test_any_truncation_is_refused(tmp_path_factory, data):
    run_dir = str(tmp_path_factory.mktemp("run"))
    path = checkpoints.write(run_dir, 5, sample_body(5))
    size = os.path.getsize(path)
    keep = data.draw(st.integers(0, size - 1), label="keep")
    os.truncate(path, keep)
    assert_refused(path, "truncated" if keep < HEAD else "checksum mismatch")


def test_wrong_magic_format_and_malformed_bodies(tmp_path):
    run_dir = str(tmp_path)
    good = msgpack.packb({"a": 1})
    cases = [
        (1, file_bytes(good, magic=b"NSCL"), "bad magic"),
        (2, b"PK\x03\x04" + bytes(20), "bad magic"),
        (3, file_bytes(good, fmt=2), "format 2"),
        (4, file_bytes(good, digest=xxhash.xxh64_intdigest(good) ^ 1), "checksum mismatch"),
        (5, file_bytes(b"\xc1"), "malformed body"),  # 0xc1 is never used by msgpack
        (6, file_bytes(msgpack.packb([1, 2])), "malformed body"),  # not a map
        (7, file_bytes(b""), "malformed body"),
    ]
    for c, raw, reason in cases:
        assert_refused(write_raw(run_dir, c, raw), reason)


def test_missing_file_is_refused(tmp_path):
    assert_refused(checkpoints.path_of(str(tmp_path), 9), "cannot be read")


# -- latest_valid ----------------------------------------------------------------------------


def damage(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([b[0] ^ 0xFF]))


def test_latest_valid_skips_a_damaged_newest_file(tmp_path):
    run_dir = str(tmp_path)
    for c in (1, 2, 3):
        checkpoints.write(run_dir, c, sample_body(c))
    assert checkpoints.latest_valid(run_dir) == (3, as_read(sample_body(3)), [])
    damage(checkpoints.path_of(run_dir, 3))
    c, body, errors = checkpoints.latest_valid(run_dir)
    assert (c, body) == (2, as_read(sample_body(2)))
    assert [e.path for e in errors] == [checkpoints.path_of(run_dir, 3)]
    assert checkpoints.path_of(run_dir, 3) in str(errors[0])


def test_latest_valid_falls_back_over_several_and_to_none(tmp_path):
    run_dir = str(tmp_path)
    assert checkpoints.latest_valid(run_dir) == (-1, None, [])
    for c in (4, 9, 10):
        checkpoints.write(run_dir, c, {"c": c})
    damage(checkpoints.path_of(run_dir, 10))
    os.truncate(checkpoints.path_of(run_dir, 9), 3)
    c, body, errors = checkpoints.latest_valid(run_dir)
    assert (c, body) == (4, {"c": 4})
    assert [e.path for e in errors] == [checkpoints.path_of(run_dir, 10), checkpoints.path_of(run_dir, 9)]
    damage(checkpoints.path_of(run_dir, 4))
    c, body, errors = checkpoints.latest_valid(run_dir)
    assert (c, body) == (-1, None)
    assert len(errors) == 3


def test_latest_valid_below(tmp_path):
    run_dir = str(tmp_path)
    for c in (1, 2, 3, 5):
        checkpoints.write(run_dir, c, {"c": c})
    damage(checkpoints.path_of(run_dir, 5))
    assert checkpoints.latest_valid(run_dir, below=5) == (3, {"c": 3}, [])
    assert checkpoints.latest_valid(run_dir, below=3) == (2, {"c": 2}, [])
    assert checkpoints.latest_valid(run_dir, below=1) == (-1, None, [])


# -- prune -----------------------------------------------------------------------------------


@SETTINGS
@given(ids=st.lists(st.integers(0, 10**6), unique=True, max_size=7), keep=st.integers(0, 9))
def test_prune_keeps_the_newest(tmp_path_factory, ids, keep):
    run_dir = str(tmp_path_factory.mktemp("run"))
    for c in ids:
        checkpoints.write(run_dir, c, {"c": c})
    stray = os.path.join(run_dir, "checkpoints", "notes.txt")
    os.makedirs(os.path.dirname(stray), exist_ok=True)
    with open(stray, "w") as f:
        f.write("x")
    checkpoints.prune(run_dir, keep)
    newest = sorted(ids)[max(0, len(ids) - keep) :]
    assert checkpoints.completed(run_dir) == newest
    for c in newest:
        assert checkpoints.read(checkpoints.path_of(run_dir, c)) == {"c": c}
    assert os.path.exists(stray)


def test_prune_of_an_empty_run_dir(tmp_path):
    checkpoints.prune(str(tmp_path), 3)
    assert checkpoints.completed(str(tmp_path)) == []
