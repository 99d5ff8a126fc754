"""The contribution check (mpc_erm.mpc.validation) in real CrypTen parties over gRPC + mTLS, both
trust modes: honest contributions at their bound always pass; 10⁶ × the bound, NaN bit patterns,
uniform ring values (a replayed or foreign share), and the 2-adic patterns that fool a squared
norm in Z_2^64 (2^63 in two coordinates, 2^31 in four, whose squares sum to 0 mod 2^64) fail; one
unit over the bound fails. The soundness argument's one probabilistic step is measured too."""

from __future__ import annotations

import math

import pytest
import torch

from mpc_erm.mpc.local import run_local

P, M = 300, 1 << 20


def _cases(M: int = M) -> tuple[torch.Tensor, list[str], list[bool]]:
    g = torch.Generator().manual_seed(7)
    xs: list[torch.Tensor] = []
    names: list[str] = []
    want: list[bool] = []

    def add(name: str, x: torch.Tensor, ok: bool) -> None:
        xs.append(x)
        names.append(name)
        want.append(ok)

    for k in range(3):
        v = torch.randn(P, generator=g, dtype=torch.float64)
        add(f"honest-{k}", (v / v.norm() * M * (0.3 + 0.35 * k)).trunc().long(), True)
    flat = torch.full((P,), math.isqrt(M * M // P), dtype=torch.long)  # ‖x‖₁ = √p‖x‖₂: the projections' worst case
    add("honest-flat", flat, True)
    add("honest-negative", -flat, True)
    edge = torch.zeros(P, dtype=torch.long)
    edge[0] = M
    add("honest-at-bound", edge, True)
    add("zero", torch.zeros(P, dtype=torch.long), True)
    over = edge.clone()
    over[1] = 1
    add("one-unit-over", over, False)
    add("1e6x", (xs[0].double() * 1e6).round().long(), False)
    add("nan-bits", torch.full((P,), 0x7FF8000000000000, dtype=torch.long), False)
    add("uniform", torch.empty(P, dtype=torch.long).random_(-(2**63), None, generator=g), False)
    two = torch.zeros(P, dtype=torch.long)
    two[[3, 7]] = -(2**63)
    add("2^63-twice", two, False)
    four = torch.zeros(P, dtype=torch.long)
    four[:4] = 2**31
    add("2^31-four-times", four, False)
    return torch.stack(xs), names, want


def _party(ctx: object, parties: int) -> list[bool]:
    import crypten

    from mpc_erm.mpc.validation import CheckPlan, check_contributions

    x, _names, _want = _cases()
    g = torch.Generator().manual_seed(11)
    shares = [torch.empty_like(x).random_(-(2**63), None, generator=g) for _ in range(parties - 1)]
    last = x.clone()
    for s in shares:
        last -= s
    shares.append(last)
    rank = crypten.communicator.get().get_rank()
    return check_contributions(shares[rank], CheckPlan(P, (M,) * x.shape[0]), crypten.communicator.get())


def _split(x: torch.Tensor, parties: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shares = [torch.empty_like(x).random_(-(2**63), None, generator=g) for _ in range(parties - 1)]
    return [*shares, x - sum(shares, torch.zeros_like(x))]


def _round_party(ctx: object) -> list[bool]:
    """Replicated sharing, the local square (the next party's shares at hand), one round's check
    over two blocks whose bounds give one chunk and nine."""
    import crypten

    from mpc_erm.mpc.validation import CheckPlan, RoundCheck

    rank = crypten.communicator.get().get_rank()
    check = RoundCheck(crypten.communicator.get(), P)
    for m, seed in ((M, 1), (1 << 24, 2)):
        x = _cases(m)[0]
        shares = _split(x, 3, seed)
        plan = CheckPlan(P, (m,) * x.shape[0])
        check.add(shares[rank], plan, following=shares[(rank + 1) % 3])
    return check.verdicts()


def test_one_round_check_over_blocks_of_different_chunk_counts_with_the_local_square() -> None:
    from mpc_erm.mpc.validation import CheckPlan

    assert CheckPlan(P, (M,)).chunks == 1 and CheckPlan(P, (1 << 24,)).chunks > 1
    results = run_local(_round_party, parties=3, trust="replicated", timeout_s=300)
    want = _cases(M)[2] + _cases(1 << 24)[2]
    assert all(r == results[0] for r in results)
    assert results[0] == want


#: A bound whose exact squared norm needs the partial-sum tree: chunks of 4 coordinates, 2,500 of
#: them, summed 1,844 at a time (two level-1 sums, then the root); the plan refused it before.
WIDE, WIDE_M = 10_000, 50_000_000


def _wide_cases() -> tuple[torch.Tensor, list[str], list[bool]]:
    from mpc_erm.mpc.validation import CheckPlan

    plan = CheckPlan(WIDE, (WIDE_M,))
    group = plan.chunk * plan.fan_in  # coordinates under one level-1 partial sum
    assert plan.levels() == [2, 1] and group < WIDE
    g = torch.Generator().manual_seed(3)
    v = torch.randn(WIDE, generator=g, dtype=torch.float64)
    cases = {"honest": ((v / v.norm() * WIDE_M * 0.9).trunc().long(), True)}
    edge = torch.zeros(WIDE, dtype=torch.long)
    edge[0] = WIDE_M
    cases["honest-at-bound"] = (edge, True)
    over = edge.clone()
    over[group + 1] = 1  # M² + 1, the extra unit under the other level-1 sum: only the root sees it
    cases["one-unit-over-across-groups"] = (over, False)
    half = torch.zeros(WIDE, dtype=torch.long)
    half[[0, group]] = int(WIDE_M * 0.87)  # 0.76 M² under each level-1 sum, 1.51 M² in all
    cases["each-group-within-the-whole-over"] = (half, False)
    return torch.stack([x for x, _ in cases.values()]), list(cases), [ok for _, ok in cases.values()]


def _wide_party(ctx: object, parties: int) -> list[bool]:
    import crypten

    from mpc_erm.mpc.validation import CheckPlan, RoundCheck

    x, _names, _want = _wide_cases()
    shares = _split(x, parties, 5)
    rank = crypten.communicator.get().get_rank()
    check = RoundCheck(crypten.communicator.get(), WIDE)
    replicated = getattr(ctx, "trust", "") == "replicated"
    following = shares[(rank + 1) % 3] if replicated else None  # the local square
    check.add(shares[rank], CheckPlan(WIDE, (WIDE_M,) * x.shape[0]), following=following)
    return check.verdicts()


@pytest.mark.parametrize("trust,parties", [("replicated", 3), ("dealer", 2)])
def test_a_norm_too_wide_to_sum_at_once_is_checked_exactly_by_a_tree_of_partial_sums(trust: str,
                                                                                     parties: int) -> None:
    """Every chunk and every level-1 partial sum within M², the whole over it: refused at the root;
    the honest contributions at the bound pass (the local square under replicated sharing, CrypTen's
    with a dealer)."""
    results = run_local(_wide_party, parties=parties, trust=trust, args=(parties,), timeout_s=300)
    _x, names, want = _wide_cases()
    assert all(r == results[0] for r in results)
    assert dict(zip(names, results[0])) == dict(zip(names, want))


@pytest.mark.parametrize("trust,parties", [("replicated", 3), ("dealer", 2), ("dealer", 3)])
def test_the_check_passes_every_honest_contribution_and_refuses_every_hostile_one(trust: str, parties: int) -> None:
    results = run_local(_party, parties=parties, trust=trust, args=(parties,), timeout_s=300)
    _x, names, want = _cases()
    assert all(r == results[0] for r in results)  # the same opened bits at every party
    assert dict(zip(names, results[0])) == dict(zip(names, want))


def test_a_coordinate_beyond_twice_the_threshold_passes_a_projection_at_most_half_the_time() -> None:
    """The soundness step, in plaintext: y = ⟨r, x⟩ mod 2^64 with r ∈ {−1, 0, 1} (¼, ½, ¼) and
    x = 2^63 (or 2τ + 1) in one coordinate: P(|y|_c ≤ τ) ≤ ½ (module docstring)."""
    from mpc_erm.mpc.validation import CheckPlan, projection_rows

    tau = CheckPlan.threshold(M, P)
    for big in (-(2**63), 2 * tau + 1, 2**62 + 12345):
        passed = 0
        trials = 400
        for k in range(trials):
            r = projection_rows(k.to_bytes(32, "little"), P, 1)[:, 0]
            x = torch.zeros(P, dtype=torch.long)
            x[k % P] = big
            x[(k + 1) % P] = M // 2
            y = int((x * r).sum())  # int64 arithmetic wraps like the ring
            passed += abs(y) <= tau
        assert passed / trials <= 0.5 + 3 * math.sqrt(0.25 / trials), (big, passed)


def test_projection_rows_are_minus_one_zero_one_a_quarter_a_half_a_quarter() -> None:
    from mpc_erm.mpc.validation import projection_rows

    r = projection_rows(b"k" * 32, 1000, 64)
    assert r.shape == (1000, 64) and set(r.unique().tolist()) == {-1, 0, 1}
    freq = [(r == v).double().mean().item() for v in (-1, 0, 1)]
    assert abs(freq[0] - 0.25) < 0.01 and abs(freq[1] - 0.5) < 0.01 and abs(freq[2] - 0.25) < 0.01
    assert torch.equal(r, projection_rows(b"k" * 32, 1000, 64))
    assert not torch.equal(r, projection_rows(b"j" * 32, 1000, 64))


@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000])
def test_bit_planes_hold_bit_j_of_every_value_in_plane_j(n: int) -> None:
    """The in-place 64 × 64 transpose against bit-by-bit extraction, sign bit and padding included."""
    from mpc_erm.mpc.samplers.bits import unpack
    from mpc_erm.mpc.validation import _planes

    v = torch.empty(n, dtype=torch.long).random_(-(2**63), None, generator=torch.Generator().manual_seed(n))
    v[0] = -(2**63)
    planes = _planes(v)
    assert planes.shape == (64, -(-n // 64))
    bits = unpack(planes, n)  # (64, n)
    want = torch.stack([(v >> j) & 1 for j in range(64)])
    assert torch.equal(bits, want)
    assert not unpack(planes, planes.shape[1] * 64)[:, n:].any()  # zero padding, before the junk is added


def test_the_plan_refuses_bounds_the_ring_cannot_hold_exactly_and_chunks_the_rest() -> None:
    from mpc_erm.mpc.validation import CheckPlan, ValidationError, bound_units

    assert CheckPlan(7850, (1 << 20,)).chunks == 1
    big = CheckPlan(7850, (1 << 24,))
    assert big.chunks > 1 and big.chunk * 4 * CheckPlan.threshold(1 << 24, 7850) ** 2 < 1 << 62
    with pytest.raises(ValidationError, match="coarser grid"):
        CheckPlan(7850, (1 << 27,))
    # a million coordinates at the bound a CIFAR-10 network's party sum has on its grid: once refused
    # (the chunks' sum would not fit the ring), now summed up a tree, G·M² < 2^62 at every node
    wide = CheckPlan(1_068_298, (38_339_115,))
    assert wide.chunks * 38_339_115**2 >= 1 << 62 and wide.levels() == [57, 1]
    assert wide.fan_in * 38_339_115**2 < 1 << 62 <= (wide.fan_in + 1) * 38_339_115**2
    assert bound_units(1.0, 16, 100) == 65536 + 1 + 5 + 1  # + the float slack 2^-20 of 2^16 units, rounded up


def _any_party(ctx: object, parties: int) -> tuple[list[bool], list[bool]]:
    import crypten

    from mpc_erm.mpc.validation import _any_positive

    g = torch.Generator().manual_seed(5)
    v = torch.empty(37, 11, dtype=torch.long).random_(-(2**63), None, generator=g)
    v[v.abs() < 2**62] = 0  # about half the rows: no positive entry, unless an edge value below
    edges = torch.tensor([0, -1, 1, 2**63 - 1, -(2**63), 2**62, -(2**62)], dtype=torch.long)
    v[:7, 0] = edges
    v[7:14] = -v[7:14].abs()  # rows of negatives (and −2^63) only
    shares = [torch.empty_like(v).random_(-(2**63), None, generator=g) for _ in range(parties - 1)]
    shares.append(v - sum(shares))
    got = _any_positive(shares[crypten.communicator.get().get_rank()])
    return got, [bool(b) for b in (v > 0).any(1).tolist()]


@pytest.mark.parametrize("trust,parties", [("replicated", 3), ("dealer", 2), ("dealer", 4)])
def test_the_packed_sign_circuit_agrees_with_plaintext(trust: str, parties: int) -> None:
    """Any entry > 0 per row, by the bit-plane sign circuit (carry-save for 3+ parties), against
    the plaintext answer, edge values (0, ±1, ±2^62, 2^63 − 1, −2^63) included."""
    for got, want in run_local(_any_party, parties=parties, trust=trust, args=(parties,), timeout_s=300):
        assert got == want
