"""The one-run privacy audit through real daemons: the canaries of :mod:`mpc_erm.simulate.audit` in
the parties' own data files, the job run by three party daemons (replicated sharing, mTLS, the
noise sampled inside the MPC), and the bound computed from the model the coordinator fetched.

Why beside the in-process audit: that one runs the daemons' run code, this one runs the daemons —
their workers, the MPC's noise and its grid, the result the parties release — so a leak in
anything between the run code and the released model would show here and not there.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mpc_erm.data import Dataset
from mpc_erm.data.arrays import save_numpy
from mpc_erm.jobs.status import TERMINAL
from mpc_erm.simulate.audit import PrivacyAudit, audit_scores, linear_audit
from mpc_erm.spec import JobSpec

from .consortium import LocalConsortium

__all__ = ["audit_through_daemons"]

DATASET = "audited"


def _job_toml(spec: JobSpec, parties: list[str], broken_control: bool) -> str:
    """The job file the coordinator submits: ``spec``'s sections, the consortium's members."""
    m, pv, tr = spec.model, spec.privacy, spec.training
    plist = ", ".join(f'"{p}"' for p in parties)
    lines = [f'method = "{spec.method}"', "", "[job]", 'name = "privacy-audit"', f'dataset = "{DATASET}"',
             f"parties = [{plist}]", 'trust = "replicated"', *(["test_no_noise = true"] if broken_control else []),
             "", "[model]", f'name = "{m.name}"', f"lam = {m.lam!r}", "", "[privacy]", f"epsilon = {pv.epsilon!r}",
             f"delta = {pv.delta!r}", f'adjacency = "{pv.adjacency}"']
    if pv.public_n is not None:
        lines.append(f"public_n = {pv.public_n}")
    if spec.method == "output":
        lines.append(f'mechanism = "{pv.mechanism}"')
    else:
        lines += [f"clip = {pv.clip!r}", "", "[training]", f"iterations = {tr.iterations}",
                  f"learning_rate = {tr.learning_rate!r}"]
    return "\n".join(lines) + "\n"


def audit_through_daemons(spec: JobSpec, parts: Sequence[Dataset], *, canaries: int = 200, seed: int = 0,
                          alpha: float = 0.05, broken_control: bool = False,
                          root: Path | None = None) -> PrivacyAudit:
    """Audit ``spec`` (as :func:`~mpc_erm.simulate.audit.audit_job`) with ``parts`` held by three
    party daemons started for it; ``broken_control``: the job's test-only zero-noise mode."""
    if len(parts) != 3:
        raise ValueError(f"data: the audit's consortium has three parties, got {len(parts)} parts")
    included, rows, plan = linear_audit(spec, parts, canaries, seed)
    stated, d = plan.guarantee(), parts[0].d
    with tempfile.TemporaryDirectory(prefix="mpc-erm-audit-") as tmp:
        base = Path(root or tmp)
        files = {name: save_numpy(r, base / f"{name}.npz") for name, r in zip(("alice", "bob", "carol"), rows,
                                                                                strict=True)}
        cons = LocalConsortium(base / "consortium", parties=3, dataset=DATASET, dealer=False,
                               allow_test_only=broken_control, max_epsilon_per_job=max(1.0, spec.privacy.epsilon),
                               budget_epsilon=max(3.0, 3 * spec.privacy.epsilon),
                               party_data={n: {"format": "npz", "path": str(p)} for n, p in files.items()})
        job = base / "job.toml"
        job.write_text(_job_toml(spec, cons.party_names, broken_control))
        with cons, cons.client() as client:
            job_id = client.submit(job)["job_id"]
            ends: dict[str, Any] = {}
            for ev in client.watch(job_id):
                if ev["phase"] in TERMINAL or ev["phase"] == "error":
                    ends[ev["member"]] = ev
            if any(e["phase"] != "succeeded" for e in ends.values()) or not ends:
                phases = "; ".join(f"{m}: {e['phase']} ({e['payload'].get('reason') or e['payload'].get('message')})"
                                   for m, e in ends.items())
                raise RuntimeError(f"the audited job did not succeed: {phases}")
            client.result(job_id, base / "result")
        from mpc_erm.models.bundle import load_model

        theta = load_model(base / "result").theta
    return audit_scores(theta[d: d + canaries], included, stated.epsilon, stated.delta, alpha=alpha,
                        broken_control=broken_control)
