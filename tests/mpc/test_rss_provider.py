"""3-party replicated sharing with no dealer: the parties make their own binary triples and B2A
bits (mpc_erm.mpc.rss_provider), over real gRPC + mTLS processes, and the noise samplers run on
them. Checked against plaintext after revealing (which only a test does)."""

from __future__ import annotations

from typing import Any

import pytest

from mpc_erm.mpc.local import LocalContext, run_local_full

N = 4096


def _session(ctx: LocalContext) -> dict[str, Any]:
    import torch

    from mpc_erm.mpc.crypten_compat import import_crypten

    crypten = import_crypten()
    from crypten.mpc.primitives import BinarySharedTensor

    from mpc_erm.mpc.aggregator import MpcAggregator
    from mpc_erm.mpc.noise import InMpcNoise
    from mpc_erm.protocols.aggregation import NoiseSpec

    prov = crypten.mpc.get_default_provider()
    out: dict[str, Any] = {"provider": type(prov).__name__, "trust_model": ctx.trust_model}
    a, b, c = prov.generate_binary_triple(torch.Size([N]), torch.Size([N]))
    out["triple"] = [t.reveal() for t in (a, b, c)]
    r_a, r_b = prov.B2A_rng(torch.Size([N]))
    out["b2a"] = (r_a.reveal(), r_b.reveal())
    out["my_bit_share"] = r_b.share.clone()
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(N, generator=g), torch.randn(N, generator=g)
    ex, ey = crypten.cryptensor(x, src=0), crypten.cryptensor(y, src=1)
    out["gt"] = (ex > ey).get_plain_text()
    out["xy"] = (ex * ey).get_plain_text()
    out["want_gt"], out["want_xy"] = (x > y).double(), x * y
    bx = BinarySharedTensor(torch.arange(N), src=2)
    out["and"] = (bx & BinarySharedTensor(torch.full((N,), 0xF0F), src=0)).reveal()
    try:
        prov.wrap_rng(torch.Size([4]))
        out["wrap"] = "served"
    except RuntimeError as exc:
        out["wrap"] = str(exc)
    # the product's noisy aggregate on these tuples: discrete Laplace inside the MPC, then a reveal
    noise = NoiseSpec("laplace", 1e-3, sensitivity=1e-3)  # ℓ1 sensitivity 1e-3 at ε = 1
    src = InMpcNoise()
    agg = MpcAggregator(src)
    src.prepare(noise, 16, 1)
    row = torch.full((1, 16), 0.25 * (ctx.rank + 1), dtype=torch.float64)
    out["noisy"] = agg.aggregate(row, torch.ones(1, dtype=torch.float64), noise)
    out["agg_trust"] = agg.trust_model
    return out


@pytest.fixture(scope="module")
def run() -> Any:
    return run_local_full(_session, parties=3, trust="replicated", timeout_s=300)


def test_no_dealer_runs_and_the_trust_model_says_so(run: Any) -> None:
    assert run.dealer is None  # no dealer process was started
    for r in run.results:
        assert r["provider"] == "ReplicatedProvider"
        assert "replicated sharing (honest majority" in r["agg_trust"] and "no dealer" in r["agg_trust"]
        assert "TFP" not in r["agg_trust"] and "dealer '" not in r["agg_trust"]


def test_binary_triples_are_and_triples_of_uniform_words(run: Any) -> None:
    import torch

    a, b, c = run.results[0]["triple"]
    assert torch.equal(c, a & b)
    for r in run.results[1:]:
        assert all(torch.equal(u, v) for u, v in zip(r["triple"], run.results[0]["triple"]))
    # 64-bit words from the parties' generators: each bit position is ~fair (N = 4096: 5σ ≈ 0.04)
    bits = ((a.unsqueeze(1) >> torch.arange(64)) & 1).double().mean(0)
    assert (bits - 0.5).abs().max() < 0.04


def test_b2a_bits_agree_in_both_sharings(run: Any) -> None:
    import torch

    r_a, r_b = run.results[0]["b2a"]
    assert torch.equal(r_a, r_b)
    assert set(r_b.unique().tolist()) <= {0, 1} and abs(r_b.double().mean().item() - 0.5) < 0.04
    # no party's own XOR share equals the bit: each is a fair coin on its own
    for r in run.results:
        agree = (r["my_bit_share"] == r_b).double().mean().item()
        assert 0.45 < agree < 0.55


def test_comparisons_products_and_ands_match_plaintext(run: Any) -> None:
    import torch

    for r in run.results:
        assert torch.equal(r["gt"], r["want_gt"])
        assert (r["xy"] - r["want_xy"]).abs().max().item() < 1e-3
        assert torch.equal(r["and"], torch.arange(N) & 0xF0F)
        assert "not used under replicated sharing" in r["wrap"]


def test_noisy_aggregate_on_rss_tuples(run: Any) -> None:
    import torch

    outs = [r["noisy"] for r in run.results]
    assert all(torch.equal(o, outs[0]) for o in outs)  # one release, seen by all
    # Σ 0.25·(rank+1) = 1.5 plus discrete Laplace noise of scale Δ₁/ε ≈ 1e-3
    assert (outs[0] - 1.5).abs().max().item() < 0.05
    assert not torch.all(outs[0] == 1.5)
