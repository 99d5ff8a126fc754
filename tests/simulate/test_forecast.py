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
from mpc_erm.models.job_model import network_spec
from mpc_erm.privacy.plan import plan_job, public_sizes
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
    assert band is not None and fc.reference == "noise_free_rounds" and fc.dim == 5 * 6 + 6 + 6 * 2 + 2
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


FED_JOB = """
method = "gradient"
[job]
name = "fed"
dataset = "d"
parties = ["a", "b", "c"]
trust = "replicated"
owners = [{owners}]
features = 5
[model]
name = "softmax"
n_classes = 2
lam = {lam}
[privacy]
epsilon = {eps}
delta = 1e-6
clip = {clip}
adjacency = "add_remove"
public_n = {n}
[training]
iterations = {T}
sampling_rate = {tau}
learning_rate = 1.0
ls_sigma = {ls}
[federated]
local_epochs = 1
local_batch = 1000
local_lr = 0.5
local_lr_decay = 0.9
"""


def _fed_spec(n: int, **kw: object):
    owners = ", ".join(f'"o{i:03d}"' for i in range(n))
    values = {"eps": 1.0, "clip": 100.0, "T": 5, "tau": 1.0, "lam": 1e-3, "ls": 0.0, "owners": owners, "n": n, **kw}
    return parse_job_file(FED_JOB.format(**values)).spec


def test_noise_free_federated_rounds_with_every_owner_are_gradient_descent_on_the_owners_mean_loss() -> None:
    """DP-Fed-LS with τ = 1, one full-batch local step, a ball too large to bind and η_g = 1: the
    mean of the owners' updates is −η_l γ^t times the mean over owners of their own mean loss's
    gradient (weight decay included), so the rounds are gradient descent on that loss. Computed
    here independently: a weight matrix and a bias in float64, autograd, no torch.nn."""
    from mpc_erm.simulate.forecast import InProcessFederatedJob, deal_to_owners

    n_owners, T = 6, 5
    spec = _fed_spec(n_owners, T=T)
    owners = deal_to_owners(_pooled(_parts(1)), n_owners)
    assert sorted(o.n for o in owners) == [11, 11, 12, 12, 12, 12]  # 70 rows, as equal as they go
    plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, None), n_features=5)
    fed = InProcessFederatedJob(spec, plan, owners)
    start = fed.job(noise=False).w.clone()
    got = fed.train(torch.Generator().manual_seed(0), noise=False).w

    W = start[:10].reshape(2, 5).clone().requires_grad_(True)
    b = start[10:].clone().requires_grad_(True)
    for t in range(T):
        loss = torch.stack([torch.nn.functional.cross_entropy(
            torch.as_tensor(np.array(o.X), dtype=torch.float64) @ W.T + b, torch.as_tensor((o.y > 0).astype(np.int64)))
            for o in owners]).mean()
        gW, gb = torch.autograd.grad(loss, (W, b))
        with torch.no_grad():
            lr = 0.5 * 0.9**t
            W -= lr * (gW + 1e-3 * W)
            b -= lr * (gb + 1e-3 * b)
    want = torch.cat([W.detach().reshape(-1), b.detach()])
    assert float((want - start).norm()) > 0.05  # the rounds moved the model
    assert torch.allclose(got, want, atol=1e-5), float((got - want).abs().max())  # local steps run in float32


def test_a_federated_forecast_deals_the_rows_and_finds_too_few_owners_hopeless() -> None:
    """The stand-in rows are dealt to the job's owners; with many owners the noisy mean of their
    updates trains (its band above a constant, below the same rounds without noise); with six
    the noise on the mean (z·𝓛/(τN)) drowns it, as its runs show."""
    pooled = _parts(2, sizes=(800, 800, 800))
    many = forecast_job(_fed_spec(200, eps=4.0, clip=0.5, T=8, tau=0.5, ls=1.0), pooled, runs=3, owners=200)
    band = many.band()
    assert band is not None and many.reference == "noise_free_rounds"
    assert many.trivial is not None and many.noise_free is not None
    assert many.trivial + 0.05 < band[0] <= many.noise_free + 0.02 and not many.hopeless
    assert many.noise_std == pytest.approx(many.sensitivity * plan_job(
        _fed_spec(200, eps=4.0, clip=0.5, T=8, tau=0.5, ls=1.0), sampler="mpc",
        sizes=public_sizes(_fed_spec(200, eps=4.0, clip=0.5, T=8, tau=0.5, ls=1.0), None),
        n_features=5).noise_multiplier)
    few = forecast_job(_fed_spec(6, eps=0.5, clip=0.5, T=8, tau=0.5, ls=1.0), pooled, runs=3, owners=6)
    assert few.hopeless and few.drowned and few.noise_to_signal > many.noise_to_signal * 10
    assert np.mean(few.private) <= few.trivial + few.margin  # hopeless by its runs, not by the ratio alone
    with pytest.raises(ValueError, match="federated: .*owners"):
        forecast_job(_fed_spec(6), pooled)
    with pytest.raises(ValueError, match="data: 6 owners need at least 6"):
        forecast_job(_fed_spec(6), _parts(3, sizes=(2, 2, 1)), owners=6)


