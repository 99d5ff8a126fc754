"""Benchmark of the in-MPC noise samplers: offline cost and the distribution actually sampled.

    python -m benchmarks sampler --mechanism gaussian --samples 100000 --json
    python -m benchmarks.sampler --mechanism laplace --samples 1000000 --out benchmarks/results/sampler_laplace.json

One run, M parties over gRPC + mTLS on loopback (:func:`mpc_erm.mpc.local.run_local`, trust
"dealer" by default):

1. ``NoisePool.produce(N)`` with the product's parameters (:func:`mpc_erm.mpc.noise.plan_noise`:
   discrete Gaussian / discrete Laplace on the grid 2^-g with the scale ≈ 2^14 grid units) —
   the *offline* cost: samples/s (slowest party), communicator rounds, bytes per sample.
2. The samples are revealed (BENCHMARK ONLY: in a job the noise is never opened) and compared
   with the target: KS distance to the ideal continuous N(0, σ²) / Laplace(b) (at the samples'
   grid values), to the ideal discrete distribution on the grid (N_Z / discrete Laplace) and to
   the exact PMF of the implemented sampler; relative std error (sample std / target std − 1);
   tail masses P(|z| > 3, 4, 5) with z = x / target std against theory; max |z|.
3. ``crypten.randn(N_randn)`` in the same session (CrypTen's Box–Muller, no privacy analysis;
   slow: ~60 s per 10^6 on 2 cores), with the same statistics against N(0, 1).
4. The plaintext reference sampler (same coins, thresholds and selection, numpy) at 10^6
   samples, so the distribution's KS at N = 10^6 is shown even when the MPC run is smaller.

A KS distance of n i.i.d. draws from the target itself is ≈ 0.87/√n at its median
(``ks_iid_median``), so at small N the KS figures are dominated by sampling noise.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.aggregate import jsonable, machine_info, peak_rss_bytes, write_result

MECHANISMS = ("gaussian", "laplace")
SCALE_LOG2 = 14  # noise scale ≈ 2^14 grid units, as mpc_erm.mpc.noise plans it
TAILS = (3, 4, 5)
KS_TARGET = 3e-3
RATE_TARGET = 150_000  # samples/s: discrete Gaussian with 3 parties on 2 cores (Laplace at least as fast)
REF_CHUNK = 1 << 17
DEFAULT_BATCH = 1 << 15  # mpc_erm.mpc.noise.InMpcNoise's default
BASELINE_BATCH = 1 << 17  # the Gaussian's batch before staircase candidates (batch_for gave 4·2^15)


# ---------------------------------------------------------------------- parameters


def sampler_params(mechanism: str, scale: float, parties: int, grid_bits: int | None = None,
                   coin_bits: int | None = None) -> tuple[Any, int, str]:
    """(params, grid_bits, how they were chosen). Default: the product's plan
    (``mpc_erm.mpc.noise.plan_noise``, no sensitivity given: scale ≈ 2^14 grid units);
    ``coin_bits``: the Gaussian's k (a job's realisation picks it from its TV budget)."""
    from mpc_erm.mpc.samplers import DiscreteGaussianParams, DiscreteLaplaceParams

    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, not {mechanism!r}")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be positive and finite, got {scale}")
    if grid_bits is None:
        try:
            from mpc_erm.mpc.noise import plan_noise
            from mpc_erm.protocols.aggregation import NoiseSpec

            plan = plan_noise(NoiseSpec(mechanism, scale, coin_bits=coin_bits), 1, parties)  # type: ignore[arg-type]
            return plan.params, plan.grid_bits, "mpc_erm.mpc.noise.plan_noise (the product's parameters)"
        except ImportError:
            grid_bits = max(0, SCALE_LOG2 - math.floor(math.log2(scale)))
    if mechanism == "gaussian":
        params = DiscreteGaussianParams.for_sigma(scale, grid_bits=grid_bits, **({} if coin_bits is None else
                                                                                 {"k": coin_bits}))
        return params, grid_bits, "DiscreteGaussianParams.for_sigma"
    try:
        from mpc_erm.mpc.noise import LAPLACE_K

        params = DiscreteLaplaceParams.for_scale(scale, grid_bits=grid_bits, k=LAPLACE_K)
    except ImportError:
        params = DiscreteLaplaceParams.for_scale(scale, grid_bits=grid_bits)
    return params, grid_bits, "DiscreteLaplaceParams.for_scale"


def describe_params(params: Any) -> dict[str, Any]:
    from mpc_erm.mpc.samplers import DiscreteGaussianParams

    if isinstance(params, DiscreteGaussianParams):
        return {"kind": "discrete Gaussian (CKS rejection from discrete Laplace, exact coins)", "t": params.t,
                "mu": params.mu, "sigma_grid_units": params.sigma,
                "selection": "revealed rejection" if params.revealed else "oblivious rounds",
                "rounds_R": None if params.revealed else params.rounds,
                "candidates_per_output": params.candidates_per_output(), "k": params.k,
                "laplace_bits": params.magnitude_bits, "fair_bits": params.fair_bits,
                "proposal_coins": len(params.proposal_thresholds), "compared_coins": params.compared_coins,
                "grid_bits": params.grid_bits, "fallback_probability": params.failure_probability()}
    return {"kind": "discrete Laplace (sign x magnitude from biased coins)", "t": params.t, "bits": params.bits,
            "k": params.k, "grid_bits": params.grid_bits, "full_support": params.full_support}


def exact_log_pmf(params: Any) -> tuple[np.ndarray, int]:
    """(log P(x), lowest x) of the implemented sampler, x in grid units."""
    from mpc_erm.mpc.samplers import DiscreteLaplaceParams, log_pmf

    if isinstance(params, DiscreteLaplaceParams):
        return log_pmf(params), -params.support_max
    return params.log_pmf(), -params.support_max


def ideal_discrete_log_pmf(mechanism: str, scale_grid: float, lo: int, size: int) -> np.ndarray:
    from mpc_erm.mpc.samplers import ideal_discrete_gaussian_log_pmf, ideal_discrete_laplace_log_pmf

    xs = np.arange(lo, lo + size, dtype=np.int64)
    if mechanism == "gaussian":
        return ideal_discrete_gaussian_log_pmf(scale_grid, xs)
    return ideal_discrete_laplace_log_pmf(scale_grid, xs)


# ---------------------------------------------------------------------- statistics


def ks_discrete(samples: np.ndarray, log_p: np.ndarray, lo: int) -> float:
    """sup_x |F_n(x) − F(x)| for integer samples against a PMF on lo … lo + len − 1 (the sup of
    a difference of two step functions on the integers is reached at an atom)."""
    cdf = np.cumsum(np.exp(log_p))
    cdf /= cdf[-1]
    xs = np.arange(lo, lo + log_p.size, dtype=np.int64)
    s = np.sort(samples)
    emp = np.searchsorted(s, xs, side="right") / s.size
    below = np.searchsorted(s, lo, side="left") / s.size  # mass below the support
    return float(max(np.max(np.abs(emp - cdf)), below))


def _continuous(mechanism: str, scale: float) -> Any:
    from scipy import stats

    return stats.norm(scale=scale) if mechanism == "gaussian" else stats.laplace(scale=scale)


def target_std(mechanism: str, scale: float) -> float:
    return scale if mechanism == "gaussian" else math.sqrt(2.0) * scale


def tail_theory(mechanism: str, k: float) -> float:
    """P(|X| > k·std) for the continuous target."""
    if mechanism == "gaussian":
        return math.erfc(k / math.sqrt(2.0))
    return math.exp(-k * math.sqrt(2.0))  # |X|/b ~ Exp(1), std = √2·b


def distribution_stats(
    values: np.ndarray,
    mechanism: str,
    scale: float,
    *,
    grid_bits: int,
    exact: tuple[np.ndarray, int] | None = None,
    ideal_discrete: np.ndarray | None = None,
) -> dict[str, Any]:
    """Statistics of ``values`` (integers in units of 2^-grid_bits) against the target.

    ``exact``: (log PMF, lowest value) of the implemented sampler, grid units;
    ``ideal_discrete``: log PMF of the ideal discrete distribution on the same support.
    """
    n = int(values.size)
    h = 2.0**-grid_bits
    x = values.astype(np.float64) * h
    sd_target = target_std(mechanism, scale)
    out: dict[str, Any] = {"n": n, "ks_iid_median": 0.87 / math.sqrt(n) if n else None}
    if n == 0:
        return out
    from scipy import stats

    out["ks_continuous"] = float(stats.kstest(x, _continuous(mechanism, scale).cdf).statistic)
    sd = float(np.std(x))
    kurt = 3.0 if mechanism == "gaussian" else 6.0
    out["std"] = sd
    out["target_std"] = sd_target
    out["rel_std_error"] = sd / sd_target - 1.0
    out["rel_std_error_sampling_sd"] = math.sqrt((kurt - 1.0) / (4.0 * n))
    out["mean"] = float(np.mean(x))
    z = np.abs(x) / sd_target
    out["max_abs_z"] = float(z.max())
    tails = {}
    p_exact = None
    if exact is not None:
        log_p, lo = exact
        p_exact = np.exp(log_p)
        xs_abs = np.abs(np.arange(lo, lo + log_p.size, dtype=np.float64) * h) / sd_target
        out["ks_exact_pmf"] = ks_discrete(values, log_p, lo)
        exact_sd = math.sqrt(float(np.sum(p_exact * (np.arange(lo, lo + log_p.size) * h) ** 2)))
        out["exact_pmf_std"] = exact_sd
        out["rel_std_error_vs_exact_pmf"] = sd / exact_sd - 1.0
        outside = int(np.sum((values < lo) | (values >= lo + log_p.size)))
        out["outside_support"] = outside
        if ideal_discrete is not None:
            out["ks_ideal_discrete"] = ks_discrete(values, ideal_discrete, lo)
    for k in TAILS:
        obs = float(np.mean(z > k))
        th = tail_theory(mechanism, k)
        row = {"observed": obs, "theory": th, "sampling_sd": math.sqrt(th * (1 - th) / n)}
        if p_exact is not None:
            row["exact_pmf"] = float(np.sum(p_exact[xs_abs > k]))
        tails[f"{k}sigma"] = row
    out["tails"] = tails
    return out


def reference_values(params: Any, n: int, seed: int) -> np.ndarray:
    """n draws of the plaintext reference of the same algorithm (grid units), in chunks."""
    from mpc_erm.mpc.samplers import DiscreteLaplaceParams, gaussian_reference_samples, reference_samples

    rng = np.random.default_rng(seed)
    parts = []
    left = n
    while left > 0:
        m = min(left, REF_CHUNK)
        if isinstance(params, DiscreteLaplaceParams):
            parts.append(reference_samples(params, m, rng))
        else:
            parts.append(gaussian_reference_samples(params, m, rng))
        left -= m
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


# ---------------------------------------------------------------------- the MPC part (every party)


def _sampler_party(
    ctx: Any, params: Any, n: int, batch: int | None, randn_n: int, device: str = "cpu", baseline: Any = None
) -> dict[str, Any]:
    from mpc_erm.mpc.crypten_compat import import_crypten, plain

    crypten = import_crypten()
    from crypten.mpc import MPCTensor

    comm = ctx.comm
    out: dict[str, Any] = {"rank": ctx.rank, "trust_model": ctx.trust_model}
    if n > 0 and baseline is not None:  # the baseline sampler first, same session, nothing revealed
        out["baseline"], _ = _produce(comm, baseline, n, batch or BASELINE_BATCH, device)
    if n > 0:
        out["mpc"], pool = _produce(comm, params, n, batch, device)  # batch None: what InMpcNoise uses
        out["batch"] = pool.batch
        out["ceilings"] = _ceilings(comm, ctx.rank)
        out["mpc"]["peak_rss_bytes"] = peak_rss_bytes()
        shares = pool.take_integers(n)
        # BENCHMARK ONLY: open the noise to party 0 to measure its distribution.
        opened = MPCTensor.from_shares(shares, precision=0)._tensor.reveal(dst=0)
        if ctx.rank == 0:
            out["values"] = plain(opened).cpu().numpy()  # CrypTen wraps CUDA values (crypten_compat.plain)
    if randn_n > 0:
        comm.barrier()
        s0 = comm.get_communication_stats()
        tic = time.perf_counter()
        z = crypten.randn(randn_n)
        seconds = time.perf_counter() - tic
        s1 = comm.get_communication_stats()
        out["randn"] = {"seconds": seconds, "samples_per_second": randn_n / seconds,
                        "rounds": s1["rounds"] - s0["rounds"], "bytes": s1["bytes"] - s0["bytes"],
                        "bytes_per_sample": (s1["bytes"] - s0["bytes"]) / randn_n}
        ring = z._tensor.reveal(dst=0)  # exact decode: CrypTen's decode is off by one for negatives
        if ctx.rank == 0:
            out["randn_values"] = ring.numpy()  # units of 2^-16
            out["randn_scale_bits"] = int(round(math.log2(z._tensor.encoder.scale)))
    return out


def _produce(comm: Any, params: Any, n: int, batch: int | None, device: str) -> tuple[dict[str, Any], Any]:
    """n samples of ``params`` into a pool (not revealed): the offline cost, and the pool."""
    from mpc_erm.mpc.crypten_compat import import_crypten
    from mpc_erm.mpc.samplers.pool import NoisePool, batch_for

    provider = import_crypten().mpc.get_default_provider()
    pool = NoisePool(params, device=device, batch=batch or batch_for(params, DEFAULT_BATCH))
    words0 = getattr(provider, "binary_words", 0)
    comm.barrier()
    pool.produce(n)
    st = pool.stats()
    return {"seconds": st.seconds, "samples_per_second": st.samples_per_second, "rounds": st.rounds,
            "bytes": st.bytes, "bytes_per_sample": st.bytes_per_sample, "batch": pool.batch,
            "and_gates_per_sample": 64 * (getattr(provider, "binary_words", 0) - words0) / n}, pool


CEILING_BYTES = 1 << 20  # bytes per all-reduce when measuring the transport's rate (a batch's rounds are 0.1–1 MiB)


def _ceilings(comm: Any, rank: int, reps: int = 20) -> dict[str, Any]:
    """This machine's limits, measured in the same session right after the sampler (every party
    takes part; numbers from each party's view):

    * ``latency_s``: median wall time of an 8-byte XOR all-reduce (one message step);
    * ``transport_bytes_per_s``: bytes this party sent + received per second during all-reduces
      of :data:`CEILING_BYTES`, back to back (what the sampler's rounds move, at full speed);
    * ``and_words_per_s``: party 0 alone (the others wait at a barrier), one core: Beaver ANDs on
      64-bit words with the triple drawn from a PRG, as the sampler computes them (draw a, b, c;
      ε = x ⊕ a, δ = y ⊕ b; z = c ⊕ (ε ∧ y) ⊕ (a ∧ δ)) — the gates' local cost with no message.
    """
    import torch

    xor = torch.distributed.ReduceOp.BXOR
    one = torch.zeros(1, dtype=torch.long)
    lat = []
    for _ in range(reps):
        comm.barrier()
        tic = time.perf_counter()
        comm.all_reduce(one.clone(), op=xor)
        lat.append(time.perf_counter() - tic)
    big = torch.zeros(CEILING_BYTES // 8, dtype=torch.long)
    comm.barrier()
    b0 = comm.get_communication_stats()["bytes"]
    tic = time.perf_counter()
    for _ in range(reps):
        comm.all_reduce(big.clone(), op=xor)
    seconds = time.perf_counter() - tic
    moved = comm.get_communication_stats()["bytes"] - b0
    out: dict[str, Any] = {"latency_s": float(np.median(lat)), "transport_bytes_per_s": moved / seconds,
                           "transport_message_bytes": CEILING_BYTES}
    comm.barrier()
    if rank == 0:
        words = 1 << 20
        g = torch.Generator().manual_seed(1)
        x = torch.empty(words, dtype=torch.long).random_(generator=g)
        y = torch.empty(words, dtype=torch.long).random_(generator=g)
        tic = time.perf_counter()
        for _ in range(reps):
            a, b, c = (torch.empty(words, dtype=torch.long).random_(-(1 << 63), None, generator=g) for _ in range(3))
            eps, delta = x ^ a, y ^ b
            z = c ^ (eps & y) ^ (a & delta)
        out["and_words_per_s"] = reps * words / (time.perf_counter() - tic)
        del z
    comm.barrier()
    return out


def ceiling_summary(mpc: dict[str, Any], ceilings: dict[str, Any], parties: int, cpus: int) -> dict[str, Any]:
    """The sampler's rate beside what each limit alone would allow, from the same run:

    * compute: the cores shared by the parties (``cpus``), each party's AND gates at the local
      rate ``and_words_per_s`` (64 gates a word) — ignoring everything else a party computes;
    * bytes: the transport's measured rate over the sampler's bytes per sample (slowest party);
    * latency: a batch's message steps (the fewest any party counts: party 0's prefetched dealer
      exchanges are mostly off the critical path) at the measured one-step latency, nothing else;
    * cpu: compute and bytes together on the same cores — on loopback the transport's bytes/s is
      itself CPU time of the parties, so a sample costs at least 1/compute + 1/bytes seconds of
      those cores (messages only add latency on top).
    """
    gates = mpc["and_gates_per_sample"]
    compute = ceilings["and_words_per_s"] * 64 * cpus / (parties * gates) if gates else None
    bytes_ = ceilings["transport_bytes_per_s"] / mpc["bytes_per_sample_max_over_parties"]
    batches = max(1, math.ceil(mpc["samples"] / mpc["batch"]))
    steps = mpc.get("rounds_min_over_parties", mpc["rounds"]) / batches
    latency = mpc["batch"] / (steps * ceilings["latency_s"]) if steps else None
    rate = mpc["samples_per_second"]

    def row(limit: float | None, what: str) -> dict[str, Any]:
        return {"samples_per_second": limit, "fraction_reached": rate / limit if limit else None, "what": what}

    return {
        "measured": ceilings,
        "compute": row(compute, f"{cpus} cores / {parties} parties, AND gates only ({gates:.0f} per sample)"),
        "bytes": row(bytes_, "transport bytes/s over the sampler's bytes per sample (slowest party)"),
        "latency": row(latency, f"batch {mpc['batch']} / ({steps:.0f} message steps × one-step latency)"),
        "cpu": row(1.0 / (1.0 / compute + 1.0 / bytes_) if compute else None,
                   "compute and bytes on the same cores: 1 / (1/compute + 1/bytes)"),
    }


def _slowest(reports: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The party with the lowest rate (what the job waits for); rounds/bytes from party 0,
    which talks to the dealer, and the maximum over parties."""
    worst = min(reports, key=lambda r: r[key]["samples_per_second"])
    row = dict(worst[key])
    row["slowest_rank"] = worst["rank"]
    row["bytes_per_sample_max_over_parties"] = max(r[key]["bytes_per_sample"] for r in reports)
    # the message steps every party takes (party 0 also counts its dealer exchanges, prefetched
    # and so mostly off the critical path)
    row["rounds_min_over_parties"] = min(r[key]["rounds"] for r in reports)
    row["per_party_samples_per_second"] = [r[key]["samples_per_second"] for r in reports]
    if "peak_rss_bytes" in worst[key]:
        row["peak_rss_bytes_max_over_parties"] = max(r[key]["peak_rss_bytes"] for r in reports)
    return row


