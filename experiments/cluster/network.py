"""The hosts' network: a bridge in the root namespace, a network namespace per host, a veth
pair from each namespace to the bridge.

The root namespace is the driver's host: it holds the bridge and the bridge's address, so a
`nosync run` from a user's shell reaches every host, and every host reaches it, on-link.
Each namespace has its own loopback, up, and its own `eth0` on the bridge: its 127.0.0.1 is
its own, as on a real machine, so a worker that pins loopback cannot reach a peer. Each
namespace also gets `/etc/netns/<ns>/hosts`, which `ip netns exec` mounts over `/etc/hosts`
inside it, so that its hostname (the namespace's name, set by the process launcher)
resolves there to its own address.

Nothing here keeps state: what a cluster made is found again by name (`layout.owns_*`).
`check_free` refuses a cluster whose names exist or whose subnet overlaps an address or route
of the machine, before anything is made.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess

from experiments.cluster.errors import ClusterError, ClusterRefused
from experiments.cluster.layout import NS_INTERFACE, Layout, owns_link, owns_namespace

_ETC_NETNS = "/etc/netns"
_RUN_NETNS = "/run/netns"


def ip(*args: str) -> str:
    """Runs `ip ARGS`; its output, or ClusterError with the command and what it said."""
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        said = proc.stderr.strip().splitlines()
        raise ClusterError(f"`ip {' '.join(args)}` failed: {said[-1] if said else f'exit code {proc.returncode}'}")
    return proc.stdout


def _json(*args: str) -> list[dict]:
    out = ip("-j", *args).strip()
    return json.loads(out) if out else []  # `ip -j netns list` prints nothing when there is none


def namespaces() -> list[str]:
    """The names of the machine's named network namespaces."""
    return [n["name"] for n in _json("netns", "list")]


def links() -> list[str]:
    """The names of the root namespace's links."""
    return [link["ifname"] for link in _json("link", "show")]


def link_flags(link: str) -> list[str]:
    """The flags of `link` (UP, LOWER_UP, ...)."""
    got = _json("link", "show", "dev", link)
    return list(got[0].get("flags", [])) if got else []


def addresses(link: str) -> list[str]:
    """The IPv4 addresses of the root namespace's link `link`."""
    return [a["local"] for x in _json("-4", "addr", "show", "dev", link) for a in x.get("addr_info", [])]


def networks_in_use() -> list[tuple[ipaddress.IPv4Network, str]]:
    """Every IPv4 network the root namespace has an address in or a route to (default routes
    aside), each with where it was seen."""
    out: list[tuple[ipaddress.IPv4Network, str]] = []
    for link in _json("-4", "addr", "show"):
        for a in link.get("addr_info", []):
            net = ipaddress.ip_network(f"{a['local']}/{a['prefixlen']}", strict=False)
            out.append((net, f"address {a['local']}/{a['prefixlen']} of {link['ifname']}"))
    for r in _json("-4", "route", "show", "table", "all"):
        dst = r.get("dst", "default")
        if dst == "default":
            continue
        net = ipaddress.ip_network(dst, strict=False)
        out.append((net, f"route to {dst}" + (f" via {r['dev']}" if "dev" in r else "")))
    return out


def check_free(layout: Layout) -> None:
    """Raises ClusterRefused naming the first of `layout`'s names that exists (a namespace
    or a link, which `down` would take for its own), or an address or route of the machine
    that its subnet overlaps."""
    taken = [ns for ns in namespaces() if owns_namespace(layout.name, ns)]
    taken += [link for link in links() if owns_link(layout.name, link)]
    if taken:
        raise ClusterRefused(
            f"cluster {layout.name}: {_some(sorted(taken))} already on this machine; "
            f"`nosync cluster down --name {layout.name}` removes a cluster of that name, or choose another --name"
        )
    subnet = ipaddress.ip_network(layout.subnet)
    for net, where in networks_in_use():
        if net.overlaps(subnet):
            raise ClusterRefused(
                f"--subnet {layout.subnet} overlaps the {where} on this machine: choose another --subnet"
            )


def _some(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:3])} and {len(names) - 3} more"


def make(layout: Layout) -> None:
    """Makes `layout`'s bridge, namespaces and veth pairs, every address assigned and every
    link up, and each namespace's hosts file. Leaves what it made on failure (`remove`)."""
    prefix = layout.prefixlen
    ip("link", "add", layout.bridge, "type", "bridge")
    ip("addr", "add", f"{layout.driver_address}/{prefix}", "dev", layout.bridge)
    ip("link", "set", layout.bridge, "up")
    hosts_file = _hosts_file(layout)
    for host in (layout.master, *layout.hosts):
        veth = layout.veth(host)
        ip("netns", "add", host.name)
        ip("link", "add", veth, "type", "veth", "peer", "name", NS_INTERFACE, "netns", host.name)
        ip("link", "set", veth, "master", layout.bridge, "up")
        ip("-n", host.name, "addr", "add", f"{host.address}/{prefix}", "dev", NS_INTERFACE)
        ip("-n", host.name, "link", "set", NS_INTERFACE, "up")
        ip("-n", host.name, "link", "set", "lo", "up")
        os.makedirs(os.path.join(_ETC_NETNS, host.name), exist_ok=True)
        with open(os.path.join(_ETC_NETNS, host.name, "hosts"), "w") as f:
            f.write(hosts_file)


def _hosts_file(layout: Layout) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines.append(f"{layout.driver_address}\t{layout.name}-driver")
    lines += [f"{h.address}\t{h.name}" for h in (layout.master, *layout.hosts)]
    return "\n".join(lines) + "\n"


def remove(name: str) -> list[str]:
    """Deletes every veth, namespace and bridge of cluster `name` there is, and their hosts
    files; returns their names. Idempotent.

    REQUIRES: no process is left in the namespaces (`processes.kill_namespace`): a namespace
    that still has one outlives its name, with its end of the veth."""
    removed: list[str] = []
    existing = links()
    # a veth's two ends go together, at once; a namespace's deletion frees its end only later
    for link in existing:
        if owns_link(name, link) and link != f"{name}-br":
            _quietly_delete("link", "del", link)
            removed.append(link)
    for ns in namespaces():
        if owns_namespace(name, ns):
            _quietly_delete("netns", "del", ns)
            removed.append(ns)
    if f"{name}-br" in existing:
        _quietly_delete("link", "del", f"{name}-br")
        removed.append(f"{name}-br")
    if removed and os.path.isdir(_RUN_NETNS) and not os.listdir(_RUN_NETNS) and _RUN_NETNS in _mount_points():
        # `ip netns add` bind-mounts /run/netns on itself at its first use and leaves it: with
        # no namespace left, the machine is as it was without it
        subprocess.run(["umount", _RUN_NETNS], capture_output=True)
    if os.path.isdir(_ETC_NETNS):
        for entry in os.listdir(_ETC_NETNS):
            if owns_namespace(name, entry):
                shutil.rmtree(os.path.join(_ETC_NETNS, entry), ignore_errors=True)
        try:
            os.rmdir(_ETC_NETNS)  # only when empty: another tool's namespaces may keep files there
        except OSError:
            pass
    return removed


def _mount_points() -> set[str]:
    with open("/proc/self/mountinfo") as f:
        return {line.split()[4] for line in f}


def _quietly_delete(*args: str) -> None:
    """`ip ARGS`, where a thing already gone (deleted meanwhile, or with its peer) is not an error."""
    try:
        ip(*args)
    except ClusterError as e:
        if "Cannot find device" not in str(e) and "No such file" not in str(e):
            raise
