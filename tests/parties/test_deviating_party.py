"""A compute party that deviates in one message, against real daemons: bob's daemon and its job
workers run with ``tests/parties/deviating_party`` on their path and ``MPC_ERM_TEST_DEVIATE`` set.

* ``reveal-flip:1`` — one bit of bob's share of round 2's reveal flipped in the message to alice
  only. Before the parties agreed on what they revealed, every party "succeeded" with alice's
  model 10⁴ run-to-run spreads away from the others'. Now every party stops at that round with
  ``INTEGRITY``, naming who held which value (alice one, bob and carol another), and no model
  is released anywhere.
* ``setup-zero`` — bob's first point-to-point message (CrypTen's pairwise seed to carol)
  zeroed. Before, the replicated job hung in its noise phase at all three parties until
  cancelled; now every party stops before computing anything, naming bob and carol.

* ``drop:40`` — bob's 41st tensor message after the set-up check never sent (its key used up, as
  when it is lost on the way), while his worker goes on and heartbeats: in the in-MPC noise
  sampler of the first aggregate (the offline phase, before round 1), his share to carol in the
  20th of the sampler's 106 all-reduces (dealer), or the 40th of his 110 sampler messages, a
  re-sharing to carol (replicated). No job may hang: each waiting party gives up after the daemons' peer timeout,
  naming the peer it waited for, every member's job ends ``failed`` (``PEER_LOST``, nothing
  revealed), and no party writes any result.

Both trust modes (3 replicated parties; 3 parties and a dealer), a gradient job on UCI Adult with
in-MPC noise.

* ``serve-altered:1`` — bob's owner intake serves its owners round 2's release with one bit
  flipped. Before, those owners trained on it unseen. Now an owner uses a release only with every
  compute party's signature over the bytes it read: bob's owners stop with exit code 7 naming the
  release read from bob, the other owners and the compute parties finish. Six real
  ``mpc-erm owner join`` processes, 3 replicated compute parties.
* ``drop-owner:1`` — bob's intake acknowledges round 2's share of owner 1 (its first owner) and
  then claims it never came, so the compute parties leave owner 1 out of that round (it changes
  the release). Before the release's roster was signed, owner 1 could not tell; now it stops
  with exit code 8 naming bob's acknowledgement, and the others finish."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from coordinator.consortium import LocalConsortium
from coordinator.end_to_end import LocalJob, job_toml

pytestmark = [pytest.mark.e2e, pytest.mark.long]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PARTIES = ("alice", "bob", "carol")


def _run(tmp_path: Path, trust: str, schedule: str, *, peer_timeout_s: float | None = None,
         events: list[dict[str, object]] | None = None,
         malicious: bool = False) -> tuple[dict[str, dict[str, object]], float, Path]:
    """(each party's status, seconds from submit to the end, the consortium's root); ``events``
    receives every member's watched events; ``malicious``: security = "malicious" (distributed noise)."""
    path = tmp_path / "job.toml"
    job = LocalJob("deviating", "gradient", lam=1e-3, iterations=3, learning_rate=1.0, epsilon=1.0)
    dealer = "dealer" if trust == "dealer" else None
    text = job_toml(job, list(PARTIES), "adult", trust, dealer)
    if malicious:
        text = text.replace('trust = "replicated"', 'trust = "replicated"\nsecurity = "malicious"').replace(
            'accountant = "rdp"', 'accountant = "rdp"\nnoise = "distributed"')
    path.write_text(text)
    env = ["env", f"PYTHONPATH={HERE / 'deviating_party'}{os.pathsep}{ROOT}", f"MPC_ERM_TEST_DEVIATE={schedule}"] \
        if schedule else []
    with LocalConsortium(tmp_path / "c", dealer=dealer is not None, device="cpu", peer_timeout_s=peer_timeout_s,
                         wrap=lambda name: env if name == "bob" else []) as cons:
        with cons.client() as client:
            tic = time.monotonic()
            job_id = client.submit(path)["job_id"]
            watched = list(client.watch(job_id))
            took = time.monotonic() - tic
            status = {m: v for m, v in client.status(job_id).items() if m in PARTIES}
    if events is not None:
        events.extend(watched)
    return status, took, tmp_path / "c"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("trust", ["replicated", "dealer"])
