"""parties.admission without a daemon: the decision and each refusal from the config, the job and
its plan alone, and what of a refusal the job's other members are told (the daemon's refusals over
gRPC are in tests/parties/test_daemon.py, the members' agreement in
tests/reliability/test_two_phase_admission.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from mpc_erm.jobs.jobfile import JobFile, parse_job_file
from mpc_erm.privacy.plan import PlanError, plan_job
from parties.admission import MAX_JOB_TOML_BYTES, Admitted, Refusal, Refused, admit, check_caller, check_request
from parties.config import DaemonConfig, load_dealer_config, load_party_config

PEERS = {"alice": "party", "bob": "party", "carol": "party", "dealer": "dealer"}


def config(tmp_path: Path, name: str = "alice", *, max_eps: float = 1.0, test_only: bool = False) -> DaemonConfig:
    """A config whose files exist (admission reads none of them)."""
    d = tmp_path / name
    d.mkdir(parents=True, exist_ok=True)
    for f in ("id.crt", "id.key", "ca.crt", "rows.npz"):
        (d / f).write_bytes(b"stand-in")
    dealer = PEERS[name] == "dealer"
    lines = ['listen = "127.0.0.1:0"', 'state_dir = "state"', "", "[identity]", f'name = "{name}"',
             'cert = "id.crt"', 'key = "id.key"', 'ca = "ca.crt"']
    for peer, role in PEERS.items():
        if peer != name:
            lines += ["", f"[peers.{peer}]", 'address = "127.0.0.1:1"', f'role = "{role}"']
    if not dealer:
        lines += ["", "[datasets.adult]", 'format = "npz"', 'path = "rows.npz"', "epsilon = 2.5", "delta = 1e-3"]
    lines += ["", "[policy]", 'allowed_coordinators = ["coord"]', 'allowed_methods = ["output", "gradient"]',
              f"max_epsilon_per_job = {max_eps}", "max_iterations = 50", f"allow_test_only = {str(test_only).lower()}"]
    path = d / "daemon.toml"
    path.write_text("\n".join(lines) + "\n")
    return load_dealer_config(path) if dealer else load_party_config(path)


def job(*, parties: tuple[str, ...] = ("alice", "bob", "carol"), dealer: str | None = None, method: str = "output",
        epsilon: float = 1.0, iterations: int = 10, dataset: str = "adult", test_no_noise: bool = False) -> JobFile:
    plist = ", ".join(f'"{p}"' for p in parties)
    trust = f'trust = "dealer"\ndealer = "{dealer}"' if dealer else 'trust = "replicated"'
    text = (f'method = "{method}"\n\n[job]\nname = "j"\ndataset = "{dataset}"\nparties = [{plist}]\n{trust}\n'
            + ("test_no_noise = true\n" if test_no_noise else "")
            + f"\n[privacy]\nepsilon = {epsilon}\ndelta = 1e-5\n"
            + ('accountant = "rdp"\n' if method == "gradient" else 'mechanism = "gaussian"\n')
            + f"\n[training]\niterations = {iterations}\n")
    return parse_job_file(text, source="job.toml", known_parties=set(PEERS))


def decide(cfg: DaemonConfig, jf: JobFile) -> Admitted | Refusal:
    return admit(cfg, jf, "coord", plan_job(jf.spec, sampler="mpc", test_no_noise=jf.job.test_no_noise))


def test_a_party_admits_with_what_to_reserve_and_touches_nothing(tmp_path: Path) -> None:
    cfg, jf = config(tmp_path), job()
    got = decide(cfg, jf)
    assert got == Admitted(dataset="adult", epsilon=1.0, delta=1e-5, coordinator="coord",
                           event=plan_job(jf.spec, sampler="mpc").event)
    # the same job at another ε (what a budget refusal asks): itself at its own ε, more noise below it
    assert isinstance(got, Admitted) and got.event_at is not None and got.event_at(1.0) == got.event
    assert got.event_at(0.5).noise_multiplier > got.event.noise_multiplier  # type: ignore[union-attr]
    assert not (tmp_path / "alice" / "state").exists()  # no store, no ledger, no log


def test_the_dealer_admits_its_own_jobs_and_reserves_nothing(tmp_path: Path) -> None:
    cfg = config(tmp_path, "dealer")
    got = decide(cfg, job(dealer="dealer"))
    assert isinstance(got, Admitted) and got.dataset is None
    assert decide(cfg, job()) == Refusal(grpc.StatusCode.FAILED_PRECONDITION, "job.dealer: this dealer (dealer) is "
                                         "not the job's dealer (none: trust = replicated)")


@pytest.mark.parametrize(("kw", "code", "reason"), [
    # membership first, even when the policy would refuse too
    ({"parties": ("bob", "carol"), "dealer": "dealer", "epsilon": 5.0}, grpc.StatusCode.FAILED_PRECONDITION,
     "job.parties: this party (alice) is not one of bob, carol"),
    ({"parties": ("alice", "dealer", "carol")}, grpc.StatusCode.FAILED_PRECONDITION,
     "job.parties: 'dealer' is a dealer in this daemon's peers"),
    ({"parties": ("alice", "bob"), "dealer": "carol"}, grpc.StatusCode.FAILED_PRECONDITION,
     "job.dealer: 'carol' is a party in this daemon's peers, not a dealer"),
    # the policy before the data set
    ({"epsilon": 1.5, "dataset": "claims"}, grpc.StatusCode.PERMISSION_DENIED,
     "privacy.epsilon: 1.5 exceeds alice's max_epsilon_per_job (1)"),
    ({"method": "gradient", "iterations": 51}, grpc.StatusCode.PERMISSION_DENIED,
     "training.iterations: 51 exceeds alice's max_iterations (50)"),
    ({"test_no_noise": True}, grpc.StatusCode.PERMISSION_DENIED,
     "job.test_no_noise: a zero-noise (test-only) job is refused by alice's policy (allow_test_only = false)"),
    ({"dataset": "claims"}, grpc.StatusCode.FAILED_PRECONDITION, "job.dataset: alice offers no dataset 'claims'"),
])
def test_each_refusal_names_its_field(tmp_path: Path, kw: dict[str, Any], code: grpc.StatusCode,
                                      reason: str) -> None:
    assert decide(config(tmp_path), job(**kw)) == Refusal(code, reason)


def test_a_plan_that_cannot_be_made_is_refused_after_membership(tmp_path: Path) -> None:
    err = PlanError("privacy.accountant", "cannot plan this")
    assert admit(config(tmp_path), job(), "coord", err) == Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    got = admit(config(tmp_path), job(parties=("bob", "carol"), dealer="dealer"), "coord", err)
    assert isinstance(got, Refusal) and got.reason.startswith("job.parties: ")


def test_the_request_fields_are_checked_before_the_text_is_read() -> None:
    assert check_request("job-1", "x") is None
    bad = check_request("../etc", "x")
    assert bad is not None and bad.code == grpc.StatusCode.INVALID_ARGUMENT and bad.reason.startswith("job_id: ")
    big = check_request("job-1", "x" * (MAX_JOB_TOML_BYTES + 1))
    assert big == Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"job_toml: larger than {MAX_JOB_TOML_BYTES} bytes")


def test_the_caller_is_checked_first_and_its_refusal_has_a_public_side(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert check_caller(cfg, "coord") is None
    got = check_caller(cfg, "intruder")
    assert got is not None and got.code == grpc.StatusCode.PERMISSION_DENIED
    # what the coordinator is told: the authoriser's wording for every other coordinator method
    assert got.message == "coordinator/intruder may not call /mpc_erm.v1.PartyControl/SubmitJob"
    # what the job's other members are told (two-phase admission: they end the job at once)
    assert got.public_reason("alice") == ("POLICY: refused by alice: coordinator 'intruder' is not in alice's "
                                          "policy.allowed_coordinators")


@pytest.mark.parametrize(("kw", "public"), [
    ({"epsilon": 1.5}, "POLICY: refused by alice: privacy.epsilon: 1.5 exceeds alice's max_epsilon_per_job (1)"),
    ({"dataset": "claims"}, "JOB_SPEC: refused by alice: job.dataset: alice offers no dataset 'claims'"),
    ({"parties": ("bob", "carol"), "dealer": "dealer"},
     "JOB_SPEC: refused by alice: job.parties: this party (alice) is not one of bob, carol"),
])
def test_an_admission_refusal_is_public_as_it_is(tmp_path: Path, kw: dict[str, Any], public: str) -> None:
    """admit's reasons name job-file fields and the member's policy: the other members hear them
    with the code that goes with the status."""
    got = decide(config(tmp_path), job(**kw))
    assert isinstance(got, Refusal)
    assert Refused.of(got).public_reason("alice") == public


def test_a_refusal_can_keep_its_detail_from_the_other_members() -> None:
    exc = Refused(grpc.StatusCode.FAILED_PRECONDITION, "privacy budget of alice: spent ε=2.1 of 2.5 …",
                  public_code="BUDGET", public="alice's privacy budget for data set 'adult' has no room for the job")
    assert exc.message.startswith("privacy budget of alice: spent")  # the coordinator's answer
    assert exc.public_reason("alice") == ("BUDGET: refused by alice: alice's privacy budget for data set 'adult' has "
                                          "no room for the job")
    assert len(Refused(grpc.StatusCode.INVALID_ARGUMENT, "x" * 2000).public_reason("alice")) == 500
