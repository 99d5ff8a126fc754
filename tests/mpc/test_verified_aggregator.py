"""The malicious-secure noisy sum (mpc_erm.mpc.verified_aggregator) between three real party
processes over gRPC + mutual TLS: exact when the noise is zero, the same release at every party,
and every deviation of one party (bob) in what it sends stopped at every party, naming bob, before
anything is revealed."""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import pytest
import torch

from tests.mpc.forgery import forge
from tests.mpc.test_mpc_aggregator import run_job

DIM = 300
BOUND = 10.0  # each party's public ℓ2 bound, real units
NOISE = dict(mechanism="gaussian", scale=2.0, grid_bits=16)
CASES = ("honest, zero noise", "honest, real noise", "bob's input over its bound, proof forged",
         "bob deals carol another copy", "bob misreports a proof part", "bob misreports its share of the sum",
         "bob opens another coin", "honest again")


def _contribution(rank: int, scale: float = 0.9) -> torch.Tensor:
    g = torch.Generator().manual_seed(17 + rank)
    v = torch.randn(DIM, generator=g, dtype=torch.float64)
    return (v * (scale * BOUND / float(v.norm()))).reshape(1, -1)


def _party(rank: int, table: Any, identity: Any, server: Any) -> dict[str, Any]:
    import mpc_erm.mpc.verified_aggregator as V
    from mpc_erm.mpc.communicator import init_crypten, uninit_crypten
    from mpc_erm.mpc.local_noise import DistributedNoise
    from mpc_erm.mpc.replicated_open import shares_of
    from mpc_erm.mpc.transport import TransportOptions
    from mpc_erm.protocols.aggregation import NoiseSpec

    class Silent(DistributedNoise):
        """Zero noise with the real plan (grid, bound): the exactness cases only."""

        def take(self, p: int, spec: NoiseSpec) -> torch.Tensor:
            super().take(p, spec)
            return torch.zeros(p, dtype=torch.long)

    comm = init_crypten(table, identity.name, identity, server=server, options=TransportOptions(deadline_s=30))
    spec = NoiseSpec(**NOISE)  # type: ignore[arg-type]
    rep: dict[str, Any] = {"outcomes": {}, "encoded": {}}
    bob = rank == 1
    try:
        silent = Silent()
        real = DistributedNoise()
        for case in CASES:
            noise = real if case == "honest, real noise" else silent
            agg = V.VerifiedAggregator(noise, (BOUND,) * 3, comm)
            agg._counter = CASES.index(case)  # one aggregate number per case, at every party
            c = _contribution(rank, 10.0 if (bob and "over its bound" in case) else 0.9)  # beyond M + B_z
            w = torch.ones(1, dtype=torch.float64)
            restore: list[tuple[Any, str, Any]] = []

            def patch(obj: Any, name: str, new: Any, restore: list = restore) -> None:
                restore.append((obj, name, getattr(obj, name)))
                setattr(obj, name, new)

            if bob and "forged" in case:
                patch(V.N, "prove_norm", forge)
            elif bob and "another copy" in case:
                real_isend = comm.isend

                def isend(t: torch.Tensor, dst: int, real_isend: Any = real_isend) -> Any:
                    if dst == 2:
                        t = t.clone()
                        t[5] ^= 1
                    return real_isend(t, dst)
                patch(comm, "isend", isend)
            elif bob and "misreports" in case:
                target = "input proofs" if "proof part" in case else "the sum"
                real_open = agg._open

                def lying_open(mine: dict[int, np.ndarray], what: str, real_open: Any = real_open,
                               target: str = target) -> np.ndarray:
                    if target in what:
                        s = shares_of(1)[0]
                        mine = {**mine, s: mine[s].copy()}
                        mine[s][0] ^= np.uint64(1 << 20)
                    return real_open(mine, what)
                patch(agg, "_open", lying_open)
            elif bob and "coin" in case:
                real_gather = comm.all_gather
                calls = {"n": 0}

                def gather(t: torch.Tensor, real_gather: Any = real_gather, calls: dict = calls) -> Any:
                    calls["n"] += 1
                    # the revealed coin: after the release keys' two gathers, the hashes and the promise
                    if t.dtype == torch.uint8 and t.numel() == 32 and calls["n"] == 5:
                        t = t.clone()
                        t[0] ^= 1
                    return real_gather(t)
                patch(comm, "all_gather", gather)
            try:
                got = agg.aggregate(c, w, spec)
                rep["outcomes"][case] = ("ok", got.numpy())
            except V.DeviationDetected as exc:
                rep["outcomes"][case] = ("deviation", str(exc))
            finally:
                for obj, name, old in reversed(restore):
                    setattr(obj, name, old)
            g = agg.precision_bits or 16
            rep["encoded"][case] = torch.round(c[0] * 2.0**g).to(torch.long).numpy()
            rep["sigma_units"] = real.plan(spec, DIM).params.t * real.plan(spec, DIM).params.mu
            rep["describe"] = {k: v for k, v in agg.describe().items() if isinstance(v, int | float | str)}
    finally:
        uninit_crypten()
    big = V.VerifiedAggregator(DistributedNoise(), (1e4,) * 3, comm)  # no message: a local check
    try:
        big.prepare(DIM, spec)
        rep["too_big"] = None
    except ValueError as exc:
        rep["too_big"] = str(exc)
    rep["hash"] = hashlib.sha256(b"done").hexdigest()
    return rep


