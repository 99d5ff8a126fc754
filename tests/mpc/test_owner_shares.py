"""Issue 17, first layer: data owners' contributions as seed-compressed additive shares for k
compute parties (parties.owner.shares), summed by the compute parties and revealed with the
in-MPC noise by MpcAggregator.aggregate_shares.

Checked: the shares of every owner sum to its encoding exactly, whatever the round; one compute
party's view of an owner (a key or an explicit share) is uniform and changes every round; a
dropped owner is left out of the sum by every compute party; through 3 compute-party processes
and a dealer over gRPC + mTLS, the revealed aggregate is Σ over the agreed owners exactly
(zero noise) and Σ + the planned discrete Gaussian (in-MPC noise). The owners' keys are fixed;
the in-MPC noise is not (dealer and CrypTen seeds come from secrets / os.urandom in the product)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest
import torch
from scipy import stats

from parties.owner.shares import (
    OwnerRangeError,
    OwnerSharer,
    OwnerShareSum,
    encode_on_grid,
    explicit_party,
    owner_margin_bits,
)
from tests.mpc.test_mpc_aggregator import run_job

K, OWNERS, DIM, GRID = 3, 30, 257, 20  # GRID: the unit tests' grid
DROPPED = {4, 17}  # missed the round's deadline: left out by every compute party
# fresh randomness each run, so the tolerance is set where a chance failure is about one in a million
P_FRESH = 1e-6


def _owner_value(o: int, round_: int, dim: int = DIM) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * o + round_)
    return (torch.rand(dim, generator=g, dtype=torch.float64) - 0.5) * 2.0  # a clipped contribution


def _sharers() -> list[OwnerSharer]:
    """Fixed keys so that every test process agrees (the product draws fresh ones per job)."""
    out = []
    for o in range(OWNERS):
        e = explicit_party(o, K)
        keys = {j: hashlib.sha256(f"owner {o} party {j}".encode()).digest() for j in range(K) if j != e}
        out.append(OwnerSharer(o, K, keys))
    return out


def _compute_side(rank: int, sharers: list[OwnerSharer]) -> OwnerShareSum:
    side = OwnerShareSum(rank, K)
    for s in sharers:
        if s.explicit != rank:
            side.add_key(s.owner_index, s.keys[rank])
    return side


def _round_input(rank: int, round_: int, sharers: list[OwnerSharer], margin: int, grid: int) -> torch.Tensor:
    """What compute party ``rank`` feeds the aggregator in ``round_``: its sum over the agreed owners."""
    side = _compute_side(rank, sharers)
    agreed = [o for o in range(OWNERS) if o not in DROPPED]
    explicit = {o: sharers[o].split(encode_on_grid(_owner_value(o, round_), grid, margin), round_)
                for o in agreed if sharers[o].explicit == rank}
    return side.total(agreed, round_, DIM, explicit)


def _exact(round_: int, margin: int, grid: int) -> torch.Tensor:
    """Σ over the agreed owners of their encodings, decoded: what the zero-noise reveal must equal."""
    ring = torch.stack([encode_on_grid(_owner_value(o, round_), grid, margin) for o in range(OWNERS)
                        if o not in DROPPED]).sum(0)
    return ring.to(torch.float64) / 2.0**grid


def test_the_shares_sum_to_the_encoding_in_every_round() -> None:
    margin = owner_margin_bits(OWNERS)
    sharers = _sharers()
    sides = [_compute_side(r, sharers) for r in range(K)]
    for round_ in (0, 1, 7):
        for o in (0, 1, 2, 29):
            ring = encode_on_grid(_owner_value(o, round_), GRID, margin)
            explicit = {o: sharers[o].split(ring, round_)}
            total = sum(side.total([o], round_, DIM, explicit if side.rank == sharers[o].explicit else {})
                        for side in sides)
            assert torch.equal(total, ring), (o, round_)  # exact, in the int64 ring


def test_one_compute_partys_view_of_an_owner_is_uniform_and_fresh_each_round() -> None:
    margin = owner_margin_bits(OWNERS)
    sharers = _sharers()
    o = 0  # its explicit party is 0; party 1 derives its share from a key
    zero = torch.zeros(1 << 14, dtype=torch.float64)
    explicit = [sharers[o].split(encode_on_grid(zero, GRID, margin), t) for t in (0, 1)]
    derived = [_compute_side(1, sharers).total([o], t, 1 << 14, {}) for t in (0, 1)]
    for view in (*explicit, *derived):  # a constant input: any structure would show in the bits
        bits = ((view.unsqueeze(1) >> torch.arange(64)) & 1).double().mean(0)
        assert (bits - 0.5).abs().max() < 0.02
    assert not set(explicit[0].tolist()) & set(explicit[1].tolist())  # a fresh share every round
    assert not set(derived[0].tolist()) & set(derived[1].tolist())


def test_bad_inputs_are_refused_naming_what() -> None:
    with pytest.raises(OwnerRangeError, match="not finite or reaches"):
        encode_on_grid(torch.tensor([float("nan")]), GRID, 10)
    with pytest.raises(OwnerRangeError, match=r"\|v\| >= 2\^33"):
        encode_on_grid(torch.tensor([2.0**40]), GRID, 10)
    side = OwnerShareSum(0, K)
    with pytest.raises(ValueError, match="explicit shares, not a key"):
        side.add_key(3, bytes(32))  # owner 3's explicit party is 0
    side.add_key(1, bytes(32))
    with pytest.raises(ValueError, match="already gave"):
        side.add_key(1, bytes(32))
    with pytest.raises(KeyError, match="owner 2: no key"):
        side.total([2], 0, 4, {})
    with pytest.raises(KeyError, match="owner 0: no share of round 5"):
        side.total([0], 5, 4, {})
    with pytest.raises(ValueError, match="keys for compute parties"):
        OwnerSharer(0, K, {0: bytes(32), 1: bytes(32)})  # party 0 is its explicit party
    assert set(OwnerSharer.new(4, K).keys) == {0, 2}


def _member(rank: int, table: Any, identity: Any, server: Any, *, rounds: int) -> dict[str, Any]:
    from mpc_erm.mpc.transport import TransportOptions

    if identity.role == "dealer":
        from mpc_erm.mpc.dealer import run_dealer

        run_dealer(table, identity, server=server, options=TransportOptions(deadline_s=60))
        return {}
    from mpc_erm.mpc.aggregator import PRECISION_BITS, MpcAggregator, ZeroNoise
    from mpc_erm.mpc.communicator import init_crypten, uninit_crypten
    from mpc_erm.mpc.dealer import start_dealer_client, stop_dealer_client
    from mpc_erm.mpc.noise import InMpcNoise
    from mpc_erm.protocols.aggregation import NO_NOISE, NoiseSpec

    init_crypten(table, identity.name, identity, server=server, options=TransportOptions(deadline_s=60))
    start_dealer_client()
    rep: dict[str, Any] = {}
    margin = owner_margin_bits(OWNERS)
    sharers = _sharers()
    plain = MpcAggregator(ZeroNoise(), allow_test_only=True)  # no noise: the aggregator's 16-bit grid
    rep["zero"] = plain.aggregate_shares(_round_input(rank, 0, sharers, margin, PRECISION_BITS), PRECISION_BITS,
                                         NO_NOISE).numpy()
    try:
        plain.aggregate_shares(_round_input(rank, 1, sharers, margin, PRECISION_BITS), 12, NO_NOISE)
        rep["grid_mismatch"] = "not refused"
    except ValueError as exc:
        rep["grid_mismatch"] = str(exc)
    src = InMpcNoise()
    agg = MpcAggregator(src)  # production: no allow_test_only
    spec = NoiseSpec("gaussian", NOISE_SIGMA, sensitivity=0.01)
    src.prepare(spec, DIM, releases=rounds)
    grid = src.precision_bits(spec, DIM)  # public: the plan's grid, which the owners encode on
    rep["grid"] = grid
    rep["noisy"] = torch.stack([agg.aggregate_shares(_round_input(rank, t, sharers, margin, grid), grid, spec)
                                for t in range(rounds)]).numpy()
    rep["online_samples"] = src.online_samples
    rep["trust_model"] = agg.trust_model
    stop_dealer_client()
    uninit_crypten()
    return rep


NOISE_SIGMA, NOISY_ROUNDS = 0.05, 4


@pytest.fixture(scope="module")
def consortium() -> dict[int, dict[str, Any]]:
    reports = run_job(_member, K, dealer=True, timeout=240, rounds=NOISY_ROUNDS)
    errors = {r: v["error"] for r, v in reports.items() if "error" in v}
    assert not errors, "\n".join(errors.values())
    return reports


def test_three_compute_parties_reveal_the_agreed_owners_sum_exactly_without_noise(consortium: dict) -> None:
    from mpc_erm.mpc.aggregator import PRECISION_BITS

    exact = _exact(0, owner_margin_bits(OWNERS), PRECISION_BITS).numpy()
    for r in range(K):
        assert np.array_equal(np.asarray(consortium[r]["zero"]), exact)  # exact; the dropped owners left out
        assert "grid_bits: the owners encoded on 2^-12, the noise lives on 2^-16" in consortium[r]["grid_mismatch"]


def test_the_in_mpc_noise_is_added_once_to_the_owners_sum(consortium: dict) -> None:
    """revealed − Σ owners = the discrete Gaussian of the plan (σ = 0.05): same at every compute
    party, mean 0 and σ within 5 standard errors over 4 × 257 samples, normal by KS."""
    grid = consortium[0]["grid"]
    margin = owner_margin_bits(OWNERS)
    noise = np.stack([(torch.as_tensor(consortium[0]["noisy"][t]) - _exact(t, margin, grid)).numpy()
                      for t in range(NOISY_ROUNDS)])
    for r in range(1, K):
        assert np.array_equal(np.asarray(consortium[r]["noisy"]), np.asarray(consortium[0]["noisy"]))
    z = noise.reshape(-1) / NOISE_SIGMA
    assert abs(z.mean()) < 5 / np.sqrt(z.size) and abs(z.std() - 1) < 5 / np.sqrt(2 * z.size), (z.mean(), z.std())
    assert stats.kstest(z, "norm").pvalue > P_FRESH
    assert consortium[0]["online_samples"] == 0 and "dealer 'dealer'" in consortium[0]["trust_model"]
