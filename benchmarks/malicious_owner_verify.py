"""What checking data owners' norm proofs costs a compute party, per owner, in the
malicious-secure mode (the intake runs ``fiat_shamir_batched``).

    python -m benchmarks.malicious_owner_verify --owners 1000 --dim 7850 \
        --out benchmarks/results/malicious_owner_verify.json

Each owner proves ‖v‖₂ ≤ M over replicated F_p shares (:mod:`mpc_erm.mpc.norm_proof`), as a
compute party does in the malicious-secure aggregate. A compute party holds two of each owner's
three shares: it expands the seeded ones, hashes both (the holders compare the hashes), and
computes its two verifier parts. Two ways to draw the projection rows, measured in one run:

* ``fiat_shamir`` — each owner's rows keyed by a hash of its own shares (one message per owner and
  round, as the compute parties' own inputs are proved today): every owner brings its own λ × d
  rows, drawn and applied per owner;
* ``shared_rows`` — one set of rows per round, drawn by the compute parties' coins after every
  owner's shares are committed (a second message from each owner per round: its aux and proof,
  made once the rows are known): the rows are drawn once and enter each owner's check as
  ⟨Rᵀθ, x⟩ (:func:`~mpc_erm.mpc.norm_proof.check_weights`);
* ``shared_rows_batched`` — the same rows, the owners' shares stacked 32 at a time and checked by
  :func:`~mpc_erm.mpc.norm_proof.verifier_shares` (a few products per batch, not per owner);
* ``fiat_shamir_batched`` — each owner's own rows, the owners stacked 32 at a time with their check
  weights stacked (:func:`~mpc_erm.mpc.norm_proof.stacked_check_weights`): what the daemons' intake
  runs (one message per owner and round).

The baseline is the semi-honest intake's own work per owner (an owner's share expanded from its
AES key and added to the round's sum: :class:`~parties.owner.shares.OwnerShareSum`'s arithmetic),
measured in the same run. Party 0's work is timed (it expands two seeded shares, the most of the
three); one thread; the owners' proving is timed too, on the owner's side.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from threadpoolctl import ThreadpoolController

from benchmarks.aggregate import jsonable, machine_info
from mpc_erm.mpc import norm_proof as N
from mpc_erm.mpc.keystream import KeyedMasks, new_key

CONTEXT = b"benchmark job|round 1|owner "
BATCH = 32


def _owner_vector(rng: np.random.Generator, dim: int, bound: int) -> np.ndarray:
    v = rng.normal(size=dim)
    return np.round(v * (0.9 * bound / float(np.linalg.norm(v)))).astype(np.int64)


def _party0(sub: N.Submission, spec: N.NormSpec, context: bytes, query: N.Query,
            rows_key: bytes | None) -> np.ndarray:
    """Party 0's work for one owner: shares 0 and 1 from their seeds, their hashes, their verifier parts."""
    held = {s: (N.seeded_share(sub.seeds[s], 0, spec.dim), N.seeded_share(sub.seeds[s], 1, spec.aux_length),
                N.seeded_share(sub.seeds[s], 2, spec.proof_length)) for s in (0, 1)}
    xs = [N.commitment(s, held[s][0], sub.salts[s]) for s in (0, 1)]
    auxs = [N.commitment(s, held[s][1], sub.salts[s], b"aux") for s in (0, 1)]
    # the third share's hashes come from the other holders; an honest run's are what the owner made
    x_all, aux_all = sub.commitments()
    assert xs == x_all[:2] and auxs == aux_all[:2]
    keys = N.keys_for(context, x_all, aux_all) if rows_key is None else (rows_key, N.rho_key_for(rows_key, aux_all))
    return np.concatenate([N.verifier_share(s, *held[s], spec, keys, query) for s in (0, 1)])


def _party0_batch(subs: list[N.Submission], spec: N.NormSpec, query: N.Query, rows_key: bytes | None) -> np.ndarray:
    """Party 0's work for every owner at once: each share expanded and hashed per owner, then the
    verifier parts of all owners' share s in one batch (:func:`~mpc_erm.mpc.norm_proof.verifier_shares`);
    ``rows_key`` None: each owner's own Fiat–Shamir rows, their check weights stacked
    (:func:`~mpc_erm.mpc.norm_proof.stacked_check_weights`, what the intake runs)."""
    held = {s: [(N.seeded_share(sub.seeds[s], 0, spec.dim), N.seeded_share(sub.seeds[s], 1, spec.aux_length),
                 N.seeded_share(sub.seeds[s], 2, spec.proof_length)) for sub in subs] for s in (0, 1)}
    weights, own_rows = [], []
    for i, sub in enumerate(subs):
        xs = [N.commitment(s, held[s][i][0], sub.salts[s]) for s in (0, 1)]
        auxs = [N.commitment(s, held[s][i][1], sub.salts[s], b"aux") for s in (0, 1)]
        x_all, aux_all = sub.commitments()
        assert xs == x_all[:2] and auxs == aux_all[:2]
        if rows_key is None:
            keys = N.keys_for(CONTEXT + str(i).encode(), x_all, aux_all)
            own_rows.append(keys[0])
            weights.append(N.rho.__wrapped__(keys[1], spec))
        else:
            weights.append(N.rho(N.rho_key_for(rows_key, aux_all), spec))
    out = []
    for lo in range(0, len(subs), BATCH):  # batches that stay in cache: a thousand stacked shares are 90 MB
        rho = np.stack(weights[lo: lo + BATCH])
        check = N.stacked_check_weights(own_rows[lo: lo + BATCH], spec, query.key) if rows_key is None else None
        parts = [N.verifier_shares(s, *(np.stack([h[part] for h in held[s][lo: lo + BATCH]]) for part in range(3)),
                                   spec, rows_key or b"", rho, query, check=check) for s in (0, 1)]
        out.append(np.concatenate(parts, axis=1))
    return np.concatenate(out)


