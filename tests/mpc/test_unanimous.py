"""The unanimous end of a release (mpc_erm.mpc.unanimous) between three real party processes over
gRPC + mutual TLS, with one party (bob) deviating in its signed verdict or relay: both honest
parties (alice, carol) release, or both stop, whatever bob sends or withholds. The digest
agreement alone (agree_on), as a control, lets the same deviation stop alice while carol releases."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

from tests.mpc.test_mpc_aggregator import run_job

DEADLINE_S = 3.0  # every message's deadline here: a withheld verdict costs the others one or two of these
# A withheld message leaves bob's message numbers to alice one behind for the rest of the session,
# and alice one deadline late (the product's job would stop at its next exchange): that case is last.
CASES = ("honest", "bob equivocates", "bob relays a forged verdict", "alice and carol hold different values",
         "bob sends garbled verdicts", "control: agree_on, one wrong digest", "bob withholds its verdict from alice")


def _party(rank: int, table: Any, identity: Any, server: Any) -> dict[str, Any]:
    from mpc_erm.mpc import unanimous as U
    from mpc_erm.mpc.agreement import IntegrityError, agree_on
    from mpc_erm.mpc.communicator import init_crypten, uninit_crypten
    from mpc_erm.mpc.transport import TransportOptions

    comm = init_crypten(table, identity.name, identity, server=server,
                        options=TransportOptions(deadline_s=DEADLINE_S))
    bob = rank == 1
    out: dict[str, Any] = {}
    try:
        release = U.UnanimousRelease(b"job-unanimous")
        release.setup(comm)
        for case in CASES:
            value = torch.arange(8, dtype=torch.long)
            if rank == 2 and "different values" in case:
                value = value + 1
            what = f"release {CASES.index(case)}"
            restore: list[tuple[Any, str, Any]] = []

            def patch(name: str, new: Any, restore: list = restore) -> None:
                restore.append((release, name, getattr(release, name)))
                setattr(release, name, new)

            if bob and case == "bob equivocates":
                honest = release.verdict_for

                def verdict_for(dst: int, what: str, me: int, digest: bytes, honest: Any = honest) -> bytes:
                    return honest(dst, what, me, bytes(32) if dst == 0 else digest)  # signed, another digest
                patch("verdict_for", verdict_for)
            elif bob and ("withholds" in case or "garbled" in case):
                post = release._post

                def _post(ep: Any, dst: int, op: str, payload: bytes, deadline: float, post: Any = post,
                          garbled: bool = "garbled" in case) -> Any:
                    if op.startswith("unanimous verdict") and garbled:
                        return post(ep, dst, op, payload[:-1], deadline)  # one byte short: no verdict
                    if op.startswith("unanimous verdict") and dst == 0:
                        return None  # never sent
                    return post(ep, dst, op, payload, deadline)
                patch("_post", _post)
            elif bob and "forged" in case:
                post = release._post

                def _post(ep: Any, dst: int, op: str, payload: bytes, deadline: float, post: Any = post) -> Any:
                    if op.startswith("unanimous relay"):  # "carol said 0…" to alice, under no valid signature
                        payload = bytes([1, 2]) + bytes(32) + bytes(128)
                    return post(ep, dst, op, payload, deadline)
                patch("_post", _post)
            tic = time.monotonic()
            try:
                if case.startswith("control"):  # the old end: one digest exchange, bob's to alice altered
                    agree_on(_OneWrong(comm) if bob else comm, what, value)
                else:
                    release.decide(comm, what, value)
                out[case] = ("released", time.monotonic() - tic)
            except IntegrityError as exc:
                out[case] = ("stopped", str(exc))
            finally:
                for obj, name, old in reversed(restore):
                    setattr(obj, name, old)
    finally:
        uninit_crypten()
    return out


class _OneWrong:
    """bob's communicator in the control: its digest reaches alice altered, carol intact."""

    def __init__(self, comm: Any) -> None:
        self._comm = comm

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def all_gather(self, tensor: torch.Tensor) -> Any:
        from mpc_erm.mpc.communicator import TENSOR

        ep, me = self._comm.endpoint, self._comm.get_rank()
        deadline = ep.deadline()
        wrong = tensor.clone()
        wrong.view(torch.uint8)[0] ^= 1
        sends = [ep.post(0, "all_gather", wrong, kind=TENSOR, deadline=deadline),
                 ep.post(2, "all_gather", tensor, kind=TENSOR, deadline=deadline)]
        got = {r: ep.tensor_of(ep.collect(ep.expect(r, "all_gather", TENSOR), deadline)) for r in (0, 2)}
        ep.wait_all(sends, deadline)
        assert me == 1
        return [got[0], tensor, got[2]]


@pytest.fixture(scope="module")
def reports() -> dict[int, dict[str, Any]]:
    return run_job(_party, 3, timeout=240.0)


def _honest(reports: dict[int, dict[str, Any]], case: str) -> tuple[tuple, tuple]:
    return reports[0][case], reports[2][case]


@pytest.mark.parametrize("case", ["honest", "bob withholds its verdict from alice", "bob relays a forged verdict"])
def test_both_honest_parties_release_when_bobs_deviation_changes_nothing(reports: dict[int, dict[str, Any]],
                                                                         case: str) -> None:
    alice, carol = _honest(reports, case)
    assert alice[0] == carol[0] == "released", (alice, carol)


def test_a_withheld_verdict_reaches_alice_through_carols_relay(reports: dict[int, dict[str, Any]]) -> None:
    alice, _carol = _honest(reports, "bob withholds its verdict from alice")
    assert alice == ("released", alice[1]) and alice[1] >= DEADLINE_S * 0.9  # it waited for bob, then relayed


@pytest.mark.parametrize("case, words", [
    ("bob equivocates", "bob signed two different verdicts"),
    ("bob sends garbled verdicts", "no verdict of bob reached this party"),
    ("alice and carol hold different values", "signed another value than this party holds"),
])
def test_both_honest_parties_stop_naming_the_cause(reports: dict[int, dict[str, Any]], case: str, words: str) -> None:
    alice, carol = _honest(reports, case)
    for who, got in (("alice", alice), ("carol", carol)):
        assert got[0] == "stopped" and words in got[1] and "nothing is released" in got[1], (who, got)


def test_control_the_digest_agreement_alone_aborts_selectively(reports: dict[int, dict[str, Any]]) -> None:
    alice, carol = _honest(reports, "control: agree_on, one wrong digest")
    assert alice[0] == "stopped" and carol[0] == "released", (alice, carol)