# ---------------------------------------------------------------------- entry point


def run(
    mechanism: str = "gaussian",
    samples: int = 100_000,
    *,
    parties: int = 3,
    trust: str = "dealer",
    scale: float = 1.0,
    grid_bits: int | None = None,
    randn_samples: int = 10_000,
    reference_samples: int = 1_000_000,
    batch: int | None = None,
    seed: int = 0,
    timeout_s: float = 7200.0,
    progress: Any = None,
    device: str = "cpu",
    coin_bits: int | None = None,
    baseline: bool = False,
) -> dict[str, Any]:
    """Run the benchmark; returns the JSON-ready result (see the module docstring). ``device``:
    where each party's sampler computes (its shares travel from the CPU), e.g. "cuda" on a GPU box.
    ``coin_bits``: the Gaussian's k. ``baseline``: first, in the same session, the Gaussian as it
    was before its candidates' fair low bits and per-job coin bits (CKS's discrete Laplace
    candidates, k = 56, batches of 2^17 unless ``batch`` is given), with the ratios of rate, AND
    gates and bytes per sample."""
    from mpc_erm.mpc.local import TRUST_MODELS, run_local_full

    say = progress or (lambda _m: None)
    if samples < 0 or randn_samples < 0 or reference_samples < 0:
        raise ValueError("sample counts must be non-negative")
    if parties < 2:
        raise ValueError("parties must be at least 2")
    if trust not in TRUST_MODELS:
        raise ValueError(f"trust must be one of {', '.join(TRUST_MODELS)}")
    if batch is not None and batch < 1:
        raise ValueError("batch must be positive")
    if device.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu or cuda[:N], not {device!r}")
    params, g, source = sampler_params(mechanism, scale, parties, grid_bits, coin_bits)
    base_params = None
    if baseline:
        if mechanism != "gaussian":
            raise ValueError("baseline: only the discrete Gaussian has one")
        from mpc_erm.mpc.samplers.gaussian import DiscreteGaussianParams, coarse_for

        base_params = DiscreteGaussianParams(t=params.t, mu=params.mu, rounds=params.rounds, revealed=params.revealed,
                                             k=56, grid_bits=params.grid_bits, coarse_log2=coarse_for(56))
    h = 2.0**-g
    scale_grid = scale / h
    result: dict[str, Any] = {
        "benchmark": "sampler",
        "machine": machine_info(),
        "parameters": {"mechanism": mechanism, "scale": scale, "scale_meaning": "sigma" if mechanism == "gaussian"
                       else "Laplace b (std = sqrt(2) b)", "samples": samples, "parties": parties, "trust": trust,
                       "grid_bits": g, "scale_grid_units": scale_grid, "params_source": source,
                       "sampler": describe_params(params), "randn_samples": randn_samples,
                       "reference_samples": reference_samples, "seed": seed, "device": device},
        "note": "samples revealed for measurement only (benchmark); a job never opens its noise",
    }
    say(f"sampler {mechanism}: {samples} MPC samples, {parties} parties ({trust}), grid 2^-{g}; "
        f"crypten.randn {randn_samples}")
    run_ = None
    if samples > 0 or randn_samples > 0:
        run_ = run_local_full(_sampler_party, parties=parties, trust=trust,
                              args=(params, samples, batch, randn_samples, device, base_params), timeout_s=timeout_s,
                              deadline_s=max(120.0, 1e-4 * max(samples, randn_samples)))
        reports = run_.results
        result["trust_model"] = reports[0]["trust_model"]
        result["session_seconds"] = run_.seconds
        result["dealer"] = run_.dealer
    say("statistics …")
    exact = exact_log_pmf(params)
    ideal = ideal_discrete_log_pmf(mechanism, scale_grid, exact[1], exact[0].size)
    if samples > 0 and run_ is not None:
        mpc = _slowest(reports, "mpc")
        mpc["batch"] = reports[0]["batch"]
        mpc["samples"] = samples
        worst = {"latency_s": max(r["ceilings"]["latency_s"] for r in reports),
                 "transport_bytes_per_s": min(r["ceilings"]["transport_bytes_per_s"] for r in reports),
                 "transport_message_bytes": CEILING_BYTES,
                 "and_words_per_s": reports[0]["ceilings"]["and_words_per_s"]}
        result["ceilings"] = ceiling_summary(mpc, worst, parties, int(result["machine"]["usable_cpus"]))
        mpc["stats"] = distribution_stats(reports[0]["values"], mechanism, scale, grid_bits=g, exact=exact,
                                          ideal_discrete=ideal)
        result["mpc"] = mpc
        if base_params is not None:
            base = _slowest(reports, "baseline")
            base["sampler"] = describe_params(base_params)
            result["baseline"] = base
            result["against_baseline"] = {
                "samples_per_second": mpc["samples_per_second"] / base["samples_per_second"],
                "and_gates_per_sample": mpc["and_gates_per_sample"] / base["and_gates_per_sample"],
                "bytes_per_sample": (mpc["bytes_per_sample_max_over_parties"]
                                     / base["bytes_per_sample_max_over_parties"]),
                "what": "this sampler over the baseline (CKS candidates, k = 56), same session"}
    if randn_samples > 0 and run_ is not None:
        rn = _slowest(reports, "randn")
        rn["stats"] = distribution_stats(reports[0]["randn_values"], "gaussian", 1.0,
                                         grid_bits=reports[0]["randn_scale_bits"])
        rn["what"] = "crypten.randn (Box-Muller on 16-bit uniforms, approximate log/sqrt/cos; no privacy analysis)"
        result["crypten_randn"] = rn
    if reference_samples > 0:
        tic = time.perf_counter()
        ref_vals = reference_values(params, reference_samples, seed)
        result["reference"] = {
            "what": "plaintext reference of the same algorithm (numpy; same coins, thresholds, selection)",
            "seconds": time.perf_counter() - tic,
            "stats": distribution_stats(ref_vals, mechanism, scale, grid_bits=g, exact=exact, ideal_discrete=ideal),
        }
    result["targets"] = _targets(result, mechanism, parties)
    return jsonable(result)