def test_a_flipped_bit_in_one_reveal_message_stops_every_party_before_the_value_is_used(
        tmp_path: Path, trust: str) -> None:
    status, _took, root = _run(tmp_path, trust, "reveal-flip:1")
    assert {m: v["status"] for m, v in status.items()} == dict.fromkeys(PARTIES, "failed"), status
    for m, v in status.items():
        reason = str(v["reason"])
        assert reason.startswith("INTEGRITY: "), (m, reason)
        assert "aggregate #1" in reason and "do not hold the same value" in reason, (m, reason)
        # the views: alice alone on one value, bob and carol on another (digest prefixes only)
        assert "alice holds" in reason and "bob, carol hold " in reason, (m, reason)
    for m in PARTIES:  # nothing released: no model file anywhere
        assert not list((root / m / "state").rglob("model.safetensors")), m


@pytest.mark.timeout(600)
@pytest.mark.parametrize("trust", ["replicated", "dealer"])
def test_an_altered_setup_message_stops_every_party_before_any_computation(tmp_path: Path, trust: str) -> None:
    status, took, _root = _run(tmp_path, trust, "setup-zero")
    assert {m: v["status"] for m, v in status.items()} == dict.fromkeys(PARTIES, "failed"), status
    for m, v in status.items():
        reason = str(v["reason"])
        assert reason.startswith("INTEGRITY: ") and "bob and carol do not share their pairwise random stream" \
            in reason, (m, reason)
    assert took < 120, took  # it used to hang until cancelled


PEER_TIMEOUT_S = 10.0  # the daemons' peer_timeout_s here: every MPC message's deadline (TransportOptions.deadline_s)
DROP = 40  # bob's 41st tensor message after the set-up check: mid-way through the first aggregate's noise sampler
#: A party gives up at most this long after its sampler began: the drop comes well within the
#: sampler (a second or so), the wait it blocks ends at one peer timeout, and a party waiting on
#: one that gave up hears it at its next liveness ping (``probe_interval_s``, 1 s) and stops. Less
#: than two peer timeouts, so it is one bounded wait that ends the job, not one timeout after another.
GIVE_UP_S = 2 * PEER_TIMEOUT_S


@pytest.mark.timeout(600)
@pytest.mark.parametrize("trust", ["replicated", "dealer"])
def test_a_dropped_message_ends_the_job_at_every_member_within_the_peer_timeout(tmp_path: Path, trust: str) -> None:
    events: list[dict[str, object]] = []
    status, took, root = _run(tmp_path, trust, f"drop:{DROP}", peer_timeout_s=PEER_TIMEOUT_S, events=events)
    members = (*PARTIES, "dealer") if trust == "dealer" else PARTIES
    ended = {str(e["member"]): e for e in events if e["phase"] in ("succeeded", "failed", "cancelled", "error")}
    assert {m: e["phase"] for m, e in ended.items()} == dict.fromkeys(members, "failed"), ended
    assert {m: v["status"] for m, v in status.items()} == dict.fromkeys(PARTIES, "failed"), status
    offline = {str(e["member"]): float(e["time"]) for e in events if e["phase"] == "offline"}  # the sampler began
    assert set(offline) == set(PARTIES), events
    for m in members:
        # a party waited one peer timeout for the lost message (or for one stuck behind it), no longer
        # (1 s: the daemons stamp events as they relay them); the dealer ends once the parties are gone
        gave_up = float(ended[m]["time"]) - offline.get(m, min(offline.values()))
        assert (m == "dealer" or gave_up >= PEER_TIMEOUT_S - 1.0) and gave_up < GIVE_UP_S, (m, gave_up)
    reasons = {m: str(e["payload"]["message"]) for m, e in ended.items()}  # type: ignore[index]
    assert {m: reasons[m] for m in PARTIES} == {m: str(v["reason"]) for m, v in status.items()}, (reasons, status)
    peers = "|".join(members)
    for m, reason in reasons.items():
        # who stopped, in which phase, whom it lost, and how (the wait timed out, or the peer it waited
        # for had given up and gone); the detail (message, seq, limit) only in the member's own log
        how, budget = (("DealerJobAborted", "") if m == "dealer" else
                       ("(TransportTimeout|PeerUnavailable)", r"; budget released \(nothing was revealed\)"))
        phase = "dealing" if m == "dealer" else "offline"
        assert re.fullmatch(rf"PEER_LOST: {m} lost contact with '({peers})' during phase '{phase}' \({how}\); "
                            rf"see {m}'s log{budget}", reason), (m, reason)
        assert not re.search(r"\d{4,}|tensor", reason), (m, reason)  # no share value, no job id, no data
    # carol waited for the dropped message itself: she names bob, and the stall ended by a timeout
    assert "lost contact with 'bob'" in reasons["carol"], reasons
    assert any("(TransportTimeout)" in r for r in reasons.values()), reasons
    assert took < 120, took
    for m in members:  # nothing released: no result file of any kind, anywhere
        assert not [p for p in (root / m / "state" / "jobs").rglob("*") if p.is_file()], m
        assert not list((root / m / "state").rglob("model.safetensors")), m


