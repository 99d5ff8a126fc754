"""Contributor-proven ℓ2 bounds (mpc_erm.mpc.norm_proof) on 3-party replicated shares: the field
arithmetic against Python integers, the fully linear proof, and a seeded campaign of lying
contributors and deviating compute parties, every one of which must be refused."""

from __future__ import annotations

import secrets
import sys
from collections.abc import Callable

import numpy as np
import pytest

from mpc_erm.mpc import field as F
from mpc_erm.mpc import flp
from mpc_erm.mpc import norm_proof as N
from mpc_erm.mpc.replicated_open import OpeningMismatch, open_verified, shares_of
from tests.mpc.forgery import forge, naive_aux

P = F.P


def _ints(a: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(a).ravel()]


def test_field_operations_agree_with_python_integers() -> None:
    rng = np.random.default_rng(7)
    a = rng.integers(0, P, 3000, dtype=np.uint64)
    b = rng.integers(0, P, 3000, dtype=np.uint64)
    a[:4] = [0, P - 1, P - 1, 1 << 60]
    b[:4] = [P - 1, P - 1, 1, (1 << 60) + 12345]
    for op, ref in [(F.mul, lambda x, y: x * y), (F.add, lambda x, y: x + y), (F.sub, lambda x, y: x - y)]:
        assert _ints(op(a, b)) == [ref(x, y) % P for x, y in zip(_ints(a), _ints(b), strict=True)]
    assert _ints(F.neg(a)) == [(-x) % P for x in _ints(a)]
    assert int(F.dot(a, b)) == sum(x * y for x, y in zip(_ints(a), _ints(b), strict=True)) % P
    for k in (0, 1, 21, 42, 60, 61, 84):
        assert _ints(F.mul_pow2(a, k)) == [x * pow(2, k, P) % P for x in _ints(a)]
    m = rng.integers(0, P, (5, 3000), dtype=np.uint64)
    m[0] = P - 1
    full = np.full(3000, P - 1, dtype=np.uint64)
    for vec in (b, full):
        want = [sum(x * y for x, y in zip(_ints(row), _ints(vec), strict=True)) % P for row in m]
        assert _ints(F.matvec(m, vec)) == want
    signs = rng.integers(-1, 2, (4, 3000))
    assert _ints(F.small_matvec(signs, a)) == [sum(s * x for s, x in zip(_ints(row), _ints(a), strict=True)) % P
                                               for row in signs]
    # float32 coefficients take narrower limbs; the worst case, every coefficient ±1 on p − 1, stays exact
    for vec in (a, full):
        for cs in (signs, np.ones((2, 3000)), -np.ones((2, 3000)), signs[:, :100]):
            want = [sum(int(s) * x for s, x in zip(row, _ints(vec), strict=False)) % P for row in cs]
            assert _ints(F.small_matvec(cs.astype(np.float32), vec[: cs.shape[1]], coeff_max=1)) == want
    with pytest.raises(ValueError, match="too large"):
        F.small_matvec(np.ones((1, 1 << 24), dtype=np.float32), np.zeros(1 << 24, dtype=np.uint64), coeff_max=1)
    ints = [-5, 0, 7, -(1 << 40), 1 << 59]
    assert _ints(F.to_signed(F.from_signed(np.array(ints)))) == ints


def test_the_compiled_sums_and_row_products_agree_with_python_integers() -> None:
    """sum_along and rowdot fold a running sum every few terms: the worst case (every element
    p − 1), broadcasting of a shared weight row, any axis, and an empty axis."""
    rng = np.random.default_rng(11)
    a = rng.integers(0, P, (6, 1001), dtype=np.uint64)
    a[0] = P - 1
    w = rng.integers(0, P, 1001, dtype=np.uint64)
    b = rng.integers(0, P, (6, 1001), dtype=np.uint64)
    b[0] = P - 1
    assert _ints(F.rowdot(a, w)) == [sum(x * y for x, y in zip(_ints(row), _ints(w), strict=True)) % P for row in a]
    assert _ints(F.rowdot(a, b)) == [sum(x * y for x, y in zip(_ints(r), _ints(q), strict=True)) % P
                                     for r, q in zip(a, b, strict=True)]
    assert _ints(F.sum_along(a, axis=1)) == [sum(_ints(row)) % P for row in a]
    assert _ints(F.sum_along(a, axis=0)) == [sum(_ints(col)) % P for col in a.T]
    assert _ints(F.mul(a, w[None, :])[:, :5]) == [x * y % P for row in a for x, y in zip(_ints(row[:5]), _ints(w[:5]),
                                                                                          strict=True)]
    assert F.sum_along(np.zeros((3, 0), dtype=np.uint64), axis=1).tolist() == [0, 0, 0]


