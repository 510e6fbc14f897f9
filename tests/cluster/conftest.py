"""A cluster of hosts on this machine for the tests (`experiments.cluster`), made once for
this package's tests and taken down after its last one, a failure or an interrupt included.

`cluster` is the shared one: 3 hosts of 2 cores, named `nst` in a subnet of its own so that it
never meets a user's `nsc`. Its tests are skipped, with the reason, where hosts cannot be made:
not root, or network namespaces refused (a container without the capability). `nothing_left`
lists what a cluster left on the machine, for the tests of `down`; `cli` runs the command
line, as root or as another user.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from collections.abc import Callable, Iterator

import pytest
from support.paths import NOSYNC, ROOT

NAME = "nst"
SUBNET = "10.213.251.0/24"


def hosts_unsupported() -> str | None:
    """Why a cluster of hosts cannot be made here, or None when it can (tried for real)."""
    if os.geteuid() != 0:
        return "a cluster of hosts needs root (network namespaces, veths, mounts)"
    probe = f"nsprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` fails here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def require_hosts() -> None:
    """Skips the test, printing why, where a cluster of hosts cannot be made."""
    reason = hosts_unsupported()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="package")
def cluster() -> Iterator:
    """The package's cluster `nst`: 3 hosts of 2 cores, up until its last test is done."""
    require_hosts()
    from experiments.cluster import down, up

    down(NAME)  # what an interrupted session (a SIGKILLed pytest) left
    try:
        yield up(hosts=3, cores=2, name=NAME, subnet=SUBNET)
    finally:
        down(NAME)


def leftovers(name: str, subnet: str) -> list[str]:
    """What of cluster `name` in `subnet` is on the machine: namespaces, links, hosts files,
    mounts (the namespaces' bind mounts), processes (any whose command line names an address
    of the subnet: every Spark daemon and the S3 server does), the state directory."""
    from experiments.cluster import default_state_dir

    found: list[str] = []
    netns = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True, check=True).stdout
    found += [f"namespace {n['name']}" for n in json.loads(netns or "[]") if n["name"].startswith(f"{name}-")]
    links = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True, check=True).stdout
    found += [f"link {x['ifname']}" for x in json.loads(links) if x["ifname"].startswith(f"{name}-")]
    if os.path.isdir("/etc/netns"):
        found += [f"/etc/netns/{x}" for x in os.listdir("/etc/netns") if x.startswith(f"{name}-")]
    state_dir = default_state_dir(name)
    with open("/proc/mounts") as f:
        mounts = [line.split()[1] for line in f]
    found += [f"mount {m}" for m in mounts if f"/{name}-" in m or m.startswith(state_dir)]
    net = ipaddress.ip_network(subnet)
    prefix = str(net.network_address).rsplit(".", 1)[0] + "."
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a.startswith(prefix) for a in argv) or any(state_dir in a for a in argv):
            found.append(f"process {entry.name}: {' '.join(argv)[:200]}")
    if os.path.exists(state_dir):
        found.append(f"state directory {state_dir}")
    return found


@pytest.fixture
def nothing_left() -> Callable[[str, str], list[str]]:
    """`leftovers(name, subnet)`: what of a cluster is left on the machine."""
    return leftovers


def run_cli(
    *args: str, user: int | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """Runs `nosync ARGS` (as the user id `user`, with the environment `env`, when given)
    and waits for it."""
    cmd = [*NOSYNC, *args]
    if user is not None:
        cmd = ["/usr/bin/setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *cmd]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def cli() -> Callable[..., subprocess.CompletedProcess]:
    """`run_cli(*args, user=None, env=None)`: the command line, run to its end."""
    return run_cli


@pytest.fixture
def hosts_possible() -> None:
    """Skips the test, printing why, where a cluster of hosts cannot be made."""
    require_hosts()
