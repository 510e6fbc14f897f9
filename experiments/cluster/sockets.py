"""The TCP sockets of a host, as `ss -tanp` run in its network namespace reports them.

A test that no worker listens on or dials 127.0.0.1 reads them here. Each socket names the
processes holding it, since not every loopback socket on a host is a bug: PySpark's own
daemon, for one, talks to its executor over the host's loopback.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from dataclasses import dataclass

from experiments.cluster.errors import ClusterError

_PROCESS = re.compile(r'\("([^"]*)",pid=(\d+),fd=\d+\)')


@dataclass(frozen=True)
class Socket:
    """One TCP socket: its `state` (`LISTEN`, `ESTAB`, ...), its local and peer address and
    port (`*` and 0 for a listener's peer, and for an address bound to none), and the
    `(command, pid)` of every process holding it."""

    state: str
    local_address: str
    local_port: int
    peer_address: str
    peer_port: int
    processes: tuple[tuple[str, int], ...]

    @property
    def pids(self) -> tuple[int, ...]:
        """The pids of the processes holding it."""
        return tuple(pid for _, pid in self.processes)

    @property
    def loopback(self) -> bool:
        """Whether it is bound to or connected to a loopback address."""
        return _is_loopback(self.local_address) or _is_loopback(self.peer_address)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # `*`: every address, loopback and the host's own


def _endpoint(text: str) -> tuple[str, int]:
    """`10.0.0.1:80`, `[::ffff:10.0.0.1]:80`, `*:80`, `[::]:80`, `*:*` -> (address, port),
    an IPv4-mapped address as IPv4, a wildcard as `*`, a wildcard port as 0."""
    address, _, port = text.rpartition(":")
    address = address.strip("[]").split("%", 1)[0]  # a link-local address's `%eth0` scope
    if address.startswith("::ffff:") and "." in address:
        address = address[len("::ffff:") :]
    if address in ("", "*", "0.0.0.0", "::"):
        address = "*"
    return address, int(port) if port.isdigit() else 0


def parse(ss_output: str) -> list[Socket]:
    """The sockets of `ss -tanpH` output."""
    out = []
    for line in ss_output.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        local, peer = _endpoint(fields[3]), _endpoint(fields[4])
        procs = tuple((cmd, int(pid)) for cmd, pid in _PROCESS.findall(" ".join(fields[5:])))
        out.append(Socket(fields[0], local[0], local[1], peer[0], peer[1], procs))
    return out


def sockets(namespace: str) -> list[Socket]:
    """Every TCP socket in the network namespace `namespace` now."""
    proc = subprocess.run(["ip", "netns", "exec", namespace, "ss", "-tanpH"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ClusterError(f"`ss` in {namespace} failed: {proc.stderr.strip()}")
    return parse(proc.stdout)
