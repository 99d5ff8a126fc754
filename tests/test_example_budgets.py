"""The example budgets serve many jobs: every shipped party or owner config gives each data set a
lifetime δ at least 100 times the δ of every shipped job file on that data set.

Why: a lifetime δ equal to one job's δ reads (in `budget show`, and to anyone sizing a budget) as
one job per data set. The configs are read as TOML (no identity or data files needed); the job
files through the project's own loader, so each is also a valid job.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from mpc_erm.jobs.jobfile import load_job_file

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted([*(ROOT / "parties").glob("example-*.toml"), *(ROOT / "docker" / "config").glob("*.toml")])
JOBS = sorted(p for p in [*(ROOT / "coordinator" / "examples").glob("*.toml"),
                          *(ROOT / "docker" / "jobs").glob("*.toml")]
              if "method" in tomllib.loads(p.read_text()))  # job files (not coordinator or consortium files)
RATIO = 100


def _lifetimes() -> dict[str, list[tuple[str, float]]]:
    """data set id -> [(config, lifetime δ)] over every example config that offers it."""
    out: dict[str, list[tuple[str, float]]] = {}
    for path in CONFIGS:
        for ds, table in tomllib.loads(path.read_text()).get("datasets", {}).items():
            out.setdefault(ds, []).append((str(path.relative_to(ROOT)), float(table["delta"])))
    return out


def test_the_examples_are_found() -> None:
    names = {p.name for p in CONFIGS} | {p.name for p in JOBS}
    assert {"example-party.toml", "example-owner.toml", "alice.toml", "gradient-adult.toml", "output-adult.toml",
            "gradient-owners.toml", "output-owners.toml", "federated-owners.toml"} <= names, names


@pytest.mark.parametrize("job_path", JOBS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_data_set_serves_at_least_100_example_jobs(job_path: Path) -> None:
    job = load_job_file(job_path)
    offered = _lifetimes().get(job.job.dataset, [])
    assert offered, f"{job_path.name}: no example config offers data set {job.job.dataset!r}"
    asked = job.spec.privacy.delta
    for config, lifetime in offered:
        assert lifetime >= RATIO * asked, (f"{config}: datasets.{job.job.dataset}.delta = {lifetime:g} is less than "
                                           f"{RATIO} × the δ {asked:g} that {job_path.name} asks")
