"""Two-phase admission (issue 14 items 3 and 4): a job starts nowhere until every member has
prepared it, one refusal ends it everywhere at once, and competing admissions are ordered by job id.

Real daemons (``coordinator.consortium.LocalConsortium``: ``mpc-erm party serve`` x 3 +
``mpc-erm dealer serve``, mTLS, UCI Adult), the coordinator's client and CLI:

- item 3 (default suite, no job runs: ~15 s): alice's ``policy.allowed_coordinators`` does not name
  the coordinator, bob's and carol's do. ``mpc-erm job submit`` prints each member's answer (alice
  refused, naming the reason; the others prepared) and exits 1; within a few seconds (measured;
  ``peer_timeout_s`` is 120 s) bob, carol and the dealer end the job ``refused`` with a reason that
  names alice and its public reason, without any cancel from the coordinator; no member started a
  worker (no ``running`` event, no worker process in any daemon's log); every ledger row of the
  job is released and every party's budget is as before; ``mpc-erm job list`` says refused by
  alice (with alice's public reason), not cancelled. On the code before the change, bob, carol
  and the dealer started workers, reserved ε, and the job showed as cancelled (the coordinator's
  clean-up).
- item 4 (``slow``, 4 repetitions of a real output job on Adult): two coordinator clients submit the
  same job (different job ids) at the same instant on a data set whose budget fits one: exactly one
  succeeds at every member each time, the other is refused (``SubmitRefused``), ends ``refused``
  with a public BUDGET reason wherever it was prepared, runs nowhere, and holds no budget. On the
  code before the change both usually failed (each party reserved a different job first).
- item 4 with every arrival order forced (default suite, in-process daemons and the stand-in
  worker of tests/parties/test_daemon.py: ~10 s): X < Y reach the three parties in each of the 8
  orders; exactly one succeeds, and it is X unless Y reached every party first.
- a coordinator that dies after submitting to bob, carol and the dealer but not alice (same
  in-process daemons, ~12 s): they end the job ``PEER_LOST`` naming alice once alice has not
  heard of it for ``UNKNOWN_GRACE_S`` (10 s), far below ``peer_timeout_s``; nothing started.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from coordinator.consortium import LocalConsortium
from coordinator.end_to_end import LocalJob, job_toml
from mpc_erm.jobs.status import TERMINAL
from parties.job_store import JobStore
from parties.ledger import Ledger
from tests.reliability.faults import wait_for, worker_pids

pytestmark = pytest.mark.reliability
PARTIES = ("alice", "bob", "carol")
DEALER = "dealer"
MEMBERS = (*PARTIES, DEALER)
PEER_TIMEOUT_S = 120.0  # the daemons' default peer_timeout_s: what a refused job used to hold budget for
REFUSAL_LIMIT_S = 10.0  # "at once": every member must end a refused job well within this


def _state(cons: LocalConsortium, name: str) -> Path:
    return cons.root / name / "state"


def _budgets(cons: LocalConsortium) -> dict[str, list[tuple[str, float, float]]]:
    out = {}
    for p in PARTIES:
        with Ledger(_state(cons, p) / "ledger.sqlite3") as led:
            out[p] = [(b.dataset, round(b.epsilon_spent, 12), round(b.epsilon_reserved, 12)) for b in led.show()]
    return out


def _events(cons: LocalConsortium, name: str, job_id: str) -> list[str]:
    with JobStore.in_state_dir(_state(cons, name)) as store:
        return [e.phase for e in store.events(job_id)]


def _ended(client: Any, job_id: str, members: tuple[str, ...]) -> dict[str, dict[str, Any]] | None:
    st = client.status(job_id)
    return st if all(st.get(m, {}).get("status") in TERMINAL for m in members) else None


def _nothing_started(cons: LocalConsortium, job_id: str) -> None:
    for m in MEMBERS:
        assert "running" not in _events(cons, m, job_id), (m, _events(cons, m, job_id))
        assert worker_pids(_state(cons, m), job_id) == [], m
        log = (_state(cons, m) / "daemon.log").read_text(errors="replace")
        assert not [x for x in log.splitlines() if job_id in x and "starting worker" in x], m


# --------------------------------------------------------------------------- item 3


@pytest.fixture(scope="module")
def alice_refuses(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    cons = LocalConsortium(tmp_path_factory.mktemp("refusing") / "c", parties=3, dataset="adult", budget_epsilon=3.0,
                           device="cpu")
    cons.write()
    cfg = cons.members["alice"].config
    text = cfg.read_text()
    assert 'allowed_coordinators = ["coordinator"]' in text
    cfg.write_text(text.replace('allowed_coordinators = ["coordinator"]',
                                'allowed_coordinators = ["another-coordinator"]'))
    cons.start()
    try:
        yield cons
    finally:
        cons.stop()


def test_a_job_one_member_refuses_ends_everywhere_at_once_and_starts_nowhere(alice_refuses: LocalConsortium) -> None:
    from coordinator.cli import cli

    cons = alice_refuses
    job = cons.root / "job.toml"
    job.write_text(job_toml(LocalJob("refused-by-alice", "output", lam=1e-3), list(PARTIES), "adult", "dealer",
                            DEALER))
    before = _budgets(cons)
    t0 = time.time()
    out = CliRunner().invoke(cli, ["job", "submit", str(job), "--config", str(cons.coordinator_config)])
    assert out.exit_code == 1, out.output
    first, *rows = out.output.splitlines()
    m = re.fullmatch(r"job ([0-9a-f]{32}) refused by alice; it starts nowhere", first)
    assert m, out.output
    job_id = m[1]
    answers = {r.split()[0]: r.split(None, 2)[1:] for r in rows}
    assert answers["alice"] == ["refused", "coordinator/coordinator may not call /mpc_erm.v1.PartyControl/SubmitJob"]
    assert all(answers[x] == ["prepared"] for x in ("bob", "carol", "dealer")), out.output

    with cons.client() as client:
        st = wait_for(lambda: _ended(client, job_id, ("bob", "carol", "dealer")), REFUSAL_LIMIT_S,
                      "bob, carol and the dealer to end the refused job", every=0.05)
        seen = time.time()
        refusal = st.pop("alice")  # alice answers this coordinator nothing at all
        assert "coordinator/coordinator may not call /mpc_erm.v1.PartyControl/GetStatus" in refusal["reason"], refusal
        listed = next(j for j in client.list() if j["job_id"] == job_id)
    took = max(v["ended_at"] for v in st.values()) - t0
    held = {name: v["ended_at"] - v["created_at"] for name, v in st.items()}  # prepared → ended, at each member
    print(f"\nitem 3: refused by alice; bob, carol and the dealer ended the job {took:.2f} s after the submit "
          f"(seen by the client after {seen - t0:.2f} s; each held it prepared for "
          + ", ".join(f"{n} {h:.3f} s" for n, h in held.items()) + f"; peer_timeout_s = {PEER_TIMEOUT_S:g} s)")
    assert took < REFUSAL_LIMIT_S and max(held.values()) < 2.0, (took, held)
    for name, v in st.items():
        assert v["status"] == "refused", (name, v)
        assert v["reason"].startswith("POLICY: refused by alice: coordinator 'coordinator' is not in alice's "
                                      "policy.allowed_coordinators"), (name, v["reason"])
        assert "cancelled" not in v["reason"], v["reason"]
    # nobody started a worker, nobody holds budget for it
    _nothing_started(cons, job_id)
    for p in PARTIES:
        with Ledger(_state(cons, p) / "ledger.sqlite3") as led:
            row = led.get(job_id)
            assert (row is None) if p == "alice" else (row is not None and row.state == "released"), (p, row)
            assert not led.open_reservations()
    assert _budgets(cons) == before
    # the coordinator's list calls it refused, naming alice (it used to show cancelled: the client's clean-up;
    # then failed, which did not say that a member had refused it)
    assert listed["status"] == "refused" and set(listed["members"].values()) == {"refused"}, listed
    assert listed["refused_by"]["member"] == "alice" and listed["refused_by"]["code"] == "POLICY", listed
    out = CliRunner().invoke(cli, ["job", "list", "--config", str(cons.coordinator_config)])
    line = next(x for x in out.output.splitlines() if job_id in x)
    assert " refused " in line and " by alice (POLICY: coordinator 'coordinator' is not in alice's" in line, line
    assert "cancelled" not in line, line


# --------------------------------------------------------------------------- item 4, real jobs


def _budget_for_one(job_text: str, delta: float) -> tuple[float, float, float]:
    """(ε of one such job, of two, a budget between them) by the ledger's own composition."""
    from mpc_erm.jobs.jobfile import parse_job_file
    from mpc_erm.privacy.events import compose
    from mpc_erm.privacy.plan import plan_job

    jf = parse_job_file(job_text, source="job.toml", known_parties=set(MEMBERS))
    ev = plan_job(jf.spec, sampler="mpc").event
    one, two = compose([ev], delta, "replace").epsilon, compose([ev, ev], delta, "replace").epsilon
    return one, two, (one + two) / 2


