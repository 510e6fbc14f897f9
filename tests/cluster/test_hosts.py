"""The hosts of a cluster are hosts: each its own address and loopback, each reaching the
master and the shared tier, each with a disk nobody else reads, and each lost for real."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid

from experiments.cluster import processes
from nosync import storage

LISTEN = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(600)
"""

CONNECT = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close()
    print("connected")
except ConnectionRefusedError:
    print("refused")
"""


def test_every_host_has_its_own_address_and_loopback(cluster):
    seen = set()
    for host in cluster.hosts:
        out = cluster.run_in(host, ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True)
        addresses = {(x["ifname"], a["local"]) for x in json.loads(out.stdout) for a in x["addr_info"]}
        assert addresses == {("lo", "127.0.0.1"), ("eth0", host.address)}, host
        seen.add(host.address)
    assert len(seen) == len(cluster.hosts)

    # a port on one host's loopback is not on another's
    first, second = cluster.hosts[0], cluster.hosts[1]
    server = subprocess.Popen(
        ["ip", "netns", "exec", first.name, sys.executable, "-c", LISTEN], stdout=subprocess.PIPE, text=True
    )
    try:
        port = server.stdout.readline().strip()
        assert port.isdigit(), port

        def dial(host):
            out = cluster.run_in(host, [sys.executable, "-c", CONNECT, port], capture_output=True, text=True)
            return out.stdout.strip()

        assert dial(first) == "connected"
        assert dial(second) == "refused"
    finally:
        server.kill()
        server.wait()


PROBE = """
import socket, sys
from nosync import storage
master, remote, name = sys.argv[1:]
host, port = master.split(":")
socket.create_connection((host, int(port)), timeout=5).close()
storage.write_bytes(storage.join(remote, name), b"from " + socket.gethostname().encode())
print("ok")
"""


def test_a_host_reaches_the_master_and_the_shared_tier(cluster):
    master = cluster.master.removeprefix("spark://")
    for host in cluster.hosts:
        name = f"probe-{uuid.uuid4().hex[:8]}"
        out = cluster.run_in(
            host,
            [sys.executable, "-c", PROBE, master, cluster.remote, name],
            private=True,
            capture_output=True,
            text=True,
            cwd="/",
        )
        assert out.stdout.strip() == "ok", out.stderr[-2000:]
        # written from the host over the bridge, read here: one shared tier
        where = storage.join(cluster.remote, name)
        assert storage.read_bytes(where) == f"from {host.name}".encode()
        storage.delete(where)


def test_a_hosts_private_root_is_seen_by_it_alone(cluster):
    root = cluster.local_root
    name = f"private-{uuid.uuid4().hex[:8]}"
    first, *others = cluster.hosts
    wrote = cluster.run_in(first, ["sh", "-c", f'echo mine > "{root}/{name}"'], private=True, capture_output=True)
    assert wrote.returncode == 0, wrote.stderr
    try:
        read = cluster.run_in(first, ["cat", f"{root}/{name}"], private=True, capture_output=True, text=True)
        assert read.stdout == "mine\n"
        for host in others:
            there = cluster.run_in(host, ["ls", "-A", root], private=True, capture_output=True, text=True)
            assert there.returncode == 0 and name not in there.stdout.split(), host
        # not in the driver's root namespace either, nor from a host's network namespace alone
        assert os.listdir(root) == []
        assert cluster.run_in(others[0], ["test", "-e", f"{root}/{name}"]).returncode == 1
    finally:
        cluster.run_in(first, ["rm", "-f", f"{root}/{name}"], private=True)


def test_host_of_pid(cluster):
    for host in cluster.hosts:
        pid = cluster.worker_pid(host)
        assert pid is not None and cluster.host_of_pid(pid) == host
    assert cluster.host_of_pid(os.getpid()) is None  # the driver's host
    master = processes.spark_pid(cluster.master_host.name, processes.MASTER_CLASS)
    assert master is not None and cluster.host_of_pid(master) is None


def test_a_workers_sockets_are_on_its_host_address(cluster):
    host = cluster.hosts[0]
    pid = cluster.worker_pid(host)
    mine = [s for s in cluster.listening(host) if pid in s.pids]
    assert (host.address, 8081) in {(s.local_address, s.local_port) for s in mine}
    assert mine and not any(s.loopback or s.local_address == "*" for s in mine), mine
    to_master = [s for s in cluster.connections(host) if pid in s.pids and s.peer_port == 7077]
    assert to_master and to_master[0].peer_address == cluster.master_host.address


def _mount_ns(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/mnt").st_ino


def _started_s(pid: int) -> float:
    """When `pid` started, in seconds since boot (CLOCK_BOOTTIME)."""
    fields = processes.stat_fields(pid)
    if fields is None:
        return float("inf")  # gone: started before nothing
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in clock ticks


def _holders(mnt_ns: int, before_s: float) -> list[int]:
    """The processes started before `before_s` (seconds since boot) that are in the mount
    namespace `mnt_ns`, anywhere on the machine. A namespace's inode number is reused once
    it is freed, so a process started since may be in another namespace of that number."""
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.stat(f"/proc/{entry.name}/ns/mnt").st_ino == mnt_ns and _started_s(int(entry.name)) < before_s:
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


def test_lose_host_kills_every_process_and_wipes_its_disk(cluster):
    host = cluster.hosts[1]
    root = cluster.local_root
    name = f"lost-{uuid.uuid4().hex[:8]}"
    assert cluster.run_in(host, ["sh", "-c", f'echo x > "{root}/{name}"'], private=True).returncode == 0
    old_worker = cluster.worker_pid(host)
    old_mounts = _mount_ns(old_worker)
    # a process of the host that is not Spark's: lost with it all the same
    bystander = subprocess.Popen(
        ["ip", "netns", "exec", host.name, "sh", "-c", "echo in; exec sleep 600"], stdout=subprocess.PIPE, text=True
    )
    assert bystander.stdout.readline() == "in\n"  # it runs in the host's namespace now
    old = set(processes.netns_pids(host.name))
    assert {old_worker, bystander.pid} <= old
    old_ids = {w["id"] for w in cluster.master_state()["workers"] if w["host"] == host.address}
    # a machine that stops answering first: every process of it stopped, then lost
    stopped = cluster.stop_host(host)
    assert old <= set(stopped)
    assert all(processes.is_stopped(pid) for pid in old)
    assert not processes.is_stopped(os.getpid())

    before, since_boot = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
    wiped = cluster.lose_host(host)
    assert before <= wiped <= time.time()

    assert bystander.wait(timeout=5) == -9
    assert not any(processes.running(pid) for pid in old)
    # nothing holds the old disk's mount namespace any more: its tmpfs is gone
    assert _holders(old_mounts, since_boot) == []
    new_worker = cluster.worker_pid(host)
    assert new_worker not in (None, old_worker)
    listed = cluster.run_in(host, ["ls", "-A", root], private=True, capture_output=True, text=True)
    assert sorted(listed.stdout.split()) == ["spark", "tmp", "work"]  # a fresh root: what a worker starts with
    state = cluster.master_state()
    assert state["aliveworkers"] == len(cluster.hosts)
    alive = processes.alive_workers(state)
    assert sorted(alive) == sorted(h.address for h in cluster.hosts)
    assert not set(alive[host.address]) & old_ids
    status = cluster.status()
    assert status.alive_workers == len(cluster.hosts) and all(h.alive for h in status.hosts)


DIAL = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except ConnectionRefusedError:
    print("refused")
except TimeoutError:
    print("timeout")
"""