def _targets(result: dict[str, Any], mechanism: str, parties: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    mpc = result.get("mpc")
    rate = mpc["samples_per_second"] if mpc else None
    applies = parties == 3 and rate is not None
    rows.append({"target": f">= {RATE_TARGET:,} {mechanism} samples/s with M = 3 (offline)", "applies": applies,
                 "value": rate, "met": rate >= RATE_TARGET if applies else None})
    if mpc and mpc["stats"]["n"] >= 1_000_000:
        ks, src = mpc["stats"]["ks_continuous"], "MPC samples"
    elif result.get("reference") and result["reference"]["stats"]["n"] >= 1_000_000:
        ks, src = result["reference"]["stats"]["ks_continuous"], "plaintext reference of the same algorithm"
    else:
        ks, src = None, "no run with N >= 10^6"
    rows.append({"target": f"KS <= {KS_TARGET:g} to the continuous target at N = 10^6", "applies": ks is not None,
                 "value": ks, "source": src, "met": None if ks is None else ks <= KS_TARGET})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mechanism", choices=MECHANISMS, default="gaussian")
    ap.add_argument("--samples", type=int, default=100_000)
    ap.add_argument("--parties", type=int, default=3)
    ap.add_argument("--trust", default="dealer")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--grid-bits", type=int)
    ap.add_argument("--randn-samples", type=int, default=10_000)
    ap.add_argument("--reference-samples", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--device", default="cpu", help="where the parties' sampler computes: cpu or cuda")
    ap.add_argument("--coin-bits", type=int, help="the Gaussian's bits per coin k (default: the plan's 56)")
    ap.add_argument("--baseline", action="store_true",
                    help="run the Gaussian before fair bits and per-job k first, same session, and give ratios")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    res = run(a.mechanism, a.samples, parties=a.parties, trust=a.trust, scale=a.scale, grid_bits=a.grid_bits,
              randn_samples=a.randn_samples, reference_samples=a.reference_samples, batch=a.batch,
              progress=lambda m: print(m, file=sys.stderr), device=a.device, coin_bits=a.coin_bits,
              baseline=a.baseline)
    res["command"] = " ".join(["python -m benchmarks.sampler", *(argv if argv is not None else sys.argv[1:])])
    write_result(res, a.out)


if __name__ == "__main__":
    main()