OWNERS = tuple(f"owner-{i:02d}" for i in range(6))


def _owner_joins(tmp_path: Path, schedule: str) -> dict[str, tuple[int, str, str]]:
    """Six real ``owner join`` processes in a 3-round job of 3 replicated compute parties, bob's
    daemon deviating on ``schedule``: each owner's (exit code, stdout, stderr); every compute party
    must succeed."""
    from tests.parties.owner_joins import run_owner_joins
    from tests.parties.test_owner_jobs import JOB

    env = ["env", f"PYTHONPATH={HERE / 'deviating_party'}{os.pathsep}{ROOT}", f"MPC_ERM_TEST_DEVIATE={schedule}"]
    job = tmp_path / "owners.toml"
    job.write_text(JOB.format(dataset="clinics", d=30, owners=", ".join(f'"{o}"' for o in OWNERS), no_noise="false",
                              eps=1.0, n=569, rounds=3))
    with LocalConsortium(tmp_path / "cons", parties=3, dealer=False, max_epsilon_per_job=2.0,
                         wrap=lambda name: env if name == "bob" else []) as cons:
        configs = {o: cons.add_owner(o, {"clinics": {"format": "builtin", "name": "breast_cancer", "part": i,
                                                     "of": len(OWNERS), "epsilon": 10.0, "delta": 1e-4}},
                                     max_epsilon_per_job=2.0, root=tmp_path / "owners")
                   for i, o in enumerate(OWNERS)}
        _job_id, out, phases = run_owner_joins(cons, configs, job)
    assert phases == dict.fromkeys(PARTIES, "succeeded"), phases
    return out


@pytest.mark.timeout(600)
def test_owners_refuse_a_release_their_compute_party_altered(tmp_path: Path) -> None:
    from parties.owner.failures import ReleaseRefused
    from parties.owner.shares import explicit_party

    out = _owner_joins(tmp_path, "serve-altered:1")
    for i, o in enumerate(OWNERS):
        code, _stdout, stderr = out[o]
        if explicit_party(i, 3) == 1:  # reads its releases from bob
            assert code == ReleaseRefused.exit_code, (o, code, stderr[-2000:])
            assert "round 1's release read from bob lacks a valid signature of alice, bob, carol" in stderr, stderr
        else:
            assert code == 0, (o, code, stderr[-2000:])


@pytest.mark.timeout(600)
def test_an_owner_left_out_after_its_share_was_acknowledged_stops_naming_the_party(tmp_path: Path) -> None:
    from parties.owner.failures import LeftOut

    out = _owner_joins(tmp_path, "drop-owner:1")
    for i, o in enumerate(OWNERS):
        code, _stdout, stderr = out[o]
        if i == 1:  # bob's first owner
            assert code == LeftOut.exit_code, (o, code, stderr[-2000:])
            assert "round 1: bob acknowledged this owner's share, but the release every compute party signed did " \
                   "not count it" in " ".join(stderr.split()), stderr
        else:
            assert code == 0, (o, code, stderr[-2000:])


#: bob's all-gathers in the first malicious-secure aggregate: the release keys and their agreement,
#: then (in every aggregate) share hashes, coin promise, coin, proof parts, the sum's shares.
GATHERS = 7


