"""Knowledge transfer (DPSL-KT, ``[transfer]``): the teacher's scores on public rows, released once.

- the public rows are their seed's own (the same matrix at every member), in the unit ball, and
  the plan's ‖X̃‖₂ is an upper bound within 10⁻⁸ of NumPy's SVD;
- the plan's sensitivity is that norm times the output release's bound, computed here from the
  formula (2G/(nλ) plus the solvers' term); the event, σ/Δ and ε are a plain output job's, and ε
  matches dp-accounting's RDP of one Gaussian release;
- what is released moves by less than the stated sensitivity when one row is replaced by the
  worst rows we can write (plaintext replay of the run, noise off);
- the student recovers the teacher from noise-free scores (least squares) and a sparse model
  from its scores (hard thresholding); a softmax job releases K scores a row;
- the spec refuses it where it does not apply, and a job without it keeps its digest.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
import torch

from mpc_erm.data import Dataset
from mpc_erm.jobs.jobfile import JobFileError, parse_job_file
from mpc_erm.models import facts
from mpc_erm.models.public_features import PublicFeatures, round_up
from mpc_erm.privacy.plan import SAMPLER_DELTA_SHARE, plan_job, public_sizes
from mpc_erm.privacy.verify import verify_report
from mpc_erm.protocols.knowledge_transfer import sparse_least_squares
from mpc_erm.simulate.forecast import InProcessJob
from mpc_erm.spec import JobSpec

D, COUNTS = 12, (40, 50, 60)


def _spec(loss: str = "ridge", lam: float = 0.05, **transfer: object) -> JobSpec:
    model: dict[str, object] = {"name": loss, "lam": lam}
    if loss == "softmax":
        model["n_classes"] = 3
    return JobSpec.model_validate({"method": "output", "model": model,
                                   "privacy": {"epsilon": 2.0, "delta": 1e-5, "mechanism": "gaussian"},
                                   "transfer": {"rows": 30, "seed": 5, **transfer}})


def _parts(loss: str = "ridge", seed: int = 0) -> list[Dataset]:
    rng = np.random.default_rng(seed)
    out = []
    for j, n in enumerate(COUNTS):
        X = rng.uniform(-1, 1, (n, D)) / math.sqrt(D)
        if loss == "ridge":
            y, task = np.clip(X @ np.linspace(-1, 1, D) * 2, -1, 1), "regression"
        elif loss == "softmax":
            y, task = rng.integers(0, 3, n).astype(float), "multiclass"
        else:
            y, task = np.where(X[:, 0] > 0, 1.0, -1.0), "binary"
        out.append(Dataset(X, y, task, f"part{j}"))
    return out


def _release(spec: JobSpec, parts: list[Dataset]) -> torch.Tensor:
    """The noise-free release (the scores' weighted sum) as the run hands it to the aggregator."""
    plan = plan_job(spec, sampler="mpc", test_no_noise=True, sizes=public_sizes(spec, [p.n for p in parts]),
                    n_features=D)
    run = InProcessJob(spec, plan, parts).run
    return run.weights @ run.solve_locally()


def test_the_public_rows_are_their_seeds_and_the_norm_a_certified_bound() -> None:
    pf = PublicFeatures(300, 40, "gaussian", 0.3, 11)
    X = pf.matrix()
    assert np.array_equal(X, PublicFeatures(300, 40, "gaussian", 0.3, 11).matrix())
    assert not np.array_equal(X, PublicFeatures(300, 40, "gaussian", 0.3, 12).matrix())
    assert np.linalg.norm(X, axis=1).max() <= 1.0 + 1e-12 and (np.linalg.norm(X, axis=1) > 0.999).any()
    for p in (pf, PublicFeatures(40, 300, "uniform", None, 3), PublicFeatures(1, 7)):
        exact = float(np.linalg.svd(p.matrix(), compute_uv=False)[0])
        assert exact <= p.operator_norm() <= exact * (1 + 1e-8), (exact, p.operator_norm())
    assert PublicFeatures(5, 100).matrix().max() <= 0.1 and round_up(1.0000000001, 3) == 1.01
    assert round_up(123456.7, 3) == 124000.0 and round_up(0.5, 9) == 0.5
    with pytest.raises(ValueError, match="transfer.rows"):
        PublicFeatures(100_000, 10_000)


@pytest.mark.parametrize("loss", ["ridge", "logistic", "softmax"])
def test_the_sensitivity_is_the_norm_times_the_models_and_the_event_a_plain_output_jobs(loss: str) -> None:
    spec = _spec(loss)
    sizes = public_sizes(spec, COUNTS)
    plan = plan_job(spec, sampler="mpc", sizes=sizes, n_features=D)
    plain = plan_job(JobSpec.model_validate({**spec.model_dump(mode="json", exclude_none=True),
                                             "transfer": None}), sampler="mpc", sizes=sizes, n_features=D)
    X = PublicFeatures(30, D, seed=5).matrix()
    n, lam = sum(COUNTS), spec.model.lam
    G = facts.lipschitz(loss, radius=1 / math.sqrt(lam))
    model_bound = 2 * G / (n * lam) + 2 * (max(COUNTS) / n) * spec.training.solver_tol
    norm = float(np.linalg.svd(X, compute_uv=False)[0])
    assert plan.sensitivity_l2() == pytest.approx(norm * model_bound, rel=1e-8)
    assert plan.transfer is not None and plan.dim == 30 * (3 if loss == "softmax" else 1)
    assert plan.event == plain.event and plan.noise_multiplier == plain.noise_multiplier
    assert plan.noise_scale() == pytest.approx(plan.noise_multiplier * plan.sensitivity_l2())
    assert plan.member_bound(2) == pytest.approx(plain.member_bound(2) * plan.transfer.norm)
    # one Gaussian release at σ/Δ: dp-accounting's RDP ε, continuous Gaussian (ours is the discrete one's, ≤)
    acc = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.GaussianDpEvent(plan.noise_multiplier))
    theirs = acc.get_epsilon(spec.privacy.delta * (1 - SAMPLER_DELTA_SHARE))
    ours = plan.guarantee().epsilon
    assert ours <= theirs * (1 + 1e-6) and ours == pytest.approx(theirs, rel=2e-2)
    rep = plan.report(noise_scale=plan.noise_scale(), realisation=None, trust_model="test", parties=3)
    assert rep.plan is not None and "knowledge transfer" in rep.plan["what_is_public"]
    assert rep.plan["transfer"]["operator_norm"] == plan.transfer.norm