def _pooled(parts: list[Dataset]) -> Dataset:
    return Dataset(np.vstack([p.X for p in parts]), np.concatenate([p.y for p in parts]), "binary", "pooled")


LINEAR_OUTPUT_JOB = """
method = "output"
[job]
name = "lin"
dataset = "d"
parties = ["a", "b", "c"]
trust = "replicated"
[model]
name = "logistic"
lam = 0.05
[privacy]
epsilon = {eps}
delta = 1e-6
mechanism = "gaussian"
adjacency = "{adjacency}"
{public_n}
"""


def test_the_noise_floor_from_the_job_file_alone_lies_below_every_forecast() -> None:
    """``job submit``'s check of a job never planned: the floor's σ is the forecast's (the same
    plan, with the public n̂), and its noise/signal — against the largest release the bounds
    allow — is at most what the forecast measures on real rows (n̂ = the rows held, as the job
    asserts), for a network, a federated job and a linear output job; a job whose floor is
    hopeless is hopeless in its forecast too."""
    from mpc_erm.privacy.noise_floor import least_rows, noise_floor

    parts = _parts(4)  # 70 rows
    cases = [(_spec(eps=1.0, n_hat=70, T=10, q=0.5, lr=1.0), parts, {}, None),
             (_spec(eps=0.01, n_hat=70, T=10, q=0.5, lr=1.0), parts, {}, None),
             (parse_job_file(LINEAR_OUTPUT_JOB.format(eps=1.0, adjacency="add_remove", public_n="public_n = 70")).spec,
              parts, {}, None)]
    fed = _fed_spec(60, eps=4.0, clip=0.5, T=4, tau=0.5)
    cases.append((fed, _parts(5, sizes=(200, 200, 200)), {"owners": 60}, 5))
    seen_hopeless = 0
    for spec, rows, kw, features in cases:
        fc = forecast_job(spec, rows, runs=1, **kw)
        floor = noise_floor(spec, features=features)
        assert floor is not None and floor.noise_std == pytest.approx(fc.noise_std, rel=1e-9)
        assert floor.rounds == fc.rounds and floor.method == fc.method
        if floor.dim_known:
            assert floor.dim == fc.dim
        else:  # a linear model's features are known only at the agreement: the least a model can have
            assert spec.method == "output" and floor.dim == 1 < fc.dim
        assert fc.signal_norm <= floor.signal_ceiling * (1 + 1e-9)
        assert floor.noise_to_signal <= fc.noise_to_signal * (1 + 1e-9), (floor, fc.noise_to_signal)
        if floor.hopeless:
            seen_hopeless += 1
            assert fc.hopeless and "on any data" in floor.describe()
    assert seen_hopeless == 1  # the ε = 0.01 network
    assert least_rows(cases[0][0], parties=3) is None  # add/remove: the floor needs no counts


@pytest.mark.parametrize(("eps", "hopeless_here"), [(1.0, False), (0.01, True)])
def test_a_replace_one_jobs_floor_is_the_rows_it_needs(eps: float, hopeless_here: bool) -> None:
    """Replace-one σ follows the agreed counts, so before the agreement the floor is stated the
    other way round: the least total (split evenly) at which it is not hopeless. At that total
    the floor is ≤ 3 and one row less per party it is > 3; at the real counts (70 rows, uneven)
    the floor has the forecast's σ, lies below its noise/signal, and is hopeless exactly when the
    rows fall short of the total needed (ε = 0.01 needs 234)."""
    from mpc_erm.privacy.noise_floor import HOPELESS_NOISE_TO_SIGNAL, least_rows, noise_floor

    spec = parse_job_file(LINEAR_OUTPUT_JOB.format(eps=eps, adjacency="replace", public_n="")).spec
    assert noise_floor(spec) is None
    need = least_rows(spec, parties=3)
    assert need is not None and need % 3 == 0
    at = noise_floor(spec, counts=[need // 3] * 3)
    assert at is not None and at.noise_to_signal <= HOPELESS_NOISE_TO_SIGNAL
    below = noise_floor(spec, counts=[need // 3 - 1] * 3)
    assert below is not None and below.hopeless
    parts = _parts(4)
    counts = [p.n for p in parts]
    floor = noise_floor(spec, counts=counts)
    fc = forecast_job(spec, parts, runs=1)
    assert floor is not None and floor.noise_std == pytest.approx(fc.noise_std, rel=1e-9)
    assert floor.noise_to_signal <= fc.noise_to_signal
    assert (sum(counts) < need) == floor.hopeless == hopeless_here
