"""Protocols as transport-independent state machines (see aggregation.SecureAggregator)."""

from mpc_erm.models.job_model import loss_for
from mpc_erm.privacy.plan import plan_job
from mpc_erm.protocols.aggregation import NO_NOISE, NoiseSpec, SecureAggregator
from mpc_erm.protocols.common import PartySizes, project_to_unit_ball
from mpc_erm.protocols.dpsgd import DpSgd
from mpc_erm.protocols.fedls import DpFedLs
from mpc_erm.protocols.gradient_perturbation import GradientPerturbation
from mpc_erm.protocols.output_perturbation import LocalSolveError, OutputPerturbation
from mpc_erm.spec import JobSpec, ModelSpec, PrivacySpec, TrainingSpec

__all__ = [
    "NO_NOISE",
    "DpFedLs",
    "DpSgd",
    "GradientPerturbation",
    "JobSpec",
    "LocalSolveError",
    "ModelSpec",
    "NoiseSpec",
    "OutputPerturbation",
    "PartySizes",
    "PrivacySpec",
    "SecureAggregator",
    "TrainingSpec",
    "loss_for",
    "plan_job",
    "project_to_unit_ball",
]