@pytest.mark.parametrize("n, m, cols", [(100, 99, 89), (77, 76, 3), (2, 1, 5), (1, 4, 2)])
def test_extending_by_differences_equals_the_lagrange_extension(n: int, m: int, cols: int) -> None:
    """F.extend (Newton's differences, additions only) gives the values at n..n+m−1 of the degree
    < n polynomials through each column, as the extension matrix does, on worst-case elements."""
    rng = np.random.default_rng(n)
    v = rng.integers(0, P, (n, cols), dtype=np.uint64)
    v[0] = P - 1
    assert np.array_equal(F.extend(v, m), F.matvec(F.extension_matrix(n, n + m), v))
    ramp = np.arange(n, dtype=np.uint64)[:, None] * np.ones(cols, dtype=np.uint64)  # f(t) = t (n ≥ 2)
    if n >= 2:
        assert F.extend(ramp, m)[:, 0].tolist() == list(range(n, n + m))


@pytest.mark.parametrize("dim, rows", [(2601, 100), (123, 60), (37, 7), (1, 1)])
def test_projections_read_from_the_keystream_equal_the_materialised_signs(dim: int, rows: int) -> None:
    """project (a prover's R·x over the integers) and project_transposed (a verifier's Rᵀ·v in
    F_p) read the signs from the keystream bytes; they must equal the products with the signs
    projection_signs materialises, byte-aligned rows (a table per byte) or not."""
    from mpc_erm.mpc.projections import project, project_transposed, projection_signs

    key = secrets.token_bytes(32)
    signs = projection_signs(key, dim, rows).astype(np.int64)
    rng = np.random.default_rng(dim)
    v = rng.integers(0, P, rows, dtype=np.uint64)
    v[0], v[-1] = 0, P - 1
    got = _ints(project_transposed(key, dim, rows, v))
    assert got == [sum(int(c) * x for c, x in zip(row, _ints(v), strict=True)) % P for row in signs]
    x = rng.integers(-(1 << 40), 1 << 40, dim)
    assert np.array_equal(project(key, dim, rows, x), signs.T @ x)
    with pytest.raises(ValueError, match="expected"):
        project(key, dim + 1, rows, x)


def test_lagrange_weights_interpolate_and_extend_a_polynomial() -> None:
    coeffs = [secrets.randbelow(P) for _ in range(9)]

    def poly(t: int) -> int:
        return sum(c * pow(t, k, P) for k, c in enumerate(coeffs)) % P

    values = np.array([poly(t) for t in range(9)], dtype=np.uint64)
    r = secrets.randbelow(P - 100) + 100
    assert int(F.dot(F.lagrange_at(9, r), values)) == poly(r)
    assert _ints(F.lagrange_at(9, 4)) == [0, 0, 0, 0, 1, 0, 0, 0, 0]
    assert _ints(F.matvec(F.extension_matrix(9, 20), values)) == [poly(t) for t in range(9, 20)]


def _opened(left: np.ndarray, right: np.ndarray, proof: np.ndarray, layout: flp.Layout, r: int) -> flp.Openings:
    parts = [N.split(v) for v in (left, right, proof)]
    total = np.zeros(layout.opened, dtype=np.uint64)
    for i in range(3):
        total = F.add(total, flp.query_share(parts[0][i], parts[1][i], parts[2][i], layout, r).vector())
    return flp.Openings.from_vector(total, layout)


@pytest.mark.parametrize("layout", [flp.Layout.balanced(400), flp.Layout.of_width(3000, 5)],
                         ids=["one piece", "pieces"])
