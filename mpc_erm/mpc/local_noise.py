"""This compute party's own share of distributed noise (``privacy.noise = "distributed"``).

Each party samples its share N_Z(0, σ_p²) on the job's grid locally and adds it to its share of
the aggregate; the sum of the honest parties' shares carries the guarantee
(:mod:`mpc_erm.privacy.distributed`). No message, no circuit: the MPC only sums.

The sampler is the in-MPC one's algorithm run in the clear by one party — the same discrete
Laplace candidates, k-bit coins and revealed rejection (:func:`.samplers.gaussian.gaussian_reference_samples`),
so the same exact PMF and total-variation bound apply (:func:`.samplers.guarantee.gaussian_tv_bound`) —
with its uniforms drawn from an AES-256-CTR keystream under a fresh per-job key from ``secrets``:
the other parties must not be able to predict this share, which a statistical generator (PCG64,
a Mersenne twister) would not ensure. The share never leaves the party except inside its masked
share of the aggregate.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from mpc_erm.protocols.aggregation import NoiseSpec

from .keystream import Keystream, new_key
from .noise import NoisePlan, plan_noise
from .samplers.gaussian import DiscreteGaussianParams, gaussian_reference_samples

__all__ = ["NORM_FAILURE_LOG2", "DistributedNoise", "KeystreamIntegers", "gaussian_share_norm_bound"]

#: An honest party's noise share exceeds its proved norm bound with probability ≤ 2^-this (the job
#: then stops with nothing revealed).
NORM_FAILURE_LOG2 = 40


def gaussian_share_norm_bound(sigma2: int, dim: int, failure_log2: int = NORM_FAILURE_LOG2) -> int:
    """⌈σ·√(d + 2√(d·x) + 2x)⌉, x = failure_log2·ln 2: the Laurent–Massart χ² bound, which holds
    for d independent discrete Gaussians N_Z(0, σ²) too. Their E[e^{tX²}] is at most the
    continuous Gaussian's (1 − 2tσ²)^{-1/2}: by Poisson summation Σ_k e^{-a k²} = √(π/a)·θ(a)
    with θ(a) = Σ_m e^{-π²m²/a} increasing in a, so the ratio of the sums at a − t and at a is
    ≤ √(a/(a − t)); and Laurent–Massart's proof uses the MGF alone."""
    x = failure_log2 * math.log(2.0)
    return math.ceil(math.sqrt(sigma2 * (dim + 2.0 * math.sqrt(dim * x) + 2.0 * x))) + 1


class KeystreamIntegers:
    """``integers(0, 2^b, size)`` as numpy's ``Generator`` has it, drawn from an AES-256-CTR
    keystream: each value is the top b bits of one keystream word, exactly uniform."""

    def __init__(self, key: bytes) -> None:
        self._stream = Keystream(key)

    def integers(self, low: int, high: int, size: int | tuple[int, ...], dtype: Any = np.int64) -> np.ndarray:
        bits = int(high).bit_length() - 1
        if low != 0 or high != 1 << bits or not 1 <= bits <= 63:
            raise ValueError(f"KeystreamIntegers draws from [0, 2^b), 1 ≤ b ≤ 63; asked [{low}, {high})")
        shape = (size,) if isinstance(size, int) else tuple(size)
        words = self._stream.words(shape).numpy().view(np.uint64)
        return (words >> np.uint64(64 - bits)).astype(dtype)


class DistributedNoise:
    """``NoiseSource`` and ``NoisePool`` for distributed noise: this party's own share of each
    sample, sampled locally one release ahead (``prepare``/``top_up``, while the round's local
    work runs) and handed out by ``take``."""

    description = "distributed discrete Gaussian: each compute party adds its own locally sampled share"
    test_only = False

    def __init__(self) -> None:
        self._rng = KeystreamIntegers(new_key())  # fresh per job and party: nobody else holds it
        self._plans: dict[tuple[NoiseSpec, int], NoisePlan] = {}
        self._ahead: dict[NoiseSpec, np.ndarray] = {}
        self.samples = 0
        self.seconds = 0.0
        self.online_samples = 0

    def plan(self, spec: NoiseSpec, dim: int) -> NoisePlan:
        key = (spec, dim)
        if key not in self._plans:
            if spec.mechanism != "gaussian" or spec.grid_bits is None:
                raise ValueError("distributed noise: a realised Gaussian spec (grid fixed) is needed, got "
                                 f"{spec.mechanism!r} on grid {spec.grid_bits}")
            self._plans[key] = plan_noise(spec, dim, 1)
        return self._plans[key]

    def precision_bits(self, spec: NoiseSpec, dim: int) -> int:
        return self.plan(spec, dim).grid_bits

    def norm_bound(self, spec: NoiseSpec, dim: int, failure_log2: int = NORM_FAILURE_LOG2) -> int:
        """B (grid units) with P(‖z‖₂ > B) ≤ 2^-failure_log2 for this party's share z of ``dim``
        samples: what it proves its noise within in the malicious-secure mode
        (:func:`gaussian_share_norm_bound`)."""
        params = self.plan(spec, dim).params
        assert isinstance(params, DiscreteGaussianParams)
        return gaussian_share_norm_bound(params.t * params.mu, dim, failure_log2)

    def _sample(self, spec: NoiseSpec, n: int) -> np.ndarray:
        params = self.plan(spec, n).params
        assert isinstance(params, DiscreteGaussianParams)
        tic = time.perf_counter()
        out = gaussian_reference_samples(params, n, self._rng)  # type: ignore[arg-type]
        self.seconds += time.perf_counter() - tic
        self.samples += n
        return out

    def prepare(self, spec: NoiseSpec, dim: int, releases: int = 1) -> None:
        """Sample the first release's share (later ones follow with ``top_up``)."""
        if releases > 0:
            self.top_up(spec, dim)

    def top_up(self, spec: NoiseSpec, dim: int) -> None:
        """Sample the next release's share ahead, unless it is already there."""
        have = self._ahead.get(spec)
        if have is None or have.size < dim:
            self._ahead[spec] = self._sample(spec, dim)

    def take(self, p: int, spec: NoiseSpec) -> torch.Tensor:
        """This party's share of ``p`` samples (int64, grid units); what was not sampled ahead is
        sampled now."""
        have = self._ahead.pop(spec, None)
        if have is None or have.size < p:
            self.online_samples += p
            have = self._sample(spec, p)
        return torch.from_numpy(np.ascontiguousarray(have[:p], dtype=np.int64))

    def stats(self) -> dict[str, Any]:
        return {"kind": "distributed", "samples": self.samples, "seconds": self.seconds,
                "samples_per_second": self.samples / self.seconds if self.seconds else None,
                "online_samples": self.online_samples}
