"""SIGKILL a party daemon, the dealer daemon, a job worker or the coordinator at seeded points of
output- and gradient-perturbation jobs on UCI Adult (real daemons, real TLS, real CrypTen).

For every scenario (:mod:`tests.reliability.faults` has the harness and the checks):

1. every surviving member ends the job within its deadline, failed/cancelled with a reason that
   names the lost peer or the cause (GetStatus, ListJobs and each daemon's job table agree); a job
   whose reveals had all completed may succeed; with only the coordinator killed it must succeed;
2. nothing is revealed after the kill except the one round in flight (audit logs, hash chains
   intact; a killed dealer holds no share, so rounds that need no triple may go on and the job then
   succeeds), a reveal anywhere implies every party charged its ledger first, and a member that did
   not succeed holds no result files;
3. every ledger is settled (no open reservation, nothing reserved), the job's ε charged once and
   only where the party's audit log shows it passed the reveal mark;
4. a killed daemon restarted with its config and state dir reports the job failed ("interrupted by a
   daemon restart"), its reservation settled by ``Ledger.recover``, and the same job resubmitted under
   a new id succeeds.

The default (CI) selection runs two representative scenarios; the full campaign (≥ 30) is
``reliability`` + ``slow``: ``pytest -m reliability tests/reliability/test_faults.py``. Set
``FAULTS_REPORT=path`` to append one line per scenario there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .faults import FaultConsortium, Outcome, Scenario, campaign, run_scenario, summary_line

pytestmark = [pytest.mark.reliability, pytest.mark.e2e]

CI_SCENARIOS = [
    Scenario("party_worker", "offline", "output", 101),
    Scenario("party_daemon", "between_rounds", "gradient", 102),
]


@pytest.fixture(scope="module")
def fc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultConsortium]:
    """One consortium for every scenario of the module; scenarios restart only what they killed."""
    with FaultConsortium(tmp_path_factory.mktemp("faults")) as f:
        yield f


def _record(o: Outcome) -> None:
    line = summary_line(o)
    print(line)
    path = os.environ.get("FAULTS_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")


def test_campaign_table_is_large_and_covers_every_victim_point_and_method() -> None:
    table = campaign()
    assert len(table) >= 30 and len({s.id for s in table}) == len(table)
    assert {s.victim for s in table} == {"party_daemon", "party_host", "dealer", "party_worker", "dealer_worker",
                                         "coordinator"}
    assert {s.point for s in table} == {"before_shares", "offline", "between_rounds", "reveal"}
    assert {s.method for s in table} == {"output", "gradient"}
    assert [s.plan() for s in table] == [s.plan() for s in campaign()]  # seeded: the same table every run


@pytest.mark.timeout(900)
@pytest.mark.parametrize("sc", CI_SCENARIOS, ids=lambda s: s.id)
def test_representative_fault(fc: FaultConsortium, sc: Scenario, tmp_path: Path) -> None:
    _record(run_scenario(fc, sc, tmp_path))


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("sc", campaign(), ids=lambda s: s.id)
def test_fault_campaign(fc: FaultConsortium, sc: Scenario, tmp_path: Path) -> None:
    _record(run_scenario(fc, sc, tmp_path))