def test_the_linear_proof_accepts_true_products_and_refuses_any_altered_proof_element(layout: flp.Layout) -> None:
    rng = np.random.default_rng(3)
    n = layout.slots
    left = rng.integers(0, P, n, dtype=np.uint64)
    right = rng.integers(0, P, n, dtype=np.uint64)
    for wires in ((left, right), (left, left)):  # products, and squares (their own extension path)
        proof = flp.prove(*wires, layout)
        assert len(proof) == layout.proof_length
        truth = F.sum_along(F.mul(layout.grid(wires[0]), layout.grid(wires[1])).reshape(-1, layout.width), axis=1)
        assert _ints(layout.outputs(proof)) == _ints(truth[: layout.calls])
        r = secrets.randbelow(P - 10_000) + 10_000
        assert flp.accept(_opened(*wires, proof, layout, r))
        for at in rng.choice(np.arange(layout.proof_length), 12, replace=False):  # seeds, outputs, Π(r) alike
            bad = proof.copy()
            bad[at] = F.add(bad[at:at + 1], np.array([1 + secrets.randbelow(P - 1)], dtype=np.uint64))[0]
            assert not flp.accept(_opened(*wires, bad, layout, r)), f"proof element {at} altered and accepted"
    with pytest.raises(ValueError, match="nodes"):
        flp.query_share(left, right, proof, layout, 3)


def test_a_wide_layout_splits_its_calls_into_pieces_without_an_empty_one() -> None:
    """The squares at d = 26,010 (c = 36, 723 calls): pieces of about 128 calls, every piece holding
    real calls, every output claimed once; a layout that leaves G ≤ max(c, 128) is one proof."""
    wide = flp.Layout.of_width(26_028, 36)
    assert wide.calls == 723 and wide.pieces == 6 and wide.piece_calls == 121
    assert wide.nodes == 242 and wide.opened == 6 * 73
    for slots, width in [(26_028, 36), (1000, 3), (129 * 7, 7), (128 * 7, 7), (50, 10), (10_000, 1)]:
        lay = flp.Layout.of_width(slots, width)
        assert (lay.pieces - 1) * lay.piece_calls < lay.calls <= lay.pieces * lay.piece_calls
        assert lay.piece_calls <= max(width, flp.MIN_PIECE_CALLS)
    assert flp.Layout.of_width(128 * 7, 7).pieces == 1
    with pytest.raises(ValueError, match="empty piece"):
        flp.Layout(20, 1, pieces=11)  # ⌈20/11⌉ = 2 calls a piece: the eleventh would be empty


def test_an_honest_proof_opens_fresh_uniform_values_each_time() -> None:
    """The opened A(r) carry the prover's seeds: two proofs of the same wires open different values."""
    layout = flp.Layout.balanced(100)
    left = np.arange(100, dtype=np.uint64)
    r = 10**12
    first = _opened(left, left, flp.prove(left, left, layout), layout, r)
    second = _opened(left, left, flp.prove(left, left, layout), layout, r)
    assert flp.accept(first) and flp.accept(second)
    assert not np.array_equal(first.a, second.a)


# ================================================================ the norm proof, end to end
SPEC = N.NormSpec(dim=300, bound=1 << 22, projections=60)  # five chunks of squares
CONTEXT = b"job 7 round 3 owner 12"


def _vector(rng: np.random.Generator, norm: float, spec: N.NormSpec | None = None) -> np.ndarray:
    spec = spec or SPEC
    v = rng.normal(size=spec.dim)
    v *= norm * spec.bound / np.linalg.norm(v)
    x = np.trunc(v).astype(np.int64)  # truncation never increases the norm
    return x


def _keys(sub: N.Submission, context: bytes = CONTEXT) -> tuple[bytes, bytes]:
    return N.keys_for(context, *sub.commitments())


Tamper = Callable[[int, int, np.ndarray], np.ndarray]  # (party, share, its report) → what it sends


def _verify(sub: N.Submission, spec: N.NormSpec | None = None, context: bytes = CONTEXT,
            tamper: Tamper | None = None) -> bool:
    """Three compute parties, each reporting the verifier parts of the two shares it holds; the
    opening takes each share's part from both holders."""
    spec = spec or SPEC
    keys = _keys(sub, context)
    query = N.Query.from_key(secrets.token_bytes(32), spec)
    reports: dict[int, dict[int, np.ndarray]] = {}
    for party in range(3):
        reports[party] = {}
        for share in shares_of(party):
            part = N.verifier_share(share, sub.x[share], sub.aux[share], sub.proof[share], spec, keys, query)
            reports[party][share] = tamper(party, share, part) if tamper else part
    return N.accept(open_verified(reports), spec)


@pytest.mark.parametrize("norm", [0.0, 0.5, 0.999])
def test_an_honest_contributor_is_accepted(norm: float) -> None:
    x = _vector(np.random.default_rng(int(norm * 100)), norm)
    assert _verify(N.prove_norm(x, SPEC, CONTEXT))


