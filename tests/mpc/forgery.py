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
    """The honest recipe applied to any vector, every value reduced into its bits' range."""
    rows = N.rows_for(rows_key, spec).astype(np.int64).astype(object)
    k = spec.proj_bits
    y = rows @ x.astype(object)
    parts = [N.bits_of(np.array([(int(v) + off) % (1 << k) for v in y], dtype=np.int64), k).ravel()
             for off in spec.projection_offsets]
    sums = [sum(int(v) ** 2 for v in x[c * spec.chunk:(c + 1) * spec.chunk]) % F.P for c in range(spec.chunks)]
    if spec.chunks > 1:
        if spec.q_projections:
            half = 1 << (spec.q_bits - 1)
            z = [int(v) + half for v in N.q_rows_for(rows_key, spec).astype(np.int64).astype(object)
                 @ np.array(sums, dtype=object)]
        else:
            z = sums
        parts.append(N.bits_of(np.array([v % (1 << spec.q_bits) for v in z], dtype=np.int64), spec.q_bits).ravel())
    slack = (spec.bound ** 2 - sum(sums)) % (1 << spec.sum_bits)
    parts.append(N.bits_of(np.array([slack], dtype=np.int64), spec.sum_bits).ravel())
    return np.concatenate(parts).astype(np.uint64)


def forge(x: np.ndarray, spec: N.NormSpec, context: bytes, aux_of: Any = naive_aux,
          proof_edit: Any = None, rows_key: bytes | None = None) -> N.Submission:
    """The protocol's steps with an aux of the liar's choosing (and, optionally, an edited proof);
    ``rows_key``: the verifiers' rows (the two-message proof), drawn after x's shares were fixed."""
    import secrets

    seeds = (secrets.token_bytes(N.SALT_BYTES), secrets.token_bytes(N.SALT_BYTES))
    xs = N.split(F.from_signed(x), seeds=seeds, part=0)
    salts = tuple(secrets.token_bytes(N.SALT_BYTES) for _ in xs)
    if rows_key is None:
        rows_key, _ = N.keys_for(context, [N.commitment(i, s, salts[i]) for i, s in enumerate(xs)], [])
    aux = aux_of(x, rows_key, spec)
    auxs = N.split(aux, seeds=seeds, part=1)
    rho_key = N.rho_key_for(rows_key, N.Submission(xs, auxs, (), salts).commitments()[1])
    proof = N.prove_wires(*N.wires(F.from_signed(x), aux, N.rho(rho_key, spec), spec, first=True), spec)
    if proof_edit is not None:
        proof = proof_edit(proof)
    return N.Submission(xs, auxs, N.split(proof, seeds=seeds, part=2), salts, seeds)
