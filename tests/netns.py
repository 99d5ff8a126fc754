"""Network namespaces as hosts for multi-host and network-fault tests.

:class:`Hosts` puts each named member in its own namespace (``<tag>-<name>``) with one veth on a
Linux bridge in the test's namespace (10.77.<net>.0/24; host k is .10+k, the bridge .1). Faults are
applied inside a host's namespace: :meth:`Hosts.partition` (iptables DROP both ways),
:meth:`Hosts.lossy` (iptables ``statistic`` random drop), :meth:`Hosts.slow` (a ``tbf`` rate limit on
both ends of its veth). This kernel has no ``netem``, so delay is made by queueing behind the rate
limit rather than by a fixed added latency.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


class Hosts:
    """Namespaces ``<tag>-<name>`` on a bridge; host k has 10.77.<net>.<10+k>, the bridge .1."""

    def __init__(self, names: list[str]) -> None:
        self.tag = "me" + uuid.uuid4().hex[:6]
        self.net = int(self.tag[2:4], 16) % 200 + 20
        self.bridge = f"{self.tag}br"
        self.addr = {n: f"10.77.{self.net}.{10 + k}" for k, n in enumerate(names)}
        self.ns = {n: f"{self.tag}-{n}" for n in names}
        self._made: list[tuple[str, str]] = []
        self.veth: dict[str, tuple[str, str]] = {}  # name -> (outer end on the bridge, inner end in the ns)

    def up(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        _ip("addr", "add", f"10.77.{self.net}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        # Where bridged frames pass iptables (br_netfilter, e.g. once dockerd ran: FORWARD policy
        # DROP), let this bridge's own traffic through; removed again in down().
        if shutil.which("iptables") and subprocess.run(
                ["iptables", "-I", "FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"],
                capture_output=True, timeout=30).returncode == 0:
            self._made.append(("iptables", self.bridge))
        for k, (name, ns) in enumerate(self.ns.items()):
            _ip("netns", "add", ns)
            self._made.append(("netns", ns))
            outer, inner = f"{self.tag}v{k}", f"{self.tag}p{k}"
            self.veth[name] = (outer, inner)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            self._made.append(("link", outer))
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", self.bridge)
            _ip("link", "set", outer, "up")
            _ip("-n", ns, "addr", "add", f"{self.addr[name]}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def down(self) -> None:
        for kind, what in reversed(self._made):
            if kind == "netns":
                _ip("netns", "del", what, check=False)
            elif kind == "iptables":
                subprocess.run(["iptables", "-D", "FORWARD", "-i", what, "-o", what, "-j", "ACCEPT"],
                               capture_output=True, timeout=30)
            else:
                _ip("link", "del", what, check=False)

    def wrap(self, name: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[name]]


    def _in(self, name: str, *cmd: str) -> None:
        subprocess.run(["ip", "netns", "exec", self.ns[name], *cmd], check=True, capture_output=True, timeout=30)

    def partition(self, name: str) -> None:
        """Cut ``name`` off from everyone (packets dropped silently, connections hang: no RST)."""
        self._in(name, "iptables", "-I", "INPUT", "-j", "DROP")
        self._in(name, "iptables", "-I", "OUTPUT", "-j", "DROP")

    def heal(self, name: str) -> None:
        """Remove every fault from ``name``: iptables rules and rate limits."""
        self._in(name, "iptables", "-F")
        outer, inner = self.veth[name]
        subprocess.run(["tc", "qdisc", "del", "dev", outer, "root"], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "exec", self.ns[name], "tc", "qdisc", "del", "dev", inner, "root"],
                       capture_output=True, timeout=30)

    def lossy(self, name: str, probability: float) -> None:
        """Drop each packet to and from ``name`` with ``probability`` (TCP retransmits)."""
        for chain in ("INPUT", "OUTPUT"):
            self._in(name, "iptables", "-I", chain, "-m", "statistic", "--mode", "random",
                     "--probability", f"{probability}", "-j", "DROP")

    def slow(self, name: str, rate: str = "8mbit", latency: str = "2s") -> None:
        """Rate-limit ``name``'s link both ways (token bucket; packets queue up to ``latency``)."""
        outer, inner = self.veth[name]
        args = ["tbf", "rate", rate, "burst", "32kbit", "latency", latency]
        subprocess.run(["tc", "qdisc", "add", "dev", outer, "root", *args], check=True, capture_output=True,
                       timeout=30)
        self._in(name, "tc", "qdisc", "add", "dev", inner, "root", *args)


def iptables_or_skip() -> None:
    """Partitions and packet loss are iptables rules inside a host's namespace."""
    if shutil.which("iptables") is None:
        pytest.skip("network-fault test needs iptables (apt-get install iptables; .ci/run installs it)")


def namespaces_or_skip() -> None:
    """Skip, with the reason, where network namespaces cannot be made."""
    if shutil.which("ip") is None:
        pytest.skip("multi-host test needs iproute2's `ip` (apt-get install iproute2)")
    if os.geteuid() != 0:
        pytest.skip("multi-host test needs root to create network namespaces")
    probe = f"mpcprobe{uuid.uuid4().hex[:6]}"
    got = _ip("netns", "add", probe, check=False)
    if got.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {got.stderr.strip()}")
    _ip("netns", "del", probe, check=False)