def _worst_rows(loss: str) -> list[tuple[np.ndarray, float]]:
    """Rows on the unit sphere with extreme labels: along the public rows' top singular vector,
    along the first coordinate, and along the teacher's own direction."""
    X = PublicFeatures(30, D, seed=5).matrix()
    top = np.linalg.svd(X)[2][0]
    e0 = np.eye(D)[0]
    labels = {"ridge": (1.0, -1.0), "logistic": (1.0, -1.0), "softmax": (0.0, 2.0)}[loss]
    return [(v, y) for v in (top, -top, e0) for y in labels]


@pytest.mark.parametrize("loss", ["ridge", "logistic", "softmax"])
def test_replacing_a_row_moves_the_release_by_less_than_the_stated_sensitivity(loss: str) -> None:
    spec, parts = _spec(loss), _parts(loss)
    stated = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, COUNTS), n_features=D).sensitivity_l2()
    base = _release(spec, parts)
    moved = []
    for party in (0, 2):
        for row in (0, 7):
            for x, y in _worst_rows(loss):
                X, Y = np.array(parts[party].X), np.array(parts[party].y)
                X[row], Y[row] = x, y
                nb = [p if j != party else Dataset(X, Y, p.task, p.name) for j, p in enumerate(parts)]
                moved.append(float((_release(spec, nb) - base).norm()))
    assert 0 < max(moved) <= stated, (max(moved), stated)