def test_a_vector_exactly_at_its_bound_is_accepted_and_an_honest_prover_refuses_one_beyond() -> None:
    x = np.zeros(SPEC.dim, dtype=np.int64)
    x[0] = SPEC.bound
    assert _verify(N.prove_norm(x, SPEC, CONTEXT))
    x[1] = 1
    with pytest.raises(N.NormProofError, match="outside its bound"):
        N.prove_norm(x, SPEC, CONTEXT)


def test_several_chunks_of_squares_at_the_mnist_size() -> None:
    spec = N.NormSpec(dim=7850, bound=1 << 20)
    assert spec.chunks > 1
    x = _vector(np.random.default_rng(5), 0.99, spec)
    sub = N.prove_norm(x, spec, CONTEXT)
    assert _verify(sub, spec)
    assert sub.x[0].size + sub.aux[0].size + sub.proof[0].size == spec.submission_length


def test_a_bound_with_no_room_for_exact_squares_is_refused_naming_the_grid() -> None:
    with pytest.raises(N.NormProofError, match="coarser grid"):
        N.NormSpec(dim=1000, bound=1 << 29)


# ---------------------------------------------------------------- lying contributors
def _forge(x: np.ndarray, aux_of: Callable[[np.ndarray, bytes], np.ndarray],
           proof_edit: Callable[[np.ndarray], np.ndarray] | None = None) -> N.Submission:
    return forge(x, SPEC, CONTEXT, aux_of=lambda v, key, spec: aux_of(v, key), proof_edit=proof_edit)


def _naive_aux(x: np.ndarray, rows_key: bytes) -> np.ndarray:
    return naive_aux(x, rows_key, SPEC)


def _slack_as_field_digit(x: np.ndarray, rows_key: bytes) -> np.ndarray:
    """Every linear identity exact, the slack's negative value carried by a non-bit 'bit'."""
    aux = naive_aux(x, rows_key, SPEC)
    slack_at = SPEC.aux_length - SPEC.sum_bits
    aux[slack_at:] = 0
    squares = sum(int(v) ** 2 for v in x)
    aux[slack_at] = (SPEC.bound ** 2 - squares) % P  # one 'bit' holds all of it
    return aux


def _hide_the_bit_calls(proof: np.ndarray) -> np.ndarray:
    """Claim every bit gadget output is zero, whatever the wires say."""
    out = proof.copy()
    at = SPEC.square_layout.proof_length + 2 * SPEC.bit_layout.width + 1  # the bits' proof: Π(1..G)
    out[at: at + SPEC.bit_layout.calls] = 0
    return out


def _claimed_zero_squares(x: np.ndarray, rows_key: bytes) -> np.ndarray:
    """An aux that claims every square sum is zero (its projections' bits true, the slack M²)."""
    aux = naive_aux(x, rows_key, SPEC)
    zero = N.aux_vector(np.zeros_like(x), SPEC, rows_key)
    lam2 = 2 * SPEC.projections * SPEC.proj_bits
    aux[lam2:] = zero[lam2:]  # the chunk sums' projections and the slack, as if every S_k were 0
    return aux


def _zero_square_outputs(proof: np.ndarray) -> np.ndarray:
    out = proof.copy()
    at = 2 * SPEC.square_layout.width + 1  # the squares' proof: Π(1..G)
    out[at: at + SPEC.square_layout.calls] = 0
    return out


def test_the_forging_path_with_an_honest_aux_is_accepted() -> None:
    """The control for the liars below: their refusals come from their lies, not from the harness."""
    x = _vector(np.random.default_rng(11), 0.95)
    assert _verify(_forge(x, lambda v, k: N.aux_vector(v, SPEC, k)))


LIARS: dict[str, Callable[[np.random.Generator], tuple[np.ndarray, N.Submission | None]]] = {}


def _liar(name: str) -> Callable:
    def register(fn: Callable) -> Callable:
        LIARS[name] = fn
        return fn
    return register


@_liar("over the bound, values reduced into range")
def _over(rng: np.random.Generator) -> N.Submission:
    x = _vector(rng, 1.0 + rng.uniform(0.01, 3.0))
    return _forge(x, _naive_aux)


