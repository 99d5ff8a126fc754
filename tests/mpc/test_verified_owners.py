"""Data owners in the malicious-secure mode (mpc_erm.mpc.verified_aggregator.aggregate_owners with
parties.owner.verified_shares) between three real compute-party processes over gRPC + mutual TLS.

The owners' submissions are made here, once, as their clients make them (keys given at enrolment,
one explicit share a round); each compute party holds what its intake would: the two shares it
derives or receives, the explicit one forwarded by its first holder. Cases:

- honest owners, zero noise: the release is exactly the sum of their contributions;
- an owner over its bound with a forged proof, and an owner that gave one holder of a derived share
  another key: the first is refused, the second left out, at every party, and the release is the
  honest owners' sum;
- bob forwards an altered copy of an explicit share: every party stops naming bob and alice (the
  share's first holder forwards it to its second), nothing is revealed;
- a seeded campaign: 80 rounds, three owners a round deviating in one of ten ways (a forged proof
  over the bound, a replayed share, shares under other keys, keys split between two holders, a bit
  flipped in the salt, x, aux or proof, a proof bound to another owner or round): 240 deviations,
  every one refused or left out at every party, every release exactly the honest owners' sum.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

import numpy as np
import pytest
import torch

from parties.owner import verified_shares as VS
from tests.mpc.forgery import naive_aux
from tests.mpc.test_mpc_aggregator import run_job

DIM = 200
BOUND = 4.0  # every owner's public ℓ2 bound, real units
GRID = 16
NOISE = dict(mechanism="gaussian", scale=2.0, grid_bits=GRID)
OWNERS = 8
LIAR, SPLITTER = 5, 6  # over its bound with a forged proof; another key to one holder of a derived share
JOB = "verified-owners"
CASES = ("honest owners", "a liar and a splitter", "bob alters a forwarded share")


def _units(o: int, scale: float) -> np.ndarray:
    v = np.random.default_rng(100 + o).standard_normal(DIM)
    return np.round(v * (scale * BOUND / np.linalg.norm(v)) * 2.0**GRID).astype(np.int64)


def _submissions(case: str) -> dict[str, Any]:
    """What every owner sends for the case's round: keys by share (as each holder has them) and the
    explicit share's words."""
    from mpc_erm.mpc import norm_proof as N
    from mpc_erm.mpc.verified_grid import owner_statement

    spec = owner_statement(BOUND, DIM, GRID)
    t = CASES.index(case)
    out: dict[str, Any] = {"units": {}, "keys": {}, "payload": {}, "M": spec.bound}
    for o in range(OWNERS):
        e = o % 3
        keys = {j: hashlib.sha256(f"{case}|{o}|{j}".encode()).digest() for j in range(3) if j != e}
        liar = case == CASES[1] and o == LIAR
        x = _units(o, 6.0 if liar else 0.9)
        real_aux = N.aux_vector
        if liar:  # the honest recipe applied to an out-of-bound vector, every value reduced into range
            N.aux_vector = lambda x, spec, rows_key: naive_aux(x, rows_key, spec)  # type: ignore[assignment]
        try:
            _, words = VS.prove_contribution(x, keys, t, spec, VS.owner_context(JOB, t, o))
        finally:
            N.aux_vector = real_aux  # type: ignore[assignment]
        held_keys = {j: (k, k) for j, k in keys.items()}  # share j's key at its two holders
        if case == CASES[1] and o == SPLITTER:
            j = next(iter(keys))
            held_keys[j] = (keys[j], secrets.token_bytes(32))
        out["units"][o], out["keys"][o], out["payload"][o] = x, held_keys, words
    return out