@pytest.mark.slow
def test_two_identical_submissions_at_once_exactly_one_succeeds(tmp_path: Path) -> None:
    from coordinator.client import SubmitRefused

    reps, delta = 4, 1e-4
    probe = job_toml(LocalJob("twin", "output", lam=1e-3), list(PARTIES), "adult", "dealer", DEALER)
    one, two, budget = _budget_for_one(probe, delta)
    scratch = [f"adult-r{k}" for k in range(reps)]
    cons = LocalConsortium(tmp_path / "c", parties=3, dataset="adult", budget_epsilon=budget, budget_delta=delta,
                           device="cpu", scratch_datasets=scratch)
    cons.start()
    clients = [cons.client(), cons.client()]  # two coordinators' connections
    summary = []
    try:
        for rep, ds in enumerate(scratch):
            path = tmp_path / f"twin-{rep}.toml"
            path.write_text(job_toml(LocalJob(f"twin-{rep}", "output", lam=1e-3), list(PARTIES), ds, "dealer",
                                     DEALER))
            barrier = threading.Barrier(2)
            got: list[Any] = [None, None]

            def submit(k: int, path: Path = path, barrier: threading.Barrier = barrier, got: list[Any] = got) -> None:
                barrier.wait(30)
                t = time.monotonic()
                try:
                    got[k] = ("ok", clients[k].submit(path)["job_id"], time.monotonic() - t)
                except SubmitRefused as exc:
                    got[k] = ("refused", exc, time.monotonic() - t)

            threads = [threading.Thread(target=submit, args=(k,)) for k in (0, 1)]
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            kinds = sorted(g[0] for g in got)
            assert kinds == ["ok", "refused"], f"rep {rep}: {got}"
            (_, winner, _), (_, loss, _) = sorted(got, key=lambda g: g[0] != "ok")
            loser = loss.job_id
            with cons.client() as c:
                st_loser = wait_for(lambda c=c, loser=loser: _ended(c, loser, tuple(c.status(loser))), REFUSAL_LIMIT_S,
                                    f"rep {rep}: the refused job to end where it was prepared", every=0.05)
                loser_s = time.monotonic() - t0
                st_winner = wait_for(lambda c=c, winner=winner: _ended(c, winner, MEMBERS), 300,
                                     f"rep {rep}: the admitted job to end")
            assert {m: v["status"] for m, v in st_winner.items()} == dict.fromkeys(MEMBERS, "succeeded"), st_winner
            refusers = set(loss.refusals)
            assert refusers and refusers <= set(PARTIES), loss.refusals
            for m, why in loss.refusals.items():
                assert "privacy budget of" in why, (m, why)
            for m, v in st_loser.items():  # where the loser was prepared, it ended failed naming who refused
                assert v["status"] == "refused" and v["reason"].startswith("BUDGET: refused by "), (m, v)
                assert re.match(r"BUDGET: refused by (alice|bob|carol): \1's privacy budget for data set", v["reason"])
                assert not re.search(r"ε=|\d\.\d{3}", v["reason"]), v["reason"]  # no budget figures cross
            _nothing_started(cons, loser)
            for p in PARTIES:
                with Ledger(_state(cons, p) / "ledger.sqlite3") as led:
                    row = led.get(loser)
                    assert row is None or row.state == "released", (p, row)
                    assert led.get(winner).state == "committed"
                    assert not led.open_reservations()
            summary.append({"rep": rep, "winner": winner[:8], "loser": loser[:8], "smaller_won": winner < loser,
                            "refused_by": sorted(refusers), "loser_ended_s": round(loser_s, 2)})
    finally:
        for c in clients:
            c.close()
        cons.stop()
    print("\nitem 4: one/two jobs compose to ε =", round(one, 4), round(two, 4), "budget", round(budget, 4))
    print("\n".join(json.dumps(s) for s in summary))


