"""Whether this daemon takes a job, decided from the job, the config and the plan alone.

A pure function (no I/O, no ledger, no store), so every refusal a coordinator can get is one
readable list of checks, testable without a daemon: the daemon's ``submit`` calls
:func:`check_caller`, :func:`check_request` and :func:`admit`, then reserves the decision's budget
in the ledger and keeps the job prepared until every member has prepared it
(:mod:`parties.agreement`). Each refusal is a gRPC status and one line naming the field to change.

A refusal also reaches the job's other members (they ask this daemon during the agreement, and
end their prepared copy of the job with it), so it carries a public side too
(:meth:`Refused.public_reason`: a :mod:`parties.public_errors` code and a reason naming only
job-file fields, this member's policy and the data set id): the coordinator's own answer may say
more (a budget refusal's ε figures), the other members' never does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from mpc_erm.jobs.jobfile import MAX_JOB_FILE_BYTES
from mpc_erm.privacy.plan import PlanError

from .config import DaemonConfig, DealerConfig, PartyConfig

if TYPE_CHECKING:
    from mpc_erm.jobs.jobfile import JobFile
    from mpc_erm.privacy.events import DpEvent
    from mpc_erm.privacy.plan import PrivacyPlan

__all__ = ["JOB_ID_RE", "MAX_JOB_TOML_BYTES", "SUBMIT_METHOD", "Admitted", "Refusal", "Refused", "admit",
           "check_caller", "check_request"]

JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
MAX_JOB_TOML_BYTES = MAX_JOB_FILE_BYTES  # the job file's own bound (its owner list)
SUBMIT_METHOD = "/mpc_erm.v1.PartyControl/SubmitJob"
MAX_PUBLIC = 500  # as parties.public_errors: a public reason is one short line
# the public_errors code of a refusal, by its gRPC status (a budget refusal says BUDGET itself)
_PUBLIC_CODES = {grpc.StatusCode.PERMISSION_DENIED: "POLICY", grpc.StatusCode.INVALID_ARGUMENT: "JOB_SPEC",
                 grpc.StatusCode.FAILED_PRECONDITION: "JOB_SPEC", grpc.StatusCode.ALREADY_EXISTS: "AGREEMENT",
                 grpc.StatusCode.UNAVAILABLE: "PEER_LOST"}


@dataclass(frozen=True)
class Refusal:
    """A job refused: the gRPC status and a one-line reason naming the field (public as it is:
    it names job-file fields and this member's policy)."""

    code: grpc.StatusCode
    reason: str


class Refused(Exception):
    """A control call refused (the servicer aborts the call with ``code`` and ``message``).

    ``public_code``/``public``: what the job's other members are told (default: the code that
    goes with ``code``, and ``message`` itself, for refusals whose message is public anyway)."""

    def __init__(self, code: grpc.StatusCode, message: str, *, public_code: str | None = None,
                 public: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message = code, message
        self.public_code = public_code or _PUBLIC_CODES.get(code, "INTERNAL")
        self.public = public if public is not None else message

    @classmethod
    def of(cls, refusal: Refusal) -> Refused:
        return cls(refusal.code, refusal.reason)

    def public_reason(self, member: str) -> str:
        """``"<CODE>: refused by <member>: <public reason>"``, one line: what the other members hear."""
        text = " ".join(f"{self.public_code}: refused by {member}: {self.public}".split())
        return text if len(text) <= MAX_PUBLIC else text[: MAX_PUBLIC - 3] + "..."


@dataclass(frozen=True)
class Admitted:
    """A job this daemon takes: what to reserve before it is stored (a dealer reserves nothing)."""

    dataset: str | None  # the data set whose budget pays for it; None at the dealer (no ledger)
    epsilon: float  # the job's own target, kept in the ledger for the record
    delta: float
    event: DpEvent  # the planned mechanism: what the ledger reserves and composes
    coordinator: str  # who submitted it (recorded with the job)
    # the same job calibrated for another target ε (its δ, rounds and sampling unchanged): what a
    # refusal asks for the largest ε that would still fit
    event_at: Callable[[float], DpEvent] | None = field(default=None, compare=False)


def check_caller(config: DaemonConfig, caller: str) -> Refused | None:
    """The submitting coordinator must be in ``policy.allowed_coordinators`` (the same answer the
    control service's authoriser gives for every other coordinator method; SubmitJob checks it
    here so that the refusal is remembered for the job's other members)."""
    if caller in config.policy.allowed_coordinators:
        return None
    return Refused(grpc.StatusCode.PERMISSION_DENIED, f"coordinator/{caller} may not call {SUBMIT_METHOD}",
                   public=f"coordinator {caller!r} is not in {config.identity.name}'s policy.allowed_coordinators")


def check_request(job_id: str, job_toml: str) -> Refusal | None:
    """The submission's own fields, before the job text is read."""
    if not JOB_ID_RE.fullmatch(job_id):
        return Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                       f"job_id: must be 1-64 of [A-Za-z0-9_-] starting alphanumeric, got {job_id!r}")
    if len(job_toml.encode()) > MAX_JOB_TOML_BYTES:
        return Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"job_toml: larger than {MAX_JOB_TOML_BYTES} bytes")
    return None


