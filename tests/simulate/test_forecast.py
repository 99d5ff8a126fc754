"""The dry run's network forecast (``mpc-erm job plan`` on a network job) runs the job's own
DP-SGD rounds: without noise and with full batches they are clipped gradient descent on the
pooled rows, computed here independently (one example at a time, autograd, no torch.func); with
noise its band sits between a constant predictor and the noise-free rounds, and a job whose
noise drowns its signal is found hopeless."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mpc_erm.data import Dataset
from mpc_erm.jobs import parse_job_file
from mpc_erm.models import build_network
from mpc_erm.protocols.common import network_spec, plan_job, public_sizes
from mpc_erm.simulate.forecast import InProcessNetworkJob, forecast_job

JOB = """
method = "gradient"
[job]
name = "net"
dataset = "d"
parties = ["a", "b", "c"]
trust = "replicated"
[model]
name = "mlp"
input_shape = [5]
n_classes = 2
hidden = [6]
lam = {lam}
[privacy]
epsilon = {eps}
delta = 1e-6
clip = {clip}
adjacency = "add_remove"
public_n = {n_hat}
[training]
iterations = {T}
sampling_rate = {q}
learning_rate = {lr}
"""


def _parts(seed: int = 0, sizes: tuple[int, ...] = (30, 20, 20)) -> list[Dataset]:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=5)
    out = []
    for n in sizes:
        X = rng.normal(size=(n, 5)) / np.sqrt(5)
        y = np.where(X @ w + 0.1 * rng.normal(size=n) > 0, 1.0, -1.0)
        out.append(Dataset(X, y, "binary", "part"))
    return out


def _spec(**kw: object):
    values = {"eps": 1.0, "clip": 0.5, "n_hat": 70, "T": 4, "q": 1.0, "lr": 0.5, "lam": 0.01, **kw}
    return parse_job_file(JOB.format(**values)).spec


def test_noise_free_full_batch_rounds_are_clipped_gradient_descent_on_the_pooled_rows() -> None:
    spec = _spec()
    parts = _parts()
    plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, None))
    got = InProcessNetworkJob(spec, plan, parts).train(torch.Generator().manual_seed(1), noise=False)

    net = build_network(network_spec(spec), "cpu")  # the same seeded initial weights
    theta = torch.nn.utils.parameters_to_vector(net.parameters()).detach().double()
    X = torch.as_tensor(np.vstack([p.X for p in parts]), dtype=torch.float32)
    y = torch.as_tensor((np.concatenate([p.y for p in parts]) > 0).astype(np.int64))
    for _ in range(4):
        torch.nn.utils.vector_to_parameters(theta.float(), net.parameters())
        total = torch.zeros_like(theta)
        for i in range(X.shape[0]):
            net.zero_grad()
            torch.nn.functional.cross_entropy(net(X[i : i + 1]), y[i : i + 1]).backward()
            g = torch.cat([p.grad.reshape(-1) for p in net.parameters()]).double()
            total += g * min(1.0, 0.5 / float(g.norm()))
        theta = theta - 0.5 * (total / 70 + 0.01 * theta)  # weight 1/(q·n̂), weight decay λθ
    torch.testing.assert_close(got.public_parameters(), theta, rtol=0, atol=1e-6)


def test_the_band_lies_between_a_constant_and_the_noise_free_rounds_and_drowned_jobs_are_hopeless() -> None:
    parts, held_out = _parts(0, (100, 100, 100)), _parts(0, (400,))[0]
    fc = forecast_job(_spec(eps=4.0, T=20, q=0.5, lr=1.0, n_hat=300, clip=1.0), parts, evaluate=held_out, runs=3)
    band = fc.band()
    assert band is not None and fc.reference == "the same rounds without noise" and fc.dim == 5 * 6 + 6 + 6 * 2 + 2
    assert fc.trivial + 0.1 < band[0] <= fc.nonprivate + 0.05 and not fc.hopeless, (band, fc)
    assert fc.epsilon <= 4.0 + 1e-9 and fc.noise_std > 0

    drowned = forecast_job(_spec(eps=0.01, T=20, q=0.5, lr=1.0, n_hat=300, clip=1.0), parts, evaluate=held_out,
                           runs=2)
    assert drowned.hopeless and drowned.noise_to_signal > 3, drowned


RIDGE_JOB = """
method = "gradient"
[job]
name = "ridge"
dataset = "d"
parties = ["a", "b", "c"]
trust = "replicated"
[model]
name = "ridge"
lam = 1e-3
[privacy]
epsilon = 50.0
delta = 1e-6
clip = 1.0
[training]
iterations = {T}
learning_rate = {lr}
"""


def _regression_parts(seed: int, sizes: tuple[int, ...]) -> list[Dataset]:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=4)
    out = []
    for n in sizes:
        X = rng.uniform(-0.5, 0.5, size=(n, 4))
        out.append(Dataset(X, np.clip(X @ w / 2 + 0.05 * rng.normal(size=n), -1, 1), "regression", "part"))
    return out


def test_a_linear_forecast_separates_the_optimisers_share_of_the_gap_from_the_noises() -> None:
    """Without noise the same rounds reach what the optimiser alone can: a learning rate that
    diverges is found hopeless even at a large ε, and too few rounds stop short of the optimum."""
    parts = _regression_parts(0, (300, 300, 300))
    diverges = forecast_job(parse_job_file(RIDGE_JOB.format(T=20, lr=50.0)).spec, parts, runs=1)
    assert diverges.untrained and diverges.hopeless and diverges.noise_free is not None and diverges.noise_free < 0
    short = forecast_job(parse_job_file(RIDGE_JOB.format(T=3, lr=0.5)).spec, parts, runs=1)
    assert short.short_of_optimum and not short.hopeless and short.noise_free < short.nonprivate - 0.02, short
    enough = forecast_job(parse_job_file(RIDGE_JOB.format(T=400, lr=1.9)).spec, parts, runs=1)
    assert not enough.short_of_optimum and enough.noise_free == pytest.approx(enough.nonprivate, abs=0.02)