# --------------------------------------------------------------------------- item 4, every order, fast


@pytest.fixture
def stand_in_consortium(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """alice, bob, carol and the dealer as in-process daemons with the stand-in worker of
    tests/parties/test_daemon.py; data sets ``o0`` … ``o7`` (one per arrival order), each of whose
    budgets (δ = 1e-3) holds one ε = 1 job, not two."""
    from mpc_erm.mpc import pki
    from parties.config import load_dealer_config, load_party_config
    from parties.daemon import PartyDaemon
    from tests.parties.test_daemon import FAKE, free_port, stub, write_config

    pki_dir = tmp_path / "pki"
    ca = pki.create_ca("test CA")
    for name, role in [("alice", "party"), ("bob", "party"), ("carol", "party"), ("dealer", "dealer"),
                       ("coord", "coordinator")]:
        pki.save_identity(pki.issue_identity(ca, name, role), pki_dir)  # type: ignore[arg-type]
    ports = {n: free_port() for n in MEMBERS}
    peers = {n: (f"127.0.0.1:{ports[n]}", "dealer" if n == DEALER else "party") for n in MEMBERS}
    daemons = {}
    try:
        for n in MEMBERS:
            path = write_config(tmp_path, pki_dir, n, listen=f"127.0.0.1:{ports[n]}", peers=peers, budget=1.0,
                                dealer=n == DEALER)
            if n != DEALER:
                text = path.read_text()
                more = "".join(f'[datasets.o{k}]\nformat = "npz"\npath = "rows.npz"\nepsilon = 1.0\ndelta = 1e-3\n\n'
                               for k in range(8))
                path.write_text(text.replace("[policy]", more + "[policy]"))
            cfg = load_dealer_config(path) if n == DEALER else load_party_config(path)
            daemons[n] = PartyDaemon(cfg, worker_module=FAKE, cancel_grace_s=1.0, log_to_stderr=False)
            daemons[n].start()
        yield {"daemons": daemons, "stubs": {n: stub(pki_dir, ports[n], server=n) for n in MEMBERS}}
    finally:
        for d in daemons.values():
            d.stop()


def test_competing_admissions_in_every_arrival_order_admit_exactly_one(stand_in_consortium: dict[str, Any]) -> None:
    import grpc

    from mpc_erm.mpc._proto import party_pb2 as pb
    from tests.parties.test_daemon import job_toml as fake_job

    daemons, stubs = stand_in_consortium["daemons"], stand_in_consortium["stubs"]
    for k, order in enumerate(itertools.product((0, 1), repeat=len(PARTIES))):
        text = fake_job("ok", trust="dealer", dealer=DEALER, epsilon=1.0, dataset=f"o{k}")
        x, y = f"{k}a-x", f"{k}b-y"  # x < y
        answers: dict[tuple[str, str], str] = {}

        def submit_both(member: str, first: str, second: str, answers: dict[tuple[str, str], str] = answers,
                        text: str = text) -> None:
            for job_id in (first, second):
                try:
                    stubs[member].SubmitJob(pb.SubmitRequest(job_id=job_id, job_toml=text), timeout=60)
                    answers[(member, job_id)] = "prepared"
                except grpc.RpcError as exc:
                    answers[(member, job_id)] = f"{exc.code().name}: {exc.details()}"
                if job_id == first:
                    time.sleep(0.2)  # the first is prepared (or waiting) before the second arrives

        firsts = {p: (y, x) if o else (x, y) for p, o in zip(PARTIES, order)}
        firsts[DEALER] = (x, y)
        threads = [threading.Thread(target=submit_both, args=(m, *firsts[m])) for m in MEMBERS]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        def ended(job_id: str) -> dict[str, str] | None:
            got = {}
            for m in MEMBERS:
                rec = daemons[m].store.get(job_id)
                if rec is not None and not rec.terminal:
                    return None
                got[m] = "-" if rec is None else rec.status
            return got

        ends = {j: wait_for(lambda j=j: ended(j), 60, f"order {order}: {j} to end") for j in (x, y)}
        won = [j for j in (x, y) if set(ends[j].values()) == {"succeeded"}]
        want = y if all(order) else x  # y wins only where it reached every party first
        assert won == [want], (order, ends, answers)
        lost = y if want == x else x
        assert "succeeded" not in ends[lost].values() and "running" not in ends[lost].values(), (order, ends)
        for m in MEMBERS:
            rec = daemons[m].store.get(lost)
            if rec is not None:
                assert rec.status == "refused" and rec.reason.startswith("BUDGET: refused by "), (order, m,
                                                                                                   rec.reason)
                assert "running" not in [e.phase for e in daemons[m].store.events(lost)], (order, m)
        for p in PARTIES:
            row = daemons[p].ledger.get(lost)
            assert row is None or row.state == "released", (order, p, row)
            assert daemons[p].ledger.get(want).state == "committed"
            assert not daemons[p].ledger.open_reservations(), (order, p)


def test_a_member_that_never_hears_of_the_job_ends_it_everywhere_after_the_grace(
        stand_in_consortium: dict[str, Any]) -> None:
    from mpc_erm.mpc._proto import party_pb2 as pb
    from parties.agreement import UNKNOWN_GRACE_S
    from tests.parties.test_daemon import job_toml as fake_job

    daemons, stubs = stand_in_consortium["daemons"], stand_in_consortium["stubs"]
    text = fake_job("ok", trust="dealer", dealer=DEALER, epsilon=1.0, dataset="o0")
    t0 = time.time()
    for m in ("bob", "carol", DEALER):  # the coordinator dies before it reaches alice
        assert stubs[m].SubmitJob(pb.SubmitRequest(job_id="orphan", job_toml=text), timeout=60).status == "prepared"

    def ended() -> dict[str, Any] | None:
        recs = {m: daemons[m].store.get("orphan") for m in ("bob", "carol", DEALER)}
        return recs if all(r is not None and r.terminal for r in recs.values()) else None

    recs = wait_for(ended, UNKNOWN_GRACE_S + 10, "the members to give the job up")
    took = max(r.ended_at for r in recs.values()) - t0
    print(f"\nnever submitted to alice: bob, carol and the dealer ended the job {took:.2f} s after the submit "
          f"(grace {UNKNOWN_GRACE_S:g} s; peer_timeout_s {daemons['bob'].config.peer_timeout_s:g} s)")
    assert UNKNOWN_GRACE_S <= took < UNKNOWN_GRACE_S + 5, took
    for m, r in recs.items():
        assert r.status == "failed" and r.reason.startswith("PEER_LOST: alice had not heard of the job"), (m, r.reason)
        assert "running" not in [e.phase for e in daemons[m].store.events("orphan")], m
    assert daemons["alice"].store.get("orphan") is None
    for p in ("bob", "carol"):
        assert daemons[p].ledger.get("orphan").state == "released" and not daemons[p].ledger.open_reservations()