@pytest.fixture(scope="module")
def reports() -> dict[int, dict[str, Any]]:
    return run_job(_party, 3, timeout=240.0)


def test_with_zero_noise_the_release_is_the_exact_sum_at_every_party(reports: dict[int, dict[str, Any]]) -> None:
    for case in ("honest, zero noise", "honest again"):
        want = sum(reports[r]["encoded"][case] for r in range(3)) / 2.0**16
        for r in range(3):
            kind, got = reports[r]["outcomes"][case]
            assert kind == "ok", got
            assert np.array_equal(got, want), case


def test_with_real_noise_every_party_releases_the_same_noisy_sum(reports: dict[int, dict[str, Any]]) -> None:
    case = "honest, real noise"
    got = [reports[r]["outcomes"][case] for r in range(3)]
    assert all(kind == "ok" for kind, _ in got), got
    assert all(np.array_equal(got[0][1], g[1]) for g in got[1:])
    exact = sum(reports[r]["encoded"][case] for r in range(3)) / 2.0**16
    residual = (got[0][1] - exact) * 2.0**16  # grid units: the three parties' noise shares
    sigma = math.sqrt(3 * reports[0]["sigma_units"])
    assert 0.8 < float(np.std(residual)) / sigma < 1.2
    assert float(np.abs(residual).max()) < 7 * sigma


@pytest.mark.parametrize("case, words", [
    ("bob's input over its bound, proof forged", ["bob's input fails its proof"]),
    ("bob deals carol another copy", ["of bob's input", "carol and bob"]),
    ("bob misreports a proof part", ["the input proofs", "bob"]),
    ("bob misreports its share of the sum", ["the sum", "bob"]),
    ("bob opens another coin", ["bob opened a coin other than the one it committed to"]),
])
def test_every_deviation_of_bob_stops_every_party_naming_bob(reports: dict[int, dict[str, Any]], case: str,
                                                             words: list[str]) -> None:
    for r in range(3):
        kind, message = reports[r]["outcomes"][case]
        assert kind == "deviation", f"party {r} released {message!r} in case {case!r}"
        for w in words:
            assert w in message, (r, message)
        assert "nothing is revealed" in message and f"aggregate #{CASES.index(case)}" in message


def test_the_cost_is_reported(reports: dict[int, dict[str, Any]]) -> None:
    d = reports[0]["describe"]
    assert d["security"] == "malicious" and d["aggregates"] == 1 and d["bytes"] > 0
    assert d["prove_seconds"] > 0 and d["verify_seconds"] > 0


def test_a_statement_that_does_not_fit_the_field_is_refused_before_any_message(
        reports: dict[int, dict[str, Any]]) -> None:
    message = reports[0]["too_big"]
    assert message and message.startswith('job.security: "malicious" cannot prove this job\'s inputs'), message
    assert "privacy.clip" in message and 'security = "semi-honest"' in message