def test_the_student_recovers_the_teacher_and_a_sparse_model() -> None:
    spec = _spec("ridge", rows=60)
    parts = _parts("ridge")
    plan = plan_job(spec, sampler="mpc", test_no_noise=True, sizes=public_sizes(spec, COUNTS), n_features=D)
    job = InProcessJob(spec, plan, parts)
    teacher = job.run.weights @ torch.stack([job.run.proto.local_model(X, y) for X, y in job.run.members])
    student = job.release(torch.Generator().manual_seed(0))
    torch.testing.assert_close(student, teacher, atol=1e-9, rtol=0)  # m = 60 ≥ d: least squares is exact
    # a 4-sparse model from its scores on fewer public rows than features (IGHT with s = 2s*)
    pf = PublicFeatures(100, 200, seed=2)
    X = torch.from_numpy(pf.matrix().copy())
    w = torch.zeros(200, dtype=torch.float64)
    w[[3, 50, 120, 199]] = torch.tensor([2.0, -1.5, 1.0, 3.0], dtype=torch.float64)
    got = sparse_least_squares(X, (X @ w)[:, None], 8, 2000, pf.operator_norm())[0]
    assert int((got != 0).sum()) <= 8
    torch.testing.assert_close(got, w, atol=1e-6, rtol=0)


def test_a_softmax_job_releases_k_scores_a_row_and_its_report_verifies() -> None:
    spec, parts = _spec("softmax", student_sparsity=5), _parts("softmax")
    plan = plan_job(spec, sampler="ideal", sizes=public_sizes(spec, COUNTS), n_features=D)
    job = InProcessJob(spec, plan, parts)
    assert job.run.p == 90 and job.run.solve_locally().shape == (3, 90)
    theta = job.release(torch.Generator().manual_seed(1))
    assert theta.shape == (3 * D,) and all(int((w != 0).sum()) <= 5 for w in theta.reshape(3, D))
    assert job.run.parameters()["public_rows"] == 30
    rep = job.run.transfer.report("test")
    assert rep.parameters["protocol"] == "knowledge_transfer" and rep.plan["dim"] == 90
    mpc_plan = plan_job(spec, sampler="mpc", sizes=public_sizes(spec, COUNTS), n_features=D)
    from mpc_erm.mpc.noise import realise

    real = realise(mpc_plan, 3)
    mpc_rep = mpc_plan.report(noise_scale=real.report_scale, realisation=real.describe(), trust_model="MPC: test",
                              parties=3)
    v = verify_report(mpc_rep)
    assert v.ok, [c for c in v.checks if not c.ok]
    assert any(c.name == "transfer" and c.ok for c in v.checks)
    from mpc_erm.privacy.statement import job_statement

    said = job_statement(mpc_rep, job_name="kt")  # the plain-language statement says what left the MPC
    assert "scores" in said and "30 public rows" in said and "teacher itself is never released" in said
    assert "One noisy average of the parties' locally trained models: the released model" not in said


JOB = """method = "output"
[job]
name = "kt"
dataset = "d"
parties = ["alice", "bob", "carol"]
trust = "replicated"
{owners}
[model]
name = "logistic"
lam = 0.01
[privacy]
epsilon = 1.0
delta = 1e-5
mechanism = "gaussian"
{adjacency}
[transfer]
rows = 100
"""