def _party(rank: int, table: Any, identity: Any, server: Any, rounds: list[dict[str, Any]],
           altered: int | None = None) -> dict[str, Any]:
    """One compute party's rounds over the owners' submissions, holding what its intake would (the
    explicit share received or forwarded, the others derived from the keys its holders have), with
    zero noise on the real grid; in round ``altered`` bob forwards alice the explicit shares of
    his owners altered. Each round's outcome: ("ok", release, kept, refused, left out, grid bits)
    or ("deviation", the message)."""
    import mpc_erm.mpc.verified_aggregator as V
    from mpc_erm.mpc.communicator import init_crypten, uninit_crypten
    from mpc_erm.mpc.local_noise import DistributedNoise
    from mpc_erm.mpc.norm_proof import NormSpec
    from mpc_erm.mpc.replicated_open import holders, shares_of
    from mpc_erm.mpc.transport import TransportOptions
    from mpc_erm.protocols.aggregation import NoiseSpec

    class Silent(DistributedNoise):
        def take(self, p: int, spec: NoiseSpec) -> torch.Tensor:
            super().take(p, spec)
            return torch.zeros(p, dtype=torch.long)

    def share(sub: dict[str, Any], o: int, s: int, t: int, statement: NormSpec) -> np.ndarray:
        if s != o % 3:  # derived from the key this holder was given
            return VS.derived_share(sub["keys"][o][s][0 if rank == holders(s)[0] else 1], t, statement)
        words = sub["payload"][o].copy()
        if t == altered and rank == 0 and o % 3 == 1:  # bob forwards it to alice, altered
            words[VS.SALT_WORDS + 3] ^= np.uint64(1)
        return words

    comm = init_crypten(table, identity.name, identity, server=server, options=TransportOptions(deadline_s=30))
    spec = NoiseSpec(**NOISE)  # type: ignore[arg-type]
    outcomes: list[tuple[Any, ...]] = []
    try:
        agg = V.VerifiedAggregator(Silent(), (0.0,) * 3, comm)
        for t, sub in enumerate(rounds):
            statement = NormSpec(DIM, sub["M"])
            held = {o: {s: share(sub, o, s, t, statement) for s in shares_of(rank)} for o in range(OWNERS)}
            owners = V.OwnerShares(statement, tuple(range(OWNERS)), held,
                                   context=lambda o, t=t: VS.owner_context(JOB, t, o), explicit=lambda o: o % 3)
            agg._counter = t
            try:
                out, verdicts = agg.aggregate_owners(owners, DIM, spec)
                outcomes.append(("ok", out.numpy(), verdicts.kept, verdicts.refused, verdicts.left_out,
                                 agg.precision_bits))
            except V.DeviationDetected as exc:
                outcomes.append(("deviation", str(exc)))
    finally:
        uninit_crypten()
    return {"outcomes": outcomes}


@pytest.fixture(scope="module")
def reports() -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    rounds = [_submissions(case) for case in CASES]
    return run_job(_party, 3, timeout=240.0, rounds=rounds, altered=CASES.index(CASES[2])), rounds


def test_honest_owners_released_exactly_at_every_party(reports: Any) -> None:
    reps, rounds = reports
    for r in range(3):
        kind, out, kept, refused, left_out, g = reps[r]["outcomes"][0]
        assert kind == "ok" and kept == list(range(OWNERS)) and refused == [] and left_out == []
        want = sum(rounds[0]["units"][o] for o in range(OWNERS)) / 2.0**g
        assert g == GRID and np.array_equal(out, want)


def test_a_lying_owner_is_refused_and_a_splitting_owner_left_out_at_every_party(reports: Any) -> None:
    reps, rounds = reports
    honest = [o for o in range(OWNERS) if o not in (LIAR, SPLITTER)]
    for r in range(3):
        kind, out, kept, refused, left_out, g = reps[r]["outcomes"][1]
        assert kind == "ok", out
        assert (kept, refused, left_out) == (honest, [LIAR], [SPLITTER]), r
        want = sum(rounds[1]["units"][o] for o in honest) / 2.0**g
        assert np.array_equal(out, want)


def test_a_compute_party_that_alters_a_forwarded_share_stops_every_party(reports: Any) -> None:
    reps, _ = reports
    for r in range(3):
        kind, message = reps[r]["outcomes"][2][:2]
        assert kind == "deviation", f"party {r} released in {CASES[2]!r}"
        assert "explicit share reached" in message and "alice" in message and "bob" in message, message
        assert "nothing is revealed" in message


# ---------------------------------------------------------------- a seeded campaign of deviating owners

CAMPAIGN_ROUNDS = 80
DEVIANTS_PER_ROUND = 3
KINDS = ("forged", "replay", "foreign keys", "split keys", "flip x", "flip aux", "flip proof", "flip salt",
         "another owner's proof", "another round's proof")


