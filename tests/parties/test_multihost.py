"""Multi-host: each party and the dealer in its own network namespace with its own address.

A Linux bridge in the test's namespace joins one veth per host (10.77.<k>.0/24); every daemon
listens only on its own host's address, so every byte between members — control plane, endpoint
look-ups, shares, triples — crosses the bridge. The coordinator stays outside (on the bridge's own
address). Skipped, with the reason, only where namespaces cannot be created (not root, no
iproute2, or a sandbox without CAP_NET_ADMIN).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from coordinator.consortium import LocalConsortium
from coordinator.end_to_end import LocalJob, job_toml
from tests.netns import Hosts, namespaces_or_skip

pytestmark = pytest.mark.e2e


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    namespaces_or_skip()
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
        job.write_text(job_toml(LocalJob("multihost-output", "output", lam=1e-3), cons.party_names, "adult",
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
