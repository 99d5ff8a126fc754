"""A lying prover for the malicious-secure mode's tests, harness and campaign: it proves a vector
beyond its bound by the honest recipe applied to it, every value reduced into range (projection
bits mod 2^K, square sums and slack mod 2^J), knowing the Fiat–Shamir keys exactly as an honest
prover does. The verifiers must refuse what it sends."""

from __future__ import annotations

from typing import Any

import numpy as np

from mpc_erm.mpc import field as F
from mpc_erm.mpc import norm_proof as N


def naive_aux(x: np.ndarray, rows_key: bytes, spec: N.NormSpec) -> np.ndarray:
    rows = N.rows_for(rows_key, spec).astype(np.int64)
    y = np.mod(rows @ x + (1 << (spec.proj_bits - 1)), 1 << spec.proj_bits)
    q = [sum(int(v) ** 2 for v in x[k * spec.chunk:(k + 1) * spec.chunk]) % F.P for k in range(spec.chunks)]
    q_in = [v % (1 << spec.sum_bits) for v in q]
    slack = (spec.bound ** 2 - sum(q)) % (1 << spec.sum_bits)
    return np.concatenate([np.array(q, dtype=np.uint64), N.bits_of(y, spec.proj_bits).ravel(),
                           N.bits_of(np.array(q_in, dtype=np.int64), spec.sum_bits).ravel(),
                           N.bits_of(np.array([slack], dtype=np.int64), spec.sum_bits).ravel()]).astype(np.uint64)


def forge(x: np.ndarray, spec: N.NormSpec, context: bytes, aux_of: Any = naive_aux,
          proof_edit: Any = None) -> N.Submission:
    """The protocol's steps with an aux of the liar's choosing (and, optionally, an edited proof)."""
    import secrets

    xs = N.split(F.from_signed(x))
    salts = tuple(secrets.token_bytes(N.SALT_BYTES) for _ in xs)
    rows_key, _ = N.keys_for(context, [N.commitment(i, s, salts[i]) for i, s in enumerate(xs)], [])
    aux = aux_of(x, rows_key, spec)
    auxs = N.split(aux)
    keys = N.keys_for(context, *N.Submission(xs, auxs, (), salts).commitments())
    proof = N.prove_wires(*N.wires(F.from_signed(x), aux, N.rho(keys[1], spec), spec, first=True), spec)
    if proof_edit is not None:
        proof = proof_edit(proof)
    return N.Submission(xs, auxs, N.split(proof), salts)
