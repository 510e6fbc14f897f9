"""The names and addresses of a cluster, derived from its name, its number of hosts and its
subnet alone.

Everything a cluster makes on the machine is named after the cluster, so that `down` can
find it all by name when the state file is gone or `up` stopped half-way: the bridge
`<name>-br`, the namespaces `<name>-master` and `<name>-h1` .. `<name>-hN`, and the
root-side end of each namespace's veth pair, `<name>-vm` and `<name>-v1` .. `<name>-vN` (the
other end is `eth0` inside the namespace). A name is at most 6 characters of [a-z0-9], so
that every link name fits Linux's 15 characters and no cluster's names match another's
patterns (`nsc-h1` is never `nsc2`'s).

Addresses are fixed offsets in the subnet: the bridge, which is the driver's host (the root
namespace), is .1, the master .2, host i is .(10 + i).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from experiments.cluster.errors import ClusterRefused

DEFAULT_NAME = "nsc"
DEFAULT_SUBNET = "10.213.0.0/24"
MASTER_PORT = 7077
MASTER_UI_PORT = 8080
WORKER_UI_PORT = 8081
NS_INTERFACE = "eth0"
"""The name of a namespace's end of its veth pair (names are per namespace)."""

_NAME = re.compile(r"[a-z0-9]{1,6}")
_MASTER_OFFSET = 2
_FIRST_HOST_OFFSET = 11


@dataclass(frozen=True)
class Host:
    """One machine of the cluster: `name` is its network namespace (and its hostname),
    `address` its IPv4 address on the bridge, `index` 1..N (0 for the master's)."""

    name: str
    address: str
    index: int


@dataclass(frozen=True)
class Layout:
    """Every name and address of a cluster of `len(hosts)` hosts."""

    name: str
    subnet: str
    bridge: str
    driver_address: str
    master: Host
    hosts: tuple[Host, ...]

    @property
    def prefixlen(self) -> int:
        """The subnet's prefix length, with which every address is assigned."""
        return ipaddress.ip_network(self.subnet).prefixlen

    def veth(self, host: Host) -> str:
        """The root-side end of `host`'s veth pair, attached to the bridge."""
        return f"{self.name}-vm" if host.index == 0 else f"{self.name}-v{host.index}"

    def namespaces(self) -> tuple[str, ...]:
        """Every namespace of the cluster, the master's first."""
        return (self.master.name, *(h.name for h in self.hosts))

    def links(self) -> tuple[str, ...]:
        """Every link the cluster makes in the root namespace: the bridge and the veths."""
        return (self.bridge, self.veth(self.master), *(self.veth(h) for h in self.hosts))


def check_name(name: str) -> None:
    """Raises ClusterRefused unless `name` can name a cluster (1 to 6 of [a-z0-9])."""
    if not _NAME.fullmatch(name):
        raise ClusterRefused(f"cluster name {name!r}: 1 to 6 characters of a-z and 0-9 (link names are 15 at most)")


def plan(name: str, hosts: int, subnet: str) -> Layout:
    """The layout of a cluster `name` of `hosts` hosts in `subnet` (an IPv4 network);
    raises ClusterRefused naming what does not fit."""
    check_name(name)
    if hosts < 1:
        raise ClusterRefused(f"--hosts {hosts}: a cluster needs at least one host")
    try:
        net = ipaddress.ip_network(subnet, strict=True)
    except ValueError as e:
        raise ClusterRefused(f"--subnet {subnet}: {e}") from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise ClusterRefused(f"--subnet {subnet}: an IPv4 network is needed")
    last = _FIRST_HOST_OFFSET + hosts - 1
    if last >= net.num_addresses - 1:  # the last address is the broadcast
        raise ClusterRefused(f"--subnet {subnet} has no room for {hosts} hosts (host i is at offset 10 + i)")
    base = net.network_address
    return Layout(
        name=name,
        subnet=str(net),
        bridge=f"{name}-br",
        driver_address=str(base + 1),
        master=Host(f"{name}-master", str(base + _MASTER_OFFSET), 0),
        hosts=tuple(Host(f"{name}-h{i}", str(base + 10 + i), i) for i in range(1, hosts + 1)),
    )


def owns_namespace(name: str, namespace: str) -> bool:
    """Whether the network namespace `namespace` is one cluster `name` makes."""
    return re.fullmatch(rf"{re.escape(name)}-(master|h[0-9]+)", namespace) is not None


def owns_link(name: str, link: str) -> bool:
    """Whether the root-namespace link `link` is one cluster `name` makes."""
    return re.fullmatch(rf"{re.escape(name)}-(br|vm|v[0-9]+)", link) is not None
