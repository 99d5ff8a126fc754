"""Network faults between namespaced hosts (issue 6): slow and lossy links only slow a job down; a
partition makes every member end the job within its peer timeout, naming the lost peer, with
nothing revealed and every reservation released; after healing, the same job succeeds.

alice, bob, carol and the dealer each run in their own network namespace on a bridge
(:mod:`tests.netns`), an output-perturbation job on UCI Adult (the demo's), daemons with
``peer_timeout_s = 30``. Faults are applied to carol's host: a ``tbf`` rate limit (this kernel has
no ``netem``: delay comes from queueing), iptables random drop, and iptables DROP both ways.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.consortium import LocalConsortium
from coordinator.end_to_end import LocalJob, job_toml
from mpc_erm.jobs.status import TERMINAL
from parties.ledger import LEDGER_FILE, Ledger
from tests.netns import Hosts, iptables_or_skip, namespaces_or_skip

# ~60 s on 2 cores (netem links, a partition, a resubmit): a long campaign that CI runs after `make test`
pytestmark = [pytest.mark.reliability, pytest.mark.e2e, pytest.mark.long]

PEER_TIMEOUT_S = 30.0
VICTIM = "carol"


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Hosts, LocalConsortium, Path]]:
    namespaces_or_skip()
    iptables_or_skip()
    hosts = Hosts(["alice", "bob", "carol", "dealer"])
    root = tmp_path_factory.mktemp("netfaults")
    try:
        hosts.up()
        cons = LocalConsortium(root / "c", parties=3, dataset="adult", host_of=hosts.addr.__getitem__,
                               wrap=hosts.wrap, peer_timeout_s=PEER_TIMEOUT_S, budget_epsilon=20.0)
        with cons:
            job = root / "job.toml"
            job.write_text(job_toml(LocalJob("netfault-output", "output", lam=1e-3), cons.party_names, "adult",
                                    "dealer", "dealer"))
            yield hosts, cons, job
    finally:
        hosts.down()


def _wait_terminal(cons: LocalConsortium, job_id: str, members: list[str], limit_s: float) -> dict[str, Any]:
    """Poll each member's status (short RPC timeouts: a partitioned member just reads unreachable)."""
    deadline = time.monotonic() + limit_s
    with cons.client() as client:
        client.timeout_s = 5.0
        while True:
            st = client.status(job_id)
            if all(st.get(m, {}).get("status") in TERMINAL for m in members):
                return st
            if time.monotonic() > deadline:
                return st
            time.sleep(1.0)


def _run_job(cons: LocalConsortium, job: Path, limit_s: float = 600) -> tuple[str, dict[str, Any], float]:
    t0 = time.monotonic()
    with cons.client() as client:
        job_id = client.submit(job)["job_id"]
    st = _wait_terminal(cons, job_id, list(cons.members), limit_s)
    return job_id, st, time.monotonic() - t0


def _ledger(cons: LocalConsortium, name: str) -> Ledger:
    return Ledger(cons.root / name / "state" / LEDGER_FILE)


def _released_everywhere(cons: LocalConsortium, job_id: str) -> None:
    for name in cons.party_names:
        with _ledger(cons, name) as led:
            rec = led.get(job_id)
            assert rec is not None and rec.state == "released", (name, rec)


def _no_release_in_audit(cons: LocalConsortium, job_id: str) -> None:
    for name in cons.party_names:
        audit = cons.root / name / "state" / "audit.jsonl"
        lines = [json.loads(x) for x in audit.read_text().splitlines()] if audit.exists() else []
        assert not [x for x in lines if x.get("job_id") == job_id and x.get("event") == "release"], name


@pytest.mark.slow
def test_slow_and_lossy_links_only_slow_the_job_down(net: tuple[Hosts, LocalConsortium, Path]) -> None:
    hosts, cons, job = net
    _run_job(cons, job)  # warm-up: the first job pays for cold caches
    _, st, base = _run_job(cons, job)
    assert {m: v["status"] for m, v in st.items()} == dict.fromkeys(cons.members, "succeeded"), st
    walls = {"clean": base}
    for fault, apply in (("8 Mbit/s", lambda: hosts.slow(VICTIM, "8mbit")),
                         ("5 % loss", lambda: hosts.lossy(VICTIM, 0.05))):
        apply()
        try:
            _, st, wall = _run_job(cons, job)
        finally:
            hosts.heal(VICTIM)
        assert {m: v["status"] for m, v in st.items()} == dict.fromkeys(cons.members, "succeeded"), (fault, st)
        walls[fault] = wall
    print("network faults, job wall seconds:", json.dumps({k: round(v, 1) for k, v in walls.items()}))


def test_partition_mid_job_fails_everyone_in_time_reveals_nothing_then_resubmit_succeeds(
        net: tuple[Hosts, LocalConsortium, Path]) -> None:
    hosts, cons, job = net
    survivors = [m for m in cons.members if m != VICTIM]
    with cons.client() as client:
        job_id = client.submit(job)["job_id"]
        for ev in client.watch(job_id, members=["alice"]):
            if ev["phase"] in ("agreed", "local") or ev["phase"] in TERMINAL:
                break  # shares are moving: the offline noise runs now
    assert ev["phase"] not in TERMINAL, ev
    hosts.partition(VICTIM)
    cut = time.monotonic()
    try:
        # every survivor ends within its peer timeout (+ worker start/stop and polling slack)
        st = _wait_terminal(cons, job_id, survivors, PEER_TIMEOUT_S + 90)
        took = time.monotonic() - cut
        for m in survivors:
            assert st[m]["status"] == "failed", (m, st[m])
        named = [m for m in survivors if VICTIM in (st[m].get("reason") or "")]
        assert named, {m: st[m].get("reason") for m in survivors}
        assert took <= PEER_TIMEOUT_S + 90, took
    finally:
        hosts.heal(VICTIM)
    # carol, cut off, gives up on her peers too
    st = _wait_terminal(cons, job_id, list(cons.members), PEER_TIMEOUT_S + 90)
    assert {m: v["status"] for m, v in st.items()} == dict.fromkeys(cons.members, "failed"), st
    _released_everywhere(cons, job_id)
    _no_release_in_audit(cons, job_id)
    for name in cons.party_names:
        d = cons.root / name / "state" / "jobs" / job_id
        assert not list(d.glob("model*")) and not (d / "privacy_report.json").exists(), name
    print(f"partition: survivors failed {took:.1f} s after the cut; reasons:",
          {m: st[m].get("reason") for m in cons.members})
    # healed: the same job, resubmitted, succeeds
    _, st, _ = _run_job(cons, job)
    assert {m: v["status"] for m, v in st.items()} == dict.fromkeys(cons.members, "succeeded"), st
