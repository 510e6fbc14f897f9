"""Where a run keeps what (`nosync.places`, `nosync.storage`), the driver's address on a
cluster (`nosync.spark.session`), a worker that cannot reach its coordinator, and the dead
letters the workers hand to the coordinator."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from nosync import storage
from nosync.driver.coordinator import Coordinator
from nosync.modes import get_mode, worker_hooks
from nosync.options import RunOptions
from nosync.places import SPARK_LOCAL, Places, places_of
from nosync.runtime import control, links
from nosync.runtime.worker import Worker
from nosync.spark.session import driver_address, is_embedded, master_address, outward_address

S3 = "s3://key:secret@bucket/runs?endpoint_override=10.1.2.3:9000&scheme=http"


def test_an_embedded_run_keeps_everything_in_its_run_directory(tmp_path):
    run = str(tmp_path / "run-a")
    p = places_of(run, None, None, embedded=True)
    assert p.shared == run
    assert p.local_root(1) == os.path.join(run, "state", "w1")
    assert p.store_remote(1, "nosync") == os.path.join(run, "remote", "w1", "nosync")
    assert p.embedded


def test_on_a_cluster_the_shared_tier_is_under_remote_and_the_local_roots_in_sparks_local_dirs(tmp_path, monkeypatch):
    run = str(tmp_path / "run-b")
    p = places_of(run, S3, None, embedded=False)
    name = p.run_name
    assert name.startswith("run-b-") and name != places_of(str(tmp_path / "x" / "run-b"), S3, None, False).run_name
    # the run's folder goes into the URI's path; its options and credentials stay with it
    assert p.shared == f"s3://key:secret@bucket/runs/{name}?endpoint_override=10.1.2.3:9000&scheme=http"
    assert p.store_remote(0, "agg") == (
        f"s3://key:secret@bucket/runs/{name}/remote/w0/agg?endpoint_override=10.1.2.3:9000&scheme=http"
    )
    assert p.local == SPARK_LOCAL and not p.embedded
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/disk1/blockmgr-x,/disk2/blockmgr-y")
    assert p.local_root(2) == f"/disk1/blockmgr-x/nosync/{name}/w2"
    assert Places.from_wire(json.loads(json.dumps(p.to_wire()))) == p


def test_a_local_dir_holds_each_runs_roots_apart(tmp_path):
    p = places_of(str(tmp_path / "run-c"), None, str(tmp_path / "fast"), embedded=False)
    assert p.local_root(0) == str(tmp_path / "fast" / p.run_name / "w0")
    assert p.shared == str(tmp_path / "run-c")


def test_storage_joins_paths_and_uris_and_hides_secrets():
    assert storage.join("/a/b", "c", "d") == "/a/b/c/d"
    assert storage.join("file:///a/b", "c") == "file:///a/b/c"
    assert storage.join("hdfs://nn:8020/x?replication=2", "y") == "hdfs://nn:8020/x/y?replication=2"
    assert storage.name_of(S3) == "runs"
    said = storage.redact(f"cannot read {S3} now")
    assert "secret" not in said and "s3://key:***@bucket/runs" in said
    assert storage.is_local("/x") and storage.is_local("file:///x") and not storage.is_local(S3)


def test_a_local_place_is_written_whole_and_listed(tmp_path):
    where = storage.join(str(tmp_path), "a", "b.bin")
    storage.write_bytes(where, b"abc")
    assert storage.read_bytes(where) == b"abc"
    assert storage.listdir(str(tmp_path / "a")) == ["b.bin"]
    assert storage.listdir(str(tmp_path / "nothing")) == []
    assert not [n for n in os.listdir(tmp_path / "a") if n.endswith(".tmp")]
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(str(tmp_path / "a" / "c.bin"))


@pytest.mark.parametrize(
    ("uri", "said"),
    [
        ("nosuch://bucket/x", "pyarrow.fs cannot open it"),
        ("s3://key:secret@bucket/x?endpoint_override=h:1&nonsense=1", "pyarrow.fs cannot open it"),
    ],
)
def test_a_remote_pyarrow_cannot_open_is_refused_naming_it(uri, said):
    with pytest.raises(Exception) as e:
        storage.check_writable(uri, "--remote")
    assert said in str(e.value) and "--remote" in str(e.value)
    assert "secret" not in str(e.value)


def test_the_master_urls_host_is_found():
    assert master_address("spark://10.0.0.2:7077") == ("10.0.0.2", 7077)
    assert master_address("spark://a:7077,b:7078") == ("a", 7077)
    assert master_address("k8s://https://api.example:6443") == ("api.example", 6443)
    assert master_address("yarn") is None
    assert is_embedded(None) and is_embedded("local[2,4]") and not is_embedded("spark://h:1")


def test_the_driver_is_on_loopback_embedded_and_off_it_toward_a_remote_master():
    assert driver_address("local[2]") == "127.0.0.1"
    assert driver_address("spark://10.9.9.9:7077", "192.0.2.7") == "192.0.2.7"
    # toward a master on loopback the outward address is loopback; toward one elsewhere it
    # is the address of the interface the route leaves by, which is never 127.0.0.1
    assert outward_address("spark://127.0.0.1:7077") == "127.0.0.1"


def test_a_worker_that_cannot_reach_its_coordinator_ends_its_task_saying_where(monkeypatch):
    monkeypatch.setattr(links, "CONNECT_S", 1.0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    spec = {"workers": 1, "secret": b"s" * 32, "run_id": "r1", "coordinator": ["127.0.0.1", port]}
    t0 = time.monotonic()
    got = Worker(0, 0, spec, worker_hooks("none", RunOptions())).run()
    assert time.monotonic() - t0 < 10
    assert f"127.0.0.1:{port}" in got["error"]
    assert "--driver-host" in got["error"]


def test_dead_letters_reach_the_run_directory_once(tmp_path):
    c = Coordinator(2, b"the run's secret", get_mode("none"), "run-1", run_dir=str(tmp_path))
    try:
        a = control.DeadLetter(worker=1, source="lines", file="/in/a", position={"line": 3}, error="bad")
        b = control.DeadLetter(worker=1, source="lines", file="/in/a", position={"line": 9}, error="bad")
        for msg in (a, b, a):  # a restarted worker reads `a` again
            c._handle(1, None, control.from_wire(control.to_wire(msg)))
    finally:
        c.close()
    lines = (tmp_path / "dead-letter-w1.jsonl").read_text().splitlines()
    assert [json.loads(line)["position"] for line in lines] == [{"line": 3}, {"line": 9}]
    assert c.dead_letters_written == 2