def _campaign() -> list[dict[str, Any]]:
    """Every round's submissions, three owners (drawn by a seeded generator) deviating in a kind
    drawn the same way: what they send is made here as a deviating client would make it."""
    from mpc_erm.mpc import norm_proof as N
    from mpc_erm.mpc.verified_grid import owner_statement

    spec = owner_statement(BOUND, DIM, GRID)
    rng = np.random.default_rng(2026)
    rounds: list[dict[str, Any]] = []
    for t in range(CAMPAIGN_ROUNDS):
        deviants = {int(o): KINDS[int(k)] for o, k in zip(rng.choice(OWNERS, DEVIANTS_PER_ROUND, replace=False),
                                                         rng.integers(len(KINDS), size=DEVIANTS_PER_ROUND))}
        if t == 0:  # nothing to replay yet
            deviants = {o: ("forged" if k == "replay" else k) for o, k in deviants.items()}
        out: dict[str, Any] = {"units": {}, "keys": {}, "payload": {}, "M": spec.bound, "deviants": deviants}
        for o in range(OWNERS):
            e = o % 3
            keys = {j: hashlib.sha256(f"campaign|{o}|{j}".encode()).digest() for j in range(3) if j != e}
            kind = deviants.get(o)
            x = _units(o + 31 * t, 6.0 if kind == "forged" else 0.9)
            prove_keys = {j: secrets.token_bytes(32) for j in keys} if kind == "foreign keys" else keys
            context = VS.owner_context(JOB, t + 1 if kind == "another round's proof" else t,
                                       (o + 1) % OWNERS if kind == "another owner's proof" else o)
            real_aux = N.aux_vector
            if kind == "forged":
                N.aux_vector = lambda x, spec, rows_key: naive_aux(x, rows_key, spec)  # type: ignore[assignment]
            try:
                _, words = VS.prove_contribution(x, prove_keys, t, spec, context)
            finally:
                N.aux_vector = real_aux  # type: ignore[assignment]
            if kind == "replay":
                words = rounds[t - 1]["payload"][o].copy()
            segments = {"flip salt": (0, VS.SALT_WORDS), "flip x": (VS.SALT_WORDS, VS.SALT_WORDS + DIM),
                        "flip aux": (VS.SALT_WORDS + DIM, VS.SALT_WORDS + DIM + spec.aux_length),
                        "flip proof": (VS.SALT_WORDS + DIM + spec.aux_length, words.size)}
            if kind in segments:
                lo, hi = segments[kind]
                words = words.copy()
                words[int(rng.integers(lo, hi))] ^= np.uint64(1) << np.uint64(int(rng.integers(0, 61)))
            held_keys = {j: (k, k) for j, k in keys.items()}
            if kind == "split keys":
                j = next(iter(keys))
                held_keys[j] = (keys[j], secrets.token_bytes(32))
            out["units"][o], out["keys"][o], out["payload"][o] = x, held_keys, words
        rounds.append(out)
    return rounds


def test_a_seeded_campaign_of_deviating_owners_none_counted_every_release_exact() -> None:
    """240 deviations over 80 rounds (ten kinds, three owners a round): every deviating owner is
    refused, or left out where it split its keys, at every compute party, and every release is
    exactly the honest owners' sum (zero noise)."""
    rounds = _campaign()
    reps = run_job(_party, 3, timeout=600.0, rounds=rounds)
    caught = 0
    for t, sub in enumerate(rounds):
        deviants = sub["deviants"]
        honest = [o for o in range(OWNERS) if o not in deviants]
        split = sorted(o for o, k in deviants.items() if k == "split keys")
        refused = sorted(o for o, k in deviants.items() if k != "split keys")
        for r in range(3):
            kind, out, kept, got_refused, left_out, g = reps[r]["outcomes"][t]
            assert kind == "ok", (t, deviants, r, out)
            assert (kept, sorted(got_refused), sorted(left_out)) == (honest, refused, split), (t, deviants, r)
            assert np.array_equal(out, sum(sub["units"][o] for o in honest) / 2.0**g), (t, deviants)
        caught += len(deviants)
    assert caught == CAMPAIGN_ROUNDS * DEVIANTS_PER_ROUND
