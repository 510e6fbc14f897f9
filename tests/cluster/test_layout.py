"""What needs no root: a cluster's names and addresses, its state file, and the parsing of a
host's sockets."""

from __future__ import annotations

import pytest

from experiments.cluster import ClusterRefused
from experiments.cluster.layout import owns_link, owns_namespace, plan
from experiments.cluster.sockets import parse
from experiments.cluster.state import ClusterState, read, write


def test_plan_names_and_addresses():
    layout = plan("nsc", 3, "10.213.0.0/24")
    assert layout.bridge == "nsc-br"
    assert layout.driver_address == "10.213.0.1"
    assert (layout.master.name, layout.master.address) == ("nsc-master", "10.213.0.2")
    assert [(h.name, h.address, h.index) for h in layout.hosts] == [
        ("nsc-h1", "10.213.0.11", 1),
        ("nsc-h2", "10.213.0.12", 2),
        ("nsc-h3", "10.213.0.13", 3),
    ]
    assert layout.links() == ("nsc-br", "nsc-vm", "nsc-v1", "nsc-v2", "nsc-v3")
    assert layout.namespaces() == ("nsc-master", "nsc-h1", "nsc-h2", "nsc-h3")


def test_every_link_name_fits_linux():
    layout = plan("abcdef", 200, "10.0.0.0/16")
    assert max(len(x) for x in layout.links()) <= 15


@pytest.mark.parametrize(
    "name, hosts, subnet, says",
    [
        ("NSC", 3, "10.213.0.0/24", "cluster name"),
        ("toolong", 3, "10.213.0.0/24", "cluster name"),
        ("nsc", 0, "10.213.0.0/24", "at least one host"),
        ("nsc", 245, "10.213.0.0/24", "no room for 245 hosts"),
        ("nsc", 3, "10.213.0.0/29", "no room for 3 hosts"),
        ("nsc", 3, "10.213.0.1/24", "host bits set"),
        ("nsc", 3, "fd00::/64", "IPv4"),
    ],
)
def test_plan_refuses(name, hosts, subnet, says):
    with pytest.raises(ClusterRefused, match=says):
        plan(name, hosts, subnet)


def test_a_cluster_owns_only_its_own_names():
    assert owns_namespace("nsc", "nsc-master") and owns_namespace("nsc", "nsc-h12")
    assert not owns_namespace("nsc", "nsc2-h1") and not owns_namespace("nsc", "nsc-probe")
    assert owns_link("nsc", "nsc-br") and owns_link("nsc", "nsc-vm") and owns_link("nsc", "nsc-v3")
    assert not owns_link("nsc", "nsc2-br") and not owns_link("nsc", "eth0") and not owns_link("ns", "nsc-br")


def test_state_file_round_trip(tmp_path):
    state = ClusterState(
        name="nsc",
        subnet="10.213.0.0/24",
        hosts=2,
        cores=2,
        memory="1g",
        disk="4g",
        state_dir=str(tmp_path),
        python="/usr/bin/python3",
        spark_home="/opt/spark",
        s3_port=4567,
        s3_pid=12,
    ).with_pid("nsc-h1", 34)
    write(state)
    assert read(str(tmp_path)) == state
    assert state.remote == "s3://nosync:nosync@nosync/runs?endpoint_override=10.213.0.1:4567&scheme=http"
    assert state.master_url == "spark://10.213.0.2:7077"
    assert read(str(tmp_path / "none")) is None


SS = """\
LISTEN 0      4096   [::ffff:10.213.0.12]:33681             *:*     users:(("java",pid=12767,fd=312))
LISTEN 0      128                0.0.0.0:22           0.0.0.0:*     users:(("sshd",pid=7,fd=3))
LISTEN 0      50               127.0.0.1:4040               [::]:*
ESTAB  0      0     10.213.0.12:60370  10.213.0.2:7077  users:(("java",pid=12767,fd=300),("java",pid=9,fd=1))
TIME-WAIT 0   0               127.0.0.1:50456        127.0.0.1:47149
"""


def test_parse_ss():
    socks = parse(SS)
    assert [(s.state, s.local_address, s.local_port, s.peer_address, s.peer_port) for s in socks] == [
        ("LISTEN", "10.213.0.12", 33681, "*", 0),
        ("LISTEN", "*", 22, "*", 0),
        ("LISTEN", "127.0.0.1", 4040, "*", 0),
        ("ESTAB", "10.213.0.12", 60370, "10.213.0.2", 7077),
        ("TIME-WAIT", "127.0.0.1", 50456, "127.0.0.1", 47149),
    ]
    assert socks[3].processes == (("java", 12767), ("java", 9)) and socks[3].pids == (12767, 9)
    assert [s.loopback for s in socks] == [False, False, True, False, True]