def _run(owners: int, dim: int, bound: int, shared: bool, seed: int, batched: bool = False) -> dict[str, Any]:
    spec = N.NormSpec(dim, bound)
    rng = np.random.default_rng(seed)
    rows_key = secrets.token_bytes(32) if shared else None
    prove_s: list[float] = []
    subs = []
    for i in range(owners):
        x = _owner_vector(rng, dim, bound)
        tic = time.perf_counter()
        if shared:
            dealt = N.deal_input(x, spec)
            sub = N.prove_dealt(dealt, x, spec, rows_key)  # type: ignore[arg-type]
        else:
            sub = N.prove_norm(x, spec, CONTEXT + str(i).encode())
        prove_s.append(time.perf_counter() - tic)
        subs.append(sub)
    query = N.Query.from_key(secrets.token_bytes(32), spec)
    N.rows_for.cache_clear()
    N.check_weights.cache_clear()
    tic = time.perf_counter()
    if batched:
        _party0_batch(subs, spec, query, rows_key)
    else:
        for i, sub in enumerate(subs):
            _party0(sub, spec, CONTEXT + str(i).encode(), query, rows_key)
    verify = time.perf_counter() - tic
    return {"owners": owners, "statement_bits": spec.bit_count, "field_elements_per_share": spec.submission_length,
            "compute_party_seconds": verify, "compute_party_ms_per_owner": 1e3 * verify / owners,
            "owner_prove_ms_p50": 1e3 * statistics.median(prove_s)}


def _baseline(owners: int, dim: int) -> dict[str, Any]:
    """The semi-honest intake's arithmetic per owner at a deriving party: the share expanded from
    the owner's AES key (its keystream at the round's nonce) and added to the round's sum."""
    masks = KeyedMasks()
    keys = [new_key() for _ in range(owners)]
    total = torch.zeros(dim, dtype=torch.long)
    tic = time.perf_counter()
    for key in keys:
        total += masks.words(key, 1, dim)
    took = time.perf_counter() - tic
    return {"owners": owners, "compute_party_seconds": took, "compute_party_ms_per_owner": 1e3 * took / owners}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--owners", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=7850)
    ap.add_argument("--bound-log2", type=int, default=20, help="M in grid units, as a power of two")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    with ThreadpoolController().limit(limits=1, user_api="blas"):
        base = _baseline(a.owners, a.dim)
        fs = _run(a.owners, a.dim, 1 << a.bound_log2, shared=False, seed=a.seed)
        shared = _run(a.owners, a.dim, 1 << a.bound_log2, shared=True, seed=a.seed)
        batched = _run(a.owners, a.dim, 1 << a.bound_log2, shared=True, seed=a.seed, batched=True)
        fs_batched = _run(a.owners, a.dim, 1 << a.bound_log2, shared=False, seed=a.seed, batched=True)
    out = jsonable({
        "benchmark": "malicious_owner_verify", "machine": machine_info(),
        "command": "python -m benchmarks.malicious_owner_verify " + " ".join(sys.argv[1:] if argv is None else argv),
        "what": (f"one compute party's work per data owner to check {a.owners} owners' norm proofs at d = {a.dim}, "
                 f"M = 2^{a.bound_log2} grid units (two held shares each: expand the seeded ones, hash, verifier "
                 "parts), one thread; the semi-honest intake's arithmetic per owner as the baseline"),
        "semi_honest_intake": base, "fiat_shamir": fs, "shared_rows": shared, "shared_rows_batched": batched,
        "fiat_shamir_batched": fs_batched,
        "fiat_shamir_batched_over_semi_honest": (fs_batched["compute_party_ms_per_owner"]
                                                 / base["compute_party_ms_per_owner"]),
        "fiat_shamir_over_semi_honest": fs["compute_party_ms_per_owner"] / base["compute_party_ms_per_owner"],
        "shared_rows_over_semi_honest": shared["compute_party_ms_per_owner"] / base["compute_party_ms_per_owner"],
        "fiat_shamir_over_shared_rows": fs["compute_party_ms_per_owner"] / shared["compute_party_ms_per_owner"],
        "shared_rows_batched_over_semi_honest": (batched["compute_party_ms_per_owner"]
                                                 / base["compute_party_ms_per_owner"]),
    })
    print(json.dumps({k: v for k, v in out.items() if k != "machine"}, indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