def test_the_spec_refuses_it_where_it_does_not_apply_and_keeps_old_digests() -> None:
    with pytest.raises(ValueError, match="transfer: knowledge transfer"):
        JobSpec.model_validate({"method": "gradient", "model": {"name": "ridge", "lam": 1e-3},
                                "privacy": {"epsilon": 1.0, "delta": 1e-5}, "transfer": {"rows": 10}})
    with pytest.raises(ValueError, match="transfer.rows"):
        _spec(rows=0)
    with pytest.raises(JobFileError, match="transfer: knowledge transfer runs on compute parties"):
        parse_job_file(JOB.format(owners='owners = ["o1", "o2"]\nfeatures = 5',
                                  adjacency='adjacency = "add_remove"\npublic_n = 100'))
    assert parse_job_file(JOB.format(owners="", adjacency="")).spec.transfer is not None
    plain = _spec()
    assert '"transfer"' in plain.canonical_json()
    assert '"transfer"' not in JobSpec.model_validate({**plain.model_dump(mode="json", exclude_none=True),
                                                       "transfer": None}).canonical_json()
    with pytest.raises(ValueError, match="transfer.rows"):  # too large for the features: the plan names the field
        plan_job(_spec(rows=1_000_000), sampler="mpc", sizes=public_sizes(plain, COUNTS), n_features=1000)


def _l0_ridge(X: np.ndarray, y: np.ndarray, lam: float) -> np.ndarray:
    """The exact minimiser of (2n)⁻¹‖y − Xθ‖² + λ‖θ‖²/2 over θ with one non-zero (s = 1), by
    enumerating the supports: the thesis's converged teacher."""
    n, d = X.shape
    best, arg = np.inf, np.zeros(d)
    for j in range(d):
        a = float(X[:, j] @ y / n) / (float(X[:, j] @ X[:, j] / n) + lam)
        theta = np.zeros(d)
        theta[j] = a
        value = float(((y - X @ theta) ** 2).sum() / (2 * n) + lam * a * a / 2)
        if value < best:
            best, arg = value, theta
    return arg


def test_the_thesis_l0_teacher_has_no_such_bound_which_is_why_it_is_not_shipped() -> None:
    """Thm 3.3.3's proof bounds the ℓ0-constrained minimisers of neighbouring data sets within
    √(2s)·γ/(nλ) (its eq. 3.6.4). Two features, each predicting its own group of rows: replacing one
    row moves the majority to the other group, the support flips, and the converged teacher moves
    by about 0.7 — 98× that bound at n = 10,001, λ = 0.01, and growing linearly with n. The product's convex
    teacher on the same pair moves by less than its stated 2G/(nλ)."""
    k, lam = 5000, 0.01
    X = np.array([[1.0, 0.0]] * (k + 1) + [[0.0, 1.0]] * k)
    y = np.full(2 * k + 1, 0.5)
    X2 = X.copy()
    X2[0] = [0.0, 1.0]  # one row replaced: the groups are now k and k + 1
    n = X.shape[0]
    a, b = _l0_ridge(X, y, lam), _l0_ridge(X2, y, lam)
    assert a[1] == 0 and b[0] == 0  # the support flipped
    grads = [np.abs((Z @ t - y)[:, None] * Z).max() for Z, t in ((X, a), (X2, b))]
    claimed = math.sqrt(2) * max(grads) / (n * lam)
    assert np.linalg.norm(a - b) > 90 * claimed, (np.linalg.norm(a - b), claimed)
    # the convex (ridge) teacher: within 2G/(nλ), G = 1 + 1/√λ (|y| ≤ 1, ‖x‖ ≤ 1)
    ridge = [np.linalg.solve(Z.T @ Z / n + lam * np.eye(2), Z.T @ y / n) for Z in (X, X2)]
    assert np.linalg.norm(ridge[0] - ridge[1]) <= 2 * (1 + 1 / math.sqrt(lam)) / (n * lam)