def admit(config: DaemonConfig, job: JobFile, caller: str, plan: PrivacyPlan | PlanError) -> Admitted | Refusal:
    """Membership, the peers' roles, the plan, the policy (methods, ε per job, test-only noise,
    iterations) and, at a party, the data set, in that order: the first that fails is the refusal.

    ``job`` was parsed with this daemon's peers and itself as the known names; ``plan`` is the
    job's privacy plan, or the :class:`PlanError` that says why it could not be made."""
    bad_arg, denied, precondition = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED,
                                     grpc.StatusCode.FAILED_PRECONDITION)
    name = config.identity.name
    jt, spec = job.job, job.spec
    if isinstance(config, DealerConfig):
        if jt.dealer != name:
            return Refusal(precondition, f"job.dealer: this dealer ({name}) is not the job's dealer "
                                         f"({jt.dealer or 'none: trust = ' + jt.trust})")
    elif name not in jt.parties:
        return Refusal(precondition, f"job.parties: this party ({name}) is not one of {', '.join(jt.parties)}")
    for p in jt.parties:
        if p != name and config.peers[p].role != "party":
            return Refusal(precondition, f"job.parties: {p!r} is a {config.peers[p].role} in this daemon's peers")
    if jt.dealer is not None and jt.dealer != name and config.peers[jt.dealer].role != "dealer":
        return Refusal(precondition, f"job.dealer: {jt.dealer!r} is a {config.peers[jt.dealer].role} in this "
                                     "daemon's peers, not a dealer")
    if isinstance(plan, PlanError):
        return Refusal(bad_arg, str(plan))
    pol = config.policy
    if spec.method not in pol.allowed_methods:
        return Refusal(denied, f"method: {spec.method!r} is not allowed by {name}'s policy "
                               f"(allowed: {', '.join(pol.allowed_methods)})")
    if spec.privacy.epsilon > pol.max_epsilon_per_job:
        return Refusal(denied, f"privacy.epsilon: {spec.privacy.epsilon:g} exceeds {name}'s "
                               f"max_epsilon_per_job ({pol.max_epsilon_per_job:g})")
    if jt.test_no_noise and not pol.allow_test_only:
        return Refusal(denied, f"job.test_no_noise: a zero-noise (test-only) job is refused by {name}'s "
                               "policy (allow_test_only = false)")
    if spec.method == "gradient" and spec.training.iterations > pol.max_iterations:
        return Refusal(denied, f"training.iterations: {spec.training.iterations} exceeds {name}'s "
                               f"max_iterations ({pol.max_iterations})")
    dataset = None  # a compute party of a job with owners holds no rows: no data set, no ledger spend
    if isinstance(config, PartyConfig) and not jt.owners:
        if jt.dataset not in config.datasets:
            return Refusal(precondition, f"job.dataset: {name} offers no dataset {jt.dataset!r}")
        dataset = jt.dataset
        if spec.model.name == "plugin":
            refusal = _check_plugin(config, spec.model.plugin, spec.model.plugin_digest)
            if refusal is not None:
                return Refusal(precondition, refusal)
    return Admitted(dataset=dataset, epsilon=spec.privacy.epsilon, delta=spec.privacy.delta, event=plan.event,
                    coordinator=caller, event_at=lambda eps: plan.at_epsilon(eps).event)


def _check_plugin(config: PartyConfig, plugin: str | None, digest: str | None) -> str | None:
    """Why this party cannot build the job's plugin network, or None: it must list the id in its
    config's [models] and hold the source the job pins (its module is read, not imported; only its
    parent packages are, to locate it)."""
    from mpc_erm.models.plugins import PluginError, source_digest

    from .config import plugin_entry_point

    try:
        entry_point = plugin_entry_point(config, plugin)
    except ValueError as exc:
        return str(exc)
    try:
        here = source_digest(entry_point)
    except PluginError as exc:
        return f"model.plugin: {config.identity.name} cannot read its plugin {plugin!r}: {exc}"
    if here != digest:
        return (f"model.plugin_digest: {config.identity.name}'s plugin {plugin!r} has source digest {here}, the job "
                f"pins {digest}")
    return None
