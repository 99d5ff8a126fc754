"""A dry run's verdict never disagrees with its own forecast, and the forecast predicts the trained
job: over a grid of DP-SGD settings on scikit-learn's 8×8 digits (an MLP, three parties, a held-out
set), from a job that trains well to one whose noise drowns it, and including one whose noise is
3× its first round's signal yet trains (the case a noise/signal rule alone called hopeless while
its forecast was the best of its variants).

"The trained job" is one more run of the job's own rounds at a seed the forecast did not use — the
run the daemons' workers make (``NetworkRun``), whose results the simulator predicts
(tests/parties compare the two through real daemons)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from coordinator.cli.job_plan import verdict
from mpc_erm.data import Dataset
from mpc_erm.jobs import parse_job_file
from mpc_erm.privacy.plan import plan_job, public_sizes
from mpc_erm.protocols.common import network_rows
from mpc_erm.simulate.forecast import Forecast, InProcessNetworkJob, forecast_job

JOB = """
method = "gradient"
[job]
name = "digits"
dataset = "digits"
parties = ["a", "b", "c"]
trust = "replicated"
[model]
name = "mlp"
input_shape = [64]
n_classes = 10
hidden = [32]
[privacy]
epsilon = {eps}
delta = 1e-5
clip = 1.0
adjacency = "add_remove"
public_n = 1500
[training]
iterations = {T}
sampling_rate = {q}
learning_rate = {lr}
"""

#: (ε, q, T, learning rate): well-trained, noisy, drowned-by-the-ratio-yet-training, hopeless.
GRID = [(4.0, 0.25, 80, 1.0), (1.0, 0.05, 80, 1.0), (4.0, 0.05, 40, 2.0), (1.0, 0.25, 80, 1.0),
        (0.3, 0.25, 80, 1.0), (0.05, 0.25, 80, 1.0)]


@pytest.fixture(scope="module")
def digits() -> tuple[list[Dataset], Dataset]:
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    idx = np.random.default_rng(0).permutation(len(y))
    train, held_out = idx[:1500], idx[1500:]
    parts = [Dataset(X[train[i::3]], y[train[i::3]].astype(float), "multiclass", f"part{i}") for i in range(3)]
    return parts, Dataset(X[held_out], y[held_out].astype(float), "multiclass", "held-out")


@pytest.fixture(scope="module")
def outcomes(digits: tuple[list[Dataset], Dataset]) -> list[tuple[tuple[float, float, int, float], Forecast, float]]:
    parts, held_out = digits
    out = []
    for eps, q, T, lr in GRID:
        spec = parse_job_file(JOB.format(eps=eps, q=q, T=T, lr=lr)).spec
        fc = forecast_job(spec, parts, evaluate=held_out, runs=3)
        plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, None))
        trained = InProcessNetworkJob(spec, plan, parts).train(torch.Generator().manual_seed(10_007))
        X, y = network_rows(held_out, spec, "cpu")
        out.append(((eps, q, T, lr), fc, float((trained.predict(X) == y).double().mean())))
    return out


def test_the_verdict_follows_the_forecasts_own_runs(
        outcomes: list[tuple[tuple[float, float, int, float], Forecast, float]]) -> None:
    for setting, fc, _ in outcomes:
        line = verdict(fc)
        mean = float(np.mean(fc.private))
        assert fc.trivial is not None and not fc.untrained
        assert fc.hopeless == (mean <= fc.trivial + fc.margin), (setting, fc.private)
        assert line.startswith("HOPELESS") == fc.hopeless, (setting, line)
        assert line.startswith("WEAK") == fc.weak, (setting, line)
        assert line.startswith("ok") == (not fc.hopeless and not fc.weak), (setting, line)
        if not fc.hopeless:  # the line states the forecast it rests on
            assert f"accuracy {mean:.4f}" in line, line
    hopeless = [s for s, fc, _ in outcomes if fc.hopeless]
    assert hopeless == [(0.05, 0.25, 80, 1.0)]  # the grid spans both verdicts
    drowned_but_training = [s for s, fc, _ in outcomes if fc.drowned and not fc.hopeless]
    assert drowned_but_training == [(0.3, 0.25, 80, 1.0)], [(s, fc.noise_to_signal) for s, fc, _ in outcomes]


def test_the_trained_job_lands_where_the_forecast_said(
        outcomes: list[tuple[tuple[float, float, int, float], Forecast, float]]) -> None:
    """A job the dry run passes trains well above a constant; a hopeless one does not; and the
    trained job's accuracy is within the forecast's spread (its 3 runs' range, widened by 0.1)."""
    for setting, fc, trained in outcomes:
        assert fc.trivial is not None
        if fc.hopeless:
            assert trained < fc.trivial + 0.15, (setting, trained)
        else:
            assert trained > fc.trivial + 0.25, (setting, trained, fc.private)
        assert min(fc.private) - 0.1 <= trained <= max(fc.private) + 0.1, (setting, trained, fc.private)


def test_the_advice_names_the_sampling_rate_and_the_rounds(
        outcomes: list[tuple[tuple[float, float, int, float], Forecast, float]]) -> None:
    """For DP-SGD the levers that move the noise multiplier most are the sampling rate and the
    number of rounds: a hopeless verdict names them before a larger ε."""
    (_, fc, _), = [o for o in outcomes if o[1].hopeless]
    line = verdict(fc)
    assert "a smaller training.sampling_rate or fewer training.iterations" in line
    assert line.index("training.sampling_rate") < line.index("a larger ε")


def test_the_search_grid_surrounds_the_job_and_keeps_its_privacy() -> None:
    """The job as written first; q × (1, ½, ¼), T × (½, 1, 2), η × (½, 1, 2); every candidate at
    the job's own ε and δ (what changes is the setting, never the budget)."""
    from mpc_erm.simulate.search import candidates

    spec = parse_job_file(JOB.format(eps=0.3, q=0.25, T=80, lr=1.0)).spec
    cands = candidates(spec)
    got = {(c.training.sampling_rate, c.training.iterations, c.training.learning_rate) for c in cands}
    assert cands[0] is spec and len(cands) == 27 == len(got)
    assert got == {(q, T, lr) for q in (0.25, 0.125, 0.0625) for T in (40, 80, 160) for lr in (0.5, 1.0, 2.0)}
    assert all(c.privacy == spec.privacy and c.model == spec.model for c in cands)
    tiny = parse_job_file(JOB.format(eps=0.3, q=0.002, T=80, lr=1.0)).spec  # q·n̂ = 3: ½ stays, ¼ would be < 1
    assert {c.training.sampling_rate for c in candidates(tiny)} == {0.002, 0.001}