@pytest.mark.timeout(600)
def test_a_malicious_secure_job_releases_one_model_and_a_report_that_verifies(tmp_path: Path) -> None:
    import json

    from mpc_erm.privacy.report import PrivacyReport
    from mpc_erm.privacy.statement import job_statement
    from mpc_erm.privacy.verify import verify_report

    status, _took, root = _run(tmp_path, "replicated", "", malicious=True)
    assert {m: v["status"] for m, v in status.items()} == dict.fromkeys(PARTIES, "succeeded"), status
    models = [next((root / m / "state").rglob("model.safetensors")).read_bytes() for m in PARTIES]
    assert models[0] == models[1] == models[2]
    text = next((root / "alice" / "state").rglob("privacy_report.json")).read_text()
    report = PrivacyReport.from_json(text)
    assert report.security == "malicious" and "malicious security with abort" in report.trust_model
    assert json.loads(text)["realisation"]["noise"] == "distributed"
    assert verify_report(report).ok
    assert "Security model: malicious, with abort" in job_statement(report)


def _ledger_rows(root: Path) -> dict[str, list[tuple[str, int | None]]]:
    """Each party's ledger: (state, rounds charged) of every job it holds."""
    from parties.ledger import Ledger

    out = {}
    for m in PARTIES:
        with Ledger(root / m / "state" / "ledger.sqlite3") as led:
            out[m] = [(r.state, r.revealed_rounds) for r in led.open_reservations()] + [
                (r.state, r.revealed_rounds) for r, _ev in led.charges("adult")]
    return out


@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule, words, charged", [
    # round 2's sum, every recipient alike: its shares were sent, so round 2 may be known to bob: charged
    (f"verified-flip:{GATHERS + 4}", ["aggregate #1: the sum", "bob"], 2),
    # caught before round 2 opened anything: only round 1 is charged
    (f"verified-flip:{GATHERS + 1}", ["bob opened a coin other than the one it committed to"], 1),
    ("verified-input:1", ["aggregate #1: bob's input fails its proof"], 1),
    # caught in the first round: nothing charged, the budget released
    ("verified-input:0", ["aggregate #0: bob's input fails its proof"], 0),
])
def test_a_deviation_in_a_malicious_secure_job_stops_every_party_naming_bob(tmp_path: Path, schedule: str,
                                                                             words: list[str], charged: int) -> None:
    status, _took, root = _run(tmp_path, "replicated", schedule, malicious=True)
    assert {m: v["status"] for m, v in status.items()} == dict.fromkeys(PARTIES, "failed"), status
    for m, v in status.items():
        reason = str(v["reason"])
        assert reason.startswith("INTEGRITY: "), (m, reason)
        for w in words:
            assert w in reason, (m, reason)
        assert not re.search(r"\d{5,}", reason), (m, reason)  # no share value, no data
    for m in PARTIES:  # nothing released
        assert not list((root / m / "state").rglob("model.safetensors")), m
    # every ledger charges the rounds whose sum was opened, no more: the round a check stopped is not
    want = [] if charged == 0 else [("committed", charged)]
    assert _ledger_rows(root) == dict.fromkeys(PARTIES, want)


@pytest.mark.timeout(600)
def test_an_equivocation_at_the_last_release_stops_both_honest_parties(tmp_path: Path) -> None:
    """bob signs one verdict to alice and another to carol at the job's final release (aggregate
    #2 of 3): the selective abort the digest agreement allowed (one honest party released, the
    other stopped). Both honest parties now stop, naming bob; neither writes a model. bob, the
    deviating party, holds the value it helped compute, as security with abort allows."""
    status, _took, root = _run(tmp_path, "replicated", "verdict-split:2", malicious=True)
    for m in ("alice", "carol"):
        reason = str(status[m]["reason"])
        assert status[m]["status"] == "failed" and reason.startswith("INTEGRITY: "), (m, status[m])
        assert "aggregate #2" in reason and "bob signed two different verdicts" in reason, (m, reason)
        assert not list((root / m / "state").rglob("model.safetensors")), m
    rows = _ledger_rows(root)  # the sum was opened: all three rounds are charged at the honest parties
    assert rows["alice"] == rows["carol"] == [("committed", 3)], rows