def test_the_privacy_audit_runs_on_a_transfer_job_and_flags_its_noise_off_control() -> None:
    """`audit privacy`'s canary rows through a knowledge-transfer job (200 canaries, least-squares
    student on 2,000 public rows): the job's empirical ε is below its stated one, the same job with
    its noise switched off is flagged above it."""
    from mpc_erm.simulate.audit import audit_job

    rng = np.random.default_rng(0)
    parts = []
    for j in range(3):
        X = rng.uniform(-1, 1, (300, 10)) / math.sqrt(10)
        parts.append(Dataset(X, np.where(X[:, 0] + 0.1 * rng.normal(size=300) > 0, 1.0, -1.0), "binary", f"p{j}"))
    spec = JobSpec.model_validate({"method": "output", "model": {"name": "logistic", "lam": 0.01},
                                   "privacy": {"epsilon": 1.0, "delta": 1e-5, "mechanism": "gaussian"},
                                   "transfer": {"rows": 2000}})
    real = audit_job(spec, parts, canaries=200)
    control = audit_job(spec, parts, canaries=200, broken_control=True)
    assert real.epsilon_lower_bound <= real.stated_epsilon < control.epsilon_lower_bound, (real, control)


def test_the_public_test_file_as_public_rows_is_pinned_by_digest_and_verified_with_the_file() -> None:
    """``public = "public_test"``: the rows are the data set's public test file (as every member
    reads it). The plan binds them only when given, states their digest and certified norm, and
    `report verify` recomputes the norm from the file, failing without it or with another file."""
    from mpc_erm.mpc.noise import realise

    spec = JobSpec.model_validate({"method": "output", "model": {"name": "logistic", "lam": 0.05},
                                   "privacy": {"epsilon": 2.0, "delta": 1e-5, "mechanism": "gaussian"},
                                   "transfer": {"public": "public_test", "student_sparsity": 3}})
    sizes = public_sizes(spec, COUNTS)
    pending = plan_job(spec, sampler="mpc", sizes=sizes, n_features=D)
    assert pending.transfer is not None and pending.transfer.norm is None and pending.dim is None
    with pytest.raises(ValueError, match="no feature count yet"):
        pending.sensitivity_l2()
    rng = np.random.default_rng(3)
    public = rng.uniform(-1, 1, (45, D))  # rows outside the unit ball: scaled onto it, as the parties' rows
    plan = plan_job(spec, sampler="mpc", sizes=sizes, n_features=D, public_rows=public)
    assert plan.transfer is not None and plan.dim == 45
    held = public / np.maximum(1.0, np.linalg.norm(public, axis=1, keepdims=True))
    exact = float(np.linalg.svd(held, compute_uv=False)[0])
    assert exact <= plan.transfer.norm <= exact * (1 + 1e-8)
    parts = _parts("logistic")
    job = InProcessJob(spec, plan, parts)
    assert int((job.release(torch.Generator().manual_seed(0)) != 0).sum()) <= 3
    with pytest.raises(ValueError, match="transfer.rows"):
        plan_job(JobSpec.model_validate({**spec.model_dump(mode="json", exclude_none=True),
                                         "transfer": {"public": "public_test", "rows": 44}}),
                 sampler="mpc", sizes=sizes, n_features=D, public_rows=public)
    with pytest.raises(ValueError, match="transfer.public"):
        plan_job(spec, sampler="mpc", sizes=sizes, n_features=D, public_rows=public[:, :5])
    with pytest.raises(ValueError, match="transfer.seed"):
        JobSpec.model_validate({**spec.model_dump(mode="json", exclude_none=True),
                                "transfer": {"public": "public_test", "seed": 4}})
    with pytest.raises(ValueError, match="transfer.rows: required"):
        JobSpec.model_validate({**spec.model_dump(mode="json", exclude_none=True), "transfer": {"seed": 4}})
    real = realise(plan, 3)
    rep = plan.report(noise_scale=real.report_scale, realisation=real.describe(), trust_model="MPC: test", parties=3)
    assert rep.plan is not None and rep.plan["transfer"]["distribution"] == "public_test"
    checks = {c.name: c for c in verify_report(rep).checks}
    assert not checks["transfer"].ok and "--public-rows" in checks["transfer"].detail
    assert verify_report(rep, public).ok
    other = {c.name: c for c in verify_report(rep, public[::-1]).checks}
    assert not other["transfer"].ok and "sha256" in other["transfer"].detail
