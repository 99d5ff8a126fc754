"""Multi-host: each party and the dealer in its own network namespace with its own address.

A Linux bridge in the test's namespace joins one veth per host (10.77.<k>.0/24); every daemon
listens only on its own host's address, so every byte between members — control plane, endpoint
look-ups, shares, triples — crosses the bridge. The coordinator stays outside (on the bridge's own
address). Skipped, with the reason, only where namespaces cannot be created (not root, no
iproute2, or a sandbox without CAP_NET_ADMIN).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.consortium import LocalConsortium
from coordinator.demo import DemoJob, job_toml

pytestmark = pytest.mark.e2e


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


def _namespaces_or_skip() -> None:
    if shutil.which("ip") is None:
        pytest.skip("multi-host test needs iproute2's `ip` (apt-get install iproute2)")
    if os.geteuid() != 0:
        pytest.skip("multi-host test needs root to create network namespaces")
    probe = f"mpcprobe{uuid.uuid4().hex[:6]}"
    got = _ip("netns", "add", probe, check=False)
    if got.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {got.stderr.strip()}")
    _ip("netns", "del", probe, check=False)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    _namespaces_or_skip()
    h = Hosts(["alice", "bob", "carol", "dealer"])
    try:
        h.up()
        yield h
    finally:
        h.down()




def test_a_job_runs_across_namespaced_hosts(hosts: Hosts, tmp_path: Path) -> None:
    cons = LocalConsortium(tmp_path / "c", parties=3, dataset="adult", host_of=hosts.addr.__getitem__,
                           wrap=hosts.wrap)
    with cons:
        for name, m in cons.members.items():
            assert m.host == hosts.addr[name]  # each daemon on its own host's address, nothing on loopback
        # the hosts are really apart: a namespace cannot reach another's daemon on its loopback
        alice = cons.members["alice"]
        probe = subprocess.run([*hosts.wrap("bob"), "python3", "-c",
                                f"import socket; socket.create_connection(('127.0.0.1', {alice.port}), 2)"],
                               capture_output=True, text=True, timeout=30)
        assert probe.returncode != 0
        job = tmp_path / "job.toml"
        job.write_text(job_toml(DemoJob("multihost-output", "output", lam=1e-3), cons.party_names, "adult",
                                "dealer", "dealer"))
        with cons.client() as client:
            job_id = client.submit(job)["job_id"]
            ends = {e["member"]: e for e in client.watch(job_id) if e["phase"] in ("succeeded", "failed",
                                                                                   "cancelled", "error")}
            assert {m: e["phase"] for m, e in ends.items()} == dict.fromkeys(cons.members, "succeeded"), {
                m: (e["phase"], e["payload"]) for m, e in ends.items()}
            res = client.result(job_id, tmp_path / "result")
    assert res["models_identical"]
    report = json.loads((tmp_path / "result" / "privacy_report.json").read_text())
    assert report["epsilon"] <= 1.0 and "dealer" in report["trust_model"]
    metrics = json.loads((tmp_path / "result" / "metrics.json").read_text())
    assert metrics["test"]["accuracy"] > 0.78
    # the workers' share transport listened on their own hosts too (the endpoints the daemons handed out)
    log = (tmp_path / "c" / "alice" / "daemon.log").read_text()
    assert hosts.addr["alice"] in log