@_liar("one coordinate that wraps the squares")
def _wrap(rng: np.random.Generator) -> N.Submission:
    x = _vector(rng, 0.3)
    x[rng.integers(SPEC.dim)] = int(rng.choice([1 << 31, 1 << 40, P // 2, (1 << 61) - 1 - 5]))
    return _forge(x, _naive_aux)


@_liar("negative slack carried by a non-bit")
def _digit(rng: np.random.Generator) -> N.Submission:
    return _forge(_vector(rng, 1.0 + rng.uniform(0.05, 1.0)), _slack_as_field_digit)


@_liar("non-bit and a proof that hides it")
def _hidden(rng: np.random.Generator) -> N.Submission:
    return _forge(_vector(rng, 1.0 + rng.uniform(0.05, 1.0)), _slack_as_field_digit, proof_edit=_hide_the_bit_calls)


@_liar("square sums understated")
def _under(rng: np.random.Generator) -> N.Submission:
    return _forge(_vector(rng, 1.5), _claimed_zero_squares)


@_liar("square sums understated, in the proof too")
def _under_proved(rng: np.random.Generator) -> N.Submission:
    return _forge(_vector(rng, 1.5), _claimed_zero_squares, proof_edit=_zero_square_outputs)


@_liar("a random proof element altered")
def _altered(rng: np.random.Generator) -> N.Submission:
    at = int(rng.integers(SPEC.proof_length))  # a seed or a value of either proof

    def edit(proof: np.ndarray) -> np.ndarray:
        out = proof.copy()
        out[at] = F.add(out[at:at + 1], np.array([1 + int(rng.integers(P - 1))], dtype=np.uint64))[0]
        return out
    return _forge(_vector(rng, 0.8), lambda x, k: N.aux_vector(x, SPEC, k), proof_edit=edit)


@_liar("an honest proof replayed in another round")
def _replay(rng: np.random.Generator) -> N.Submission:
    return N.prove_norm(_vector(rng, 0.8), SPEC, b"job 7 round 2 owner 12")


@_liar("shares of another vector than the one proved")
def _swap(rng: np.random.Generator) -> N.Submission:
    honest = N.prove_norm(_vector(rng, 0.8), SPEC, CONTEXT)
    other = N.split(F.from_signed(_vector(rng, 3.0)))
    return N.Submission(other, honest.aux, honest.proof, honest.salts)


def _party_flips_one_word(party: int, share: int, seed: int) -> Tamper:
    def tamper(p: int, s: int, part: np.ndarray) -> np.ndarray:
        if (p, s) != (party, share):
            return part
        out = part.copy()
        at = seed % out.size
        out[at] = np.uint64(int(out[at]) ^ (1 << (seed % 61)))
        return out
    return tamper


def _party_claims_zero(party: int, share: int) -> Tamper:
    """The deviating party reports the part that would make the opened C zero and the FLP hold."""
    def tamper(p: int, s: int, part: np.ndarray) -> np.ndarray:
        return np.zeros_like(part) if (p, s) == (party, share) else part
    return tamper


def test_a_seeded_campaign_of_lying_contributors_and_deviating_parties_is_refused_every_time() -> None:
    """240 trials: every lie of a contributor is refused by the opened check; every deviation of a
    compute party in what it reports is caught by the share's second holder (with honest and
    dishonest contributors alike); honest trials in between are accepted."""
    kinds = [*LIARS, "party flips a bit", "party reports zero", "honest"]
    refused = {k: 0 for k in kinds}
    trials = {k: 0 for k in kinds}
    for seed in range(240):
        rng = np.random.default_rng(seed)
        kind = kinds[seed % len(kinds)]
        trials[kind] += 1
        if kind in LIARS:
            refused[kind] += not _verify(LIARS[kind](rng))
            continue
        if kind == "honest":
            refused[kind] += not _verify(N.prove_norm(_vector(rng, 0.9), SPEC, CONTEXT))
            continue
        honest_owner = seed % 2 == 1
        sub = N.prove_norm(_vector(rng, 0.9), SPEC, CONTEXT) if honest_owner else _over(rng)
        party = seed % 3
        share = shares_of(party)[seed // 3 % 2]
        flips = kind == "party flips a bit"
        tamper = _party_flips_one_word(party, share, seed) if flips else _party_claims_zero(party, share)
        with pytest.raises(OpeningMismatch) as caught:
            _verify(sub, tamper=tamper)
        assert party in caught.value.parties
        refused[kind] += 1
    assert refused["honest"] == 0, "an honest contributor was refused"
    missed = {k: trials[k] - refused[k] for k in kinds if k != "honest" and refused[k] != trials[k]}
    assert not missed, f"deviations that went through: {missed}"
    assert sum(trials.values()) == 240 and min(trials.values()) >= 20


@pytest.mark.parametrize("dim, bound", [(7850, 1 << 23), (26010, 1 << 23)])
def test_every_lie_is_refused_in_the_other_shapes_of_the_statement(monkeypatch: pytest.MonkeyPatch, dim: int,
                                                                    bound: int) -> None:
    """SPEC bounds its chunk sums by bits, with one-sided projection ranges; a larger bound makes
    the chunks many and small: bounded by rows over their sums, and (at d = 26,010) two-sided
    ranges. Every liar once per shape, an honest contributor accepted."""
    spec = N.NormSpec(dim=dim, bound=bound)
    assert spec.q_projections and spec.chunks > 100
    monkeypatch.setattr(sys.modules[__name__], "SPEC", spec)
    rng = np.random.default_rng(dim)
    assert _verify(N.prove_norm(_vector(rng, 0.9), spec, CONTEXT))
    for name, liar in LIARS.items():
        assert not _verify(liar(rng)), name


@pytest.mark.parametrize("dim, bound", [(300, 1 << 22), (122, 1 << 10), (7850, 1 << 20), (7850, 1 << 23),
                                        (26010, 1 << 23)])
def test_the_folded_check_is_the_combination_of_every_identity(dim: int, bound: int) -> None:
    """verifier_share folds θ·residuals into one weight vector per part (rows applied once, as
    Rᵀθ): for every shape, honest and garbage shares alike, it is the same field element."""
    spec = N.NormSpec(dim, bound)
    rng = np.random.default_rng(dim + bound)
    sub = N.prove_norm(_vector(rng, 0.7, spec), spec, CONTEXT)
    keys = _keys(sub)
    query = N.Query.from_key(secrets.token_bytes(32), spec)
    garbage = tuple(F.from_words(rng.integers(0, 2**63, size=n, dtype=np.int64).view(np.uint64).copy())
                    for n in (spec.dim, spec.aux_length, spec.proof_length))
    for s in range(3):
        for x, aux, proof in ((sub.x[s], sub.aux[s], sub.proof[s]), garbage):
            folded = N.verifier_share(s, x, aux, proof, spec, keys, query)[0]
            written_out = F.dot(query.weights, N._residuals(x, aux, proof, keys[0], spec, s == 0))
            assert int(folded) == int(written_out), (s, spec.shape)


def test_with_rows_drawn_by_the_verifiers_after_the_shares_an_honest_contributor_passes_and_a_liar_does_not() -> None:
    """The two-message proof (deal_input, then prove_dealt once the verifiers' rows are known):
    one set of rows for every contributor of a round. Honest vectors pass; a vector beyond its
    bound, its aux made by the honest recipe reduced into range (the forger), fails every time."""
    from tests.mpc.forgery import forge

    rng = np.random.default_rng(11)
    for trial in range(12):
        rows_key = secrets.token_bytes(32)  # the verifiers' coins, drawn after the shares were committed
        x = _vector(rng, 0.9)
        dealt = N.deal_input(x, SPEC)
        sub = N.prove_dealt(dealt, x, SPEC, rows_key)
        assert sub.x == dealt.x and _verify_rows(sub, rows_key), trial
        liar = forge(_vector(rng, 4.0), SPEC, CONTEXT, rows_key=rows_key)
        assert not _verify_rows(liar, rows_key), trial


def test_a_batch_of_contributors_is_checked_as_each_one_alone() -> None:
    """verifier_shares over stacked shares (one set of rows, one query, each contributor its own ρ)
    gives every contributor the vector verifier_share gives it alone; the honest ones pass, a
    liar among them fails, and only it."""
    from tests.mpc.forgery import forge

    rng = np.random.default_rng(5)
    rows_key = secrets.token_bytes(32)
    subs = []
    for _ in range(5):
        x = _vector(rng, 0.9)
        subs.append(N.prove_dealt(N.deal_input(x, SPEC), x, SPEC, rows_key))
    subs.insert(2, forge(_vector(rng, 4.0), SPEC, CONTEXT, rows_key=rows_key))
    keys = [(rows_key, N.rho_key_for(rows_key, sub.commitments()[1])) for sub in subs]
    rho = np.stack([N.rho(k[1], SPEC) for k in keys])
    query = N.Query.from_key(secrets.token_bytes(32), SPEC)
    batch = {s: N.verifier_shares(s, np.stack([u.x[s] for u in subs]), np.stack([u.aux[s] for u in subs]),
                                  np.stack([u.proof[s] for u in subs]), SPEC, rows_key, rho, query) for s in range(3)}
    for i, (sub, k) in enumerate(zip(subs, keys, strict=True)):
        for s in range(3):
            alone = N.verifier_share(s, sub.x[s], sub.aux[s], sub.proof[s], SPEC, k, query)
            assert np.array_equal(batch[s][i], alone), (i, s)
        opened = F.add(F.add(batch[0][i], batch[1][i]), batch[2][i])
        assert N.accept(opened, SPEC) == (i != 2), i


@pytest.mark.parametrize("dim, bound", [(300, 10_000), (2601, 1 << 22), (2000, 1 << 23)])
def test_contributors_with_their_own_rows_are_checked_together_as_each_one_alone(dim: int, bound: int) -> None:
    """stacked_check_weights + verifier_shares (each contributor its own Fiat–Shamir rows, as data
    owners prove) gives every contributor the vector verifier_share gives it alone; a liar among
    them fails, and only it. The larger statements have several chunks; in the last their square
    sums are bounded by rows too, whose weights differ by contributor as well."""
    from tests.mpc.forgery import forge

    spec = N.NormSpec(dim, bound)
    rng = np.random.default_rng(9)

    def vec(scale: float) -> np.ndarray:
        v = rng.standard_normal(dim)
        return np.round(v * (scale * bound / np.linalg.norm(v))).astype(np.int64)

    contexts = [f"owner {i}".encode() for i in range(5)]
    subs = [N.prove_norm(vec(0.9), spec, c) for c in contexts]
    subs[3] = forge(vec(4.0), spec, contexts[3])
    keys = [N.keys_for(c, *sub.commitments()) for c, sub in zip(contexts, subs, strict=True)]
    query = N.Query.from_key(secrets.token_bytes(32), spec)
    check = N.stacked_check_weights([k[0] for k in keys], spec, query.key)
    rho = np.stack([N.rho(k[1], spec) for k in keys])
    batch = {s: N.verifier_shares(s, np.stack([u.x[s] for u in subs]), np.stack([u.aux[s] for u in subs]),
                                  np.stack([u.proof[s] for u in subs]), spec, b"", rho, query, check=check)
             for s in range(3)}
    for i, (sub, k) in enumerate(zip(subs, keys, strict=True)):
        for s in range(3):
            assert np.array_equal(batch[s][i], N.verifier_share(s, sub.x[s], sub.aux[s], sub.proof[s], spec, k,
                                                                query)), (i, s)
        assert N.accept(F.add(F.add(batch[0][i], batch[1][i]), batch[2][i]), spec) == (i != 3), i


def _verify_rows(sub: N.Submission, rows_key: bytes) -> bool:
    keys = (rows_key, N.rho_key_for(rows_key, sub.commitments()[1]))
    query = N.Query.from_key(secrets.token_bytes(32), SPEC)
    reports = {party: {share: N.verifier_share(share, sub.x[share], sub.aux[share], sub.proof[share], SPEC, keys,
                                               query) for share in shares_of(party)} for party in range(3)}
    return N.accept(open_verified(reports), SPEC)


@pytest.mark.parametrize("dim, rows", [(2601, 100), (123, 60), (7, 3), (1, 1)])
def test_the_projection_signs_are_two_keystream_bits_per_coefficient(dim: int, rows: int) -> None:
    """projection_signs decodes a byte at a time; the rule it must keep: bits 2t and 2t + 1 of the
    AES-CTR keystream (little-endian words), 00 → −1, 11 → +1, else 0 — the same rows for the
    prover, the verifiers and the in-MPC check."""
    from mpc_erm.mpc.keystream import KeyedMasks
    from mpc_erm.mpc.projections import projection_signs

    key = secrets.token_bytes(32)
    words = KeyedMasks().words(key, 0, -(-dim * rows // 32)).numpy()
    stream = [(int(w) >> i) & 1 for w in words.view(np.uint64) for i in range(64)]
    want = np.array([stream[2 * t] + stream[2 * t + 1] - 1 for t in range(dim * rows)]).reshape(dim, rows)
    assert np.array_equal(projection_signs(key, dim, rows), want)
    assert np.array_equal(projection_signs(key, dim, rows, np.float64), want.astype(np.float64))