HOLD = """
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
s.settimeout(None)
print("connected", flush=True)
sys.stdin.readline()
s.sendall(b"sent while cut")
s.recv(1)
"""


def test_a_cut_host_drops_packets_both_ways_silently_until_healed(cluster):
    host = cluster.hosts[0]
    listener = socket.create_server((cluster.driver_address, 0))
    port = listener.getsockname()[1]
    closed_port = _free_port()

    def dial(address: str, p: int, timeout: float) -> str:
        out = cluster.run_in(
            host, [sys.executable, "-c", DIAL, address, str(p), str(timeout)], capture_output=True, text=True
        )
        return out.stdout.strip()

    held = subprocess.Popen(
        ["ip", "netns", "exec", host.name, sys.executable, "-c", HOLD, cluster.driver_address, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert held.stdout.readline() == "connected\n"
        conn, _ = listener.accept()
        conn.settimeout(10)
        assert dial(cluster.driver_address, port, 2) == "connected"
        listener.accept()[0].close()
        cluster.cut_host(host)
        assert cluster.is_cut(host)
        # nothing answers, not even a refusal: the packets are dropped
        assert dial(cluster.driver_address, port, 1) == "timeout"
        assert dial(cluster.driver_address, closed_port, 1) == "timeout"
        # the host itself still works: its loopback answers at once
        assert dial("127.0.0.1", closed_port, 1) == "refused"
        # a connection made before the cut is not reset: what it sends meanwhile arrives after
        held.stdin.write("go\n")
        held.stdin.flush()
        cluster.heal_host(host)
        assert not cluster.is_cut(host)
        got = b""
        while len(got) < len(b"sent while cut"):
            data = conn.recv(64)
            assert data, "the held connection ended"
            got += data
        assert got == b"sent while cut"
        assert dial(cluster.driver_address, port, 2) == "connected"
    finally:
        if cluster.is_cut(host):
            cluster.heal_host(host)
        held.kill()
        held.wait()
        listener.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
