"""`nosync cluster up|down|status`: what `up` refuses before making anything, what a failed
`up` leaves (its logs only), and that `down` leaves nothing, even without its state file."""

from __future__ import annotations

import os
import subprocess

import pytest

from experiments.cluster import ClusterError, default_state_dir, down, load, up


def test_up_needs_root(cli):
    # as nobody when run as root; as whoever runs the suite otherwise
    user = 65534 if os.geteuid() == 0 else None
    out = cli("cluster", "up", "--name", "nsu", user=user)
    assert out.returncode == 2, out.stderr
    assert "needs root" in out.stderr
    assert not os.path.exists(default_state_dir("nsu"))
    assert cli("cluster", "down", "--name", "nsu", user=user).returncode == 2


def test_up_names_the_tools_it_misses(hosts_possible, cli):
    # a PATH without iproute2 and util-linux
    out = cli("cluster", "up", "--name", "nsp", env=dict(os.environ, PATH="/nonexistent"))
    assert out.returncode == 2, out.stderr
    assert "ip, ss, unshare, nsenter, mount, hostname not found: install" in out.stderr
    assert "iproute2" in out.stderr and "util-linux" in out.stderr
    assert not os.path.exists(default_state_dir("nsp"))


def test_up_refuses_a_namespace_of_its_names(hosts_possible, cli, nothing_left):
    name, subnet = "nsr", "10.213.252.0/24"
    subprocess.run(["ip", "netns", "add", f"{name}-h2"], check=True)
    try:
        out = cli("cluster", "up", "--name", name, "--subnet", subnet)
        assert out.returncode == 2, out.stderr
        assert f"{name}-h2" in out.stderr
        # nothing made beside the namespace made by hand
        assert [x for x in nothing_left(name, subnet) if f"{name}-h2" not in x] == []
    finally:
        subprocess.run(["ip", "netns", "del", f"{name}-h2"], check=True)
    assert nothing_left(name, subnet) == []


def test_up_refuses_a_subnet_in_use(hosts_possible, cli, nothing_left):
    out = cli("cluster", "up", "--name", "nso", "--subnet", "127.0.0.0/24")
    assert out.returncode == 2, out.stderr
    assert "overlaps the address 127.0.0.1/8 of lo" in out.stderr
    assert nothing_left("nso", "127.0.0.0/24") == []


def test_a_failed_up_takes_down_what_it_made(hosts_possible, nothing_left):
    name, subnet = "nsf", "10.213.253.0/24"
    state_dir = default_state_dir(name)
    try:
        # no time to wait: it fails once the network, the master and S3 are started
        with pytest.raises(ClusterError, match="timed out .* waiting for the master to listen"):
            up(hosts=1, cores=1, name=name, subnet=subnet, timeout=0)
        assert nothing_left(name, subnet) == [f"state directory {state_dir}"]
        assert os.listdir(state_dir) == ["logs"]  # kept, for the error names them
        assert sorted(os.listdir(os.path.join(state_dir, "logs"))) == ["nsf-master.log", "s3.log"]
        assert load(name) is None
    finally:
        down(name)
    assert nothing_left(name, subnet) == []


def test_status_of_the_cluster(cluster, cli):
    out = cli("cluster", "status", "--name", cluster.name)
    assert out.returncode == 0, out.stderr
    assert f"{len(cluster.hosts)} of {len(cluster.hosts)} workers alive" in out.stdout
    for host in cluster.hosts:
        assert f"{host.name}  {host.address}  running (pid " in out.stdout
    assert f"--master {cluster.master}\n" in out.stdout
    assert "S3 on 10.213.251.1: reachable" in out.stdout


def test_down_leaves_nothing_even_without_its_state_file(hosts_possible, cli, nothing_left):
    name, subnet = "nsd", "10.213.254.0/24"
    try:
        out = cli("cluster", "up", "--hosts", "1", "--cores", "1", "--name", name, "--subnet", subnet)
        assert out.returncode == 0, out.stderr
        assert "--master spark://10.213.254.2:7077\n" in out.stdout
        assert "--remote 's3://nosync:nosync@nosync/runs?endpoint_override=10.213.254.1:" in out.stdout
        c = load(name)
        assert c is not None and [h.address for h in c.hosts] == ["10.213.254.11"]
        # a process on the host beside its worker, in its private mount namespace
        extra = subprocess.Popen(["nsenter", "-t", str(c.worker_pid(c.hosts[0])), "-n", "-m", "--", "sleep", "600"])
        # a host left cut off and stopped (a chaos run interrupted): taken down all the same
        c.cut_host(c.hosts[0])
        assert extra.pid in c.stop_host(c.hosts[0])
        os.unlink(os.path.join(c.state_dir, "cluster.json"))  # `down` must find it all by name

        out = cli("cluster", "down", "--name", name)
        assert out.returncode == 0, out.stderr
        assert extra.wait(timeout=5) == -9
        assert nothing_left(name, subnet) == []
        again = cli("cluster", "down", "--name", name)
        assert again.returncode == 0 and "nothing to remove" in again.stdout
        assert cli("cluster", "status", "--name", name).returncode == 1
    finally:
        down(name)
