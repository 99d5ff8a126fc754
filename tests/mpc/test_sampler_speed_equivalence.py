"""The fast paths of the in-MPC samplers compute exactly the functions of the plain description
(3 real CrypTen processes over gRPC + mTLS, TFP; every check reveals test-only values and
compares bit for bit with a plaintext computation, so none is statistical except the last):

* ``bits.and_many``: several independent ANDs sharing one triple and one opening;
* both chain variants (``coins.COIN_PLANES`` "local" and "triple"): the coins are [U < c] for the U
  actually used, reassembled from the revealed planes (for "triple": the triples' a ⊕ the public
  words, recorded as they are drawn);
* ``_acceptance``: the bit-sliced A2B of N (carry-save + ripple over the parties' shares) fused
  with fail_i = n_i ∧ ¬C_i and ⋀_i ¬fail_i, against the plaintext acceptance of N values that
  include 0, 2^n_bits − 1 and values whose shares carry through every bit;
* ``bits.b2a_bits`` and the packed lanes;
* end to end, the production regime (σ ≈ 2^14 grid units, k = 56, R from for_sigma): KS distance
  of MPC samples to the exact PMF ``DiscreteGaussianParams.log_pmf()``, for both chain variants.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import numpy as np
import pytest

from mpc_erm.mpc import pki
from mpc_erm.mpc.samplers.gaussian import DiscreteGaussianParams
from tests.mpc.harness import collect_reports, join_as_party, start_parties

PARTIES = ("alice", "bob", "carol")
THRESHOLDS = (0, 1, 12345, 32768, 65535, 65536 - 7)
SMALL_GAUSS = DiscreteGaussianParams(t=6, mu=4, rounds=5)  # 18 bits of N, compared and constant-zero coins
N_E2E = 3000


def _prod_params() -> DiscreteGaussianParams:
    return DiscreteGaussianParams.for_sigma(0.25, grid_bits=16, k=56)  # σ·2^16 = 2^14 grid units


def _party(rank: int, identity: pki.Identity, port_q: Any, table_q: Any, out_q: Any) -> None:
    try:
        import torch

        from mpc_erm.mpc.communicator import uninit_crypten

        crypten, _comm, server = join_as_party(rank, identity, port_q, table_q, local_seed=777)
        from crypten.mpc.primitives.arithmetic import ArithmeticSharedTensor

        from mpc_erm.mpc.samplers import bits, coins
        from mpc_erm.mpc.samplers import discrete_gaussian as dg

        cpu = torch.device("cpu")
        report: dict[str, Any] = {"rank": rank}

        def reveal(x: torch.Tensor) -> np.ndarray:
            return bits.open_words(x).numpy()

        # and_many: three independent ANDs of different shapes in one round.
        shapes = [(3, 5), (7,), (2, 2, 4)]
        xs = [bits.local_words(s, cpu) for s in shapes]
        ys = [bits.local_words(s, cpu) for s in shapes]
        zs = bits.and_many(list(zip(xs, ys)))
        report["and"] = [(reveal(x), reveal(y), reveal(z)) for x, y, z in zip(xs, ys, zs)]

        # Both chain variants, with the planes of U recorded as drawn.
        masks = coins.threshold_masks(THRESHOLDS, 16, cpu)
        provider = crypten.mpc.get_default_provider()
        for mode in ("local", "triple"):
            drawn: list[tuple[str, torch.Tensor]] = []
            # the coin circuit's own names for the word sources (it imports them from bits)
            real_local, real_public = coins.local_words, coins.public_words
            real_triple = provider.generate_binary_triple

            def local_words(shape: Any, device: Any, _real: Any = real_local, _d: list = drawn) -> torch.Tensor:
                w = _real(shape, device)
                _d.append(("local", w.clone()))
                return w

            def public_words(shape: Any, device: Any, _real: Any = real_public, _d: list = drawn) -> torch.Tensor:
                w = _real(shape, device)
                _d.append(("public", w.clone()))
                return w

            def triple(*args: Any, _real: Any = real_triple, _d: list = drawn, **kwargs: Any) -> Any:
                t = _real(*args, **kwargs)
                _d.append(("a", t[0].share.clone()))
                return t

            coins.local_words, coins.public_words = local_words, public_words
            provider.generate_binary_triple = triple
            coins.COIN_PLANES = mode
            try:
                drawn_coins = coins.random_coins(masks, 3, cpu)
            finally:
                coins.local_words, coins.public_words = real_local, real_public
                del provider.generate_binary_triple  # the class's method again
            report[f"chain_{mode}"] = ([(kind, reveal(w) if kind != "public" else w.numpy()) for kind, w in drawn],
                                       reveal(drawn_coins))

        # _acceptance against plaintext N: arithmetic shares with random masks (carries everywhere).
        p = SMALL_GAUSS
        rows, n = 4, 200
        g = torch.Generator().manual_seed(5)  # the same plaintext N at every party
        top = (1 << p.n_bits) - 1
        n_plain = torch.randint(0, top + 1, (rows, n), generator=g)
        n_plain[0, :4] = torch.tensor([0, top, 1 << (p.n_bits - 1), top - 1])
        n_plain[1, :3] = torch.tensor([p.mu**2, (p.support_max - p.mu) ** 2, 1])
        n_shared = ArithmeticSharedTensor(n_plain, precision=0, src=0).share
        cmp_bits = [i for i, c in enumerate(p.coin_thresholds, start=p.low_bit) if c > 0]
        w = -(-n // 64)
        acc_coins = bits.local_words((len(cmp_bits), rows, w), cpu)
        accept = dg._acceptance(n_shared, p, acc_coins, {b: r for r, b in enumerate(cmp_bits)})
        report["acceptance"] = (n_plain.numpy(), reveal(acc_coins), reveal(accept), cmp_bits)

        # B2A of packed bits.
        words = bits.local_words((3, 4), cpu)
        report["b2a"] = (reveal(words), crypten.mpc.MPCTensor.from_shares(bits.b2a_bits(words, 250), precision=0)
                         ._tensor.reveal().numpy())

        # End to end in the production regime, both chain variants.
        params = _prod_params()
        for mode in ("local", "triple"):
            coins.COIN_PLANES = mode
            out = dg.sample_discrete_gaussian_integers(params, N_E2E)
            report[f"e2e_{mode}"] = out.reveal().numpy()
        uninit_crypten()
        server.stop()
        out_q.put(report)
    except BaseException:
        out_q.put({"rank": rank, "error": traceback.format_exc()})


@pytest.fixture(scope="module")
def session() -> dict[int, dict[str, Any]]:
    procs, out_q = start_parties(_party, PARTIES, "sampler-equivalence", "sampler equivalence CA")
    timeout = float(os.environ.get("MPC_ERM_SAMPLER_TIMEOUT_S", "150")) * len(procs)
    return collect_reports(procs, out_q, len(procs), timeout=timeout, convert=lambda r: r)


def _lanes(words: np.ndarray) -> np.ndarray:
    """(..., W) int64 words → (..., 64·W) bits, lane l of word w = element 64w + l."""
    u = words.astype(np.uint64)[..., None] >> np.arange(64, dtype=np.uint64)
    return (u & np.uint64(1)).astype(bool).reshape(*words.shape[:-1], -1)


def test_fused_ands_match_plaintext(session: dict[int, dict[str, Any]]) -> None:
    for x, y, z in session[0]["and"]:
        assert np.array_equal(z, x & y)


@pytest.mark.parametrize("mode", ["local", "triple"])
def test_chain_coins_are_u_less_than_c_for_the_planes_used(session: dict[int, dict[str, Any]], mode: str) -> None:
    drawn, coins = session[0][f"chain_{mode}"]
    k = 16
    # Plane order: LSB first (plane k−1 MSB-first index), one per round.
    if mode == "local":
        planes = [w for kind, w in drawn if kind == "local"]
    else:
        lsb = [w for kind, w in drawn if kind == "local"]
        a_s = [w for kind, w in drawn if kind == "a"]
        pub = [w for kind, w in drawn if kind == "public"]
        assert len(lsb) == 1 and len(a_s) == len(pub) == k - 1
        planes = lsb + [a ^ s for a, s in zip(a_s, pub)]
    assert len(planes) == k
    bits = np.stack([_lanes(p) for p in planes])  # (k, J, 64W), index 0 = LSB
    weights = (np.uint64(1) << np.arange(k, dtype=np.uint64)).reshape(-1, 1, 1)
    u = (bits.astype(np.uint64) * weights).sum(0)
    expected = u < np.array(THRESHOLDS, dtype=np.uint64).reshape(-1, 1)
    assert np.array_equal(_lanes(coins), expected)
    assert 0 < expected[3].mean() < 1  # the planes are not degenerate


def test_fused_a2b_and_acceptance_match_plaintext(session: dict[int, dict[str, Any]]) -> None:
    n_plain, coins, accept, cmp_bits = session[0]["acceptance"]
    p = SMALL_GAUSS
    rows, n = n_plain.shape
    coin_bits = _lanes(coins)[..., :n]  # (compared coins, rows, n)
    ok = np.ones((rows, n), dtype=bool)
    for i in range(p.low_bit, p.n_bits):
        n_i = (n_plain >> i) & 1 == 1
        c_i = coin_bits[cmp_bits.index(i)] if i in cmp_bits else np.zeros_like(n_i)
        ok &= ~n_i | c_i
    assert np.array_equal(_lanes(accept)[..., :n], ok)
    assert 0 < ok.mean() < 1
    assert len(cmp_bits) < p.n_bits - p.low_bit  # constant-zero coins exercised too


def test_packed_b2a_matches_plaintext(session: dict[int, dict[str, Any]]) -> None:
    words, arith = session[0]["b2a"]
    assert np.array_equal(arith, _lanes(words)[:, :250].astype(np.int64))


@pytest.mark.parametrize("mode", ["local", "triple"])
def test_production_regime_samples_follow_the_exact_pmf(session: dict[int, dict[str, Any]], mode: str) -> None:
    s = session[0][f"e2e_{mode}"]
    assert all(np.array_equal(session[r][f"e2e_{mode}"], s) for r in (1, 2))
    params = _prod_params()
    cdf = np.cumsum(np.exp(params.log_pmf()))
    xs = np.arange(cdf.size) - (cdf.size - 1) // 2
    assert np.abs(s).max() <= params.support_max
    emp = np.searchsorted(np.sort(s), xs, side="right") / s.size
    ks = float(np.max(np.abs(emp - cdf)))
    print(f"\nMPC discrete Gaussian σ={params.sigma:.0f} grid units, revealed rejection, k={params.k}, "
          f"COIN_PLANES={mode}: KS to the exact PMF over {s.size} samples = {ks:.4f}")
    assert ks < 1.95 / np.sqrt(s.size)  # the KS statistic's 0.1 % quantile
