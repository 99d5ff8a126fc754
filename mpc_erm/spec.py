"""The training spec: what every party must agree on before a job starts.

One pydantic model serves the simulator, the job TOML of the coordinator and the spec hash all
parties compare before any share moves (:meth:`JobSpec.digest`), so a field means the same thing
everywhere. Errors name the field.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .plugin_ids import DIGEST, PLUGIN_ID

Method = Literal["output", "gradient"]
LINEAR_MODELS = ("logistic", "ridge", "huber_svm", "softmax")
NETWORK_MODELS = ("mlp", "mnist_cnn", "cifar_cnn", "tf_cifar_cnn", "char_lstm",  # mpc_erm.models.networks
                  "plugin")  # .plugins
ModelName = Literal["logistic", "ridge", "huber_svm", "softmax", "mlp", "mnist_cnn", "cifar_cnn", "tf_cifar_cnn",
                    "char_lstm", "plugin"]
Optimizer = Literal["sgd", "adam", "srm"]
# fields that mean something for networks only: a linear job must leave them at their defaults
NETWORK_MODEL_FIELDS = ("input_shape", "hidden", "vocab", "init_seed", "plugin", "plugin_digest")
NETWORK_TRAINING_FIELDS = ("sampling_rate", "optimizer", "momentum", "adam_betas", "schedule", "schedule_step",
                           "schedule_gamma", "srm_momentum", "clip_difference", "max_step", "batch_size")
#: DP-SRM's own fields (optimizer = "srm"): absent from the canonical JSON when unset (older digests)
SRM_FIELDS = ("srm_momentum", "clip_difference", "max_step")
Schedule = Literal["constant", "step", "cosine"]
OutputMechanism = Literal["l2_laplace", "gaussian", "laplace_thesis"]
GradientAccountant = Literal["gdp", "zcdp", "rdp", "pld"]
Weighting = Literal["pooled", "thesis"]
Adjacency = Literal["replace", "add_remove"]
#: Who makes the noise: "mpc", sampled inside the MPC (no member knows it); "distributed", each
#: compute party adds its own share, sized so the honest parties' shares alone carry the guarantee
#: (mpc_erm.privacy.distributed): no sampler circuit, √(k/(k−t)) times the noise.
NoiseKind = Literal["mpc", "distributed"]


def _arrays(data: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """TOML and JSON arrays arrive as lists; the frozen spec keeps tuples."""
    return {k: tuple(v) if k in names and isinstance(v, list) else v for k, v in data.items()}


class _Strict(BaseModel):
    # no float field means anything at ±inf or NaN (an infinite clip would mean infinite noise); TOML can write both
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    name: ModelName = "logistic"
    lam: float = Field(1e-3, ge=0.0, description="ridge coefficient λ of λ/2·‖θ‖² (networks: weight decay, "
                                                 "default 0)")
    n_classes: int | None = Field(None, ge=2, le=10_000, description="softmax (which may leave it to the "
                                                                     "schema job.schema_sha256 pins) and networks")
    huber_h: float = Field(0.5, gt=0.0, le=1.0, description="huber_svm smoothing width h")
    # networks (mpc_erm.models.networks): one example's shape, hidden widths, vocabulary, init seed
    input_shape: tuple[int, ...] | None = Field(None, min_length=1, max_length=4)
    hidden: tuple[int, ...] = Field((128,), max_length=16)
    vocab: int | None = Field(None, ge=2, le=1_000_000, description="char_lstm only")
    init_seed: int = Field(0, ge=0, lt=2**63, description="networks: seed of the agreed initial weights")
    # name = "plugin": a network each party builds with its own installed code (mpc_erm.models.plugins)
    plugin: str | None = Field(None, pattern=f"^{PLUGIN_ID}$",
                               description="plugin: the id each party maps to an entry point in its config")
    plugin_digest: str | None = Field(None, pattern=f"^{DIGEST}$",
                                      description="plugin: sha256 of the plugin's source (mpc-erm model digest)")

    @model_validator(mode="before")
    @classmethod
    def _network_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _arrays(data, ("input_shape", "hidden"))
        # a network's λ is weight decay, off unless asked for (1e-3 is the linear models' default)
        if data.get("name") in NETWORK_MODELS and "lam" not in data:
            return {**data, "lam": 0.0}
        return data

    @field_validator("lam")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v

    @property
    def is_network(self) -> bool:
        return self.name in NETWORK_MODELS


class PrivacySpec(_Strict):
    epsilon: float = Field(..., gt=0.0, le=100.0)
    delta: float = Field(0.0, ge=0.0, lt=1.0)
    # output perturbation: noise distribution; gradient perturbation: always Gaussian
    mechanism: OutputMechanism = "l2_laplace"
    # None: the tightest accountant valid for the noise actually sampled (RDP for the in-MPC discrete
    # Gaussian, exact GDP for the simulator's continuous one); see mpc_erm.privacy.plan
    accountant: GradientAccountant | None = None
    clip: float | None = Field(
        None, gt=0.0, description="per-example gradient ℓ2 clip C; default: the loss's Lipschitz constant G"
    )
    adjacency: Adjacency = "replace"
    noise: NoiseKind = "mpc"
    public_n: int | None = Field(
        None, ge=1, le=10**12,
        description="add_remove only: the public record count aggregates are divided by (exact counts stay private)",
    )
    party_rows: dict[str, int] | None = Field(None, description=(
        "training.batch_size only: each party's row count, public (replace-one adjacency), which the plan needs "
        "before the job starts; each party checks its own at the agreement"))

    @field_validator("party_rows")
    @classmethod
    def _rows(cls, v: dict[str, int] | None) -> dict[str, int] | None:
        if v is not None and (not v or any(isinstance(n, bool) or n < 1 or n > 10**12 for n in v.values())):
            raise ValueError("each party's row count: 1 to 10^12")
        return v

    @field_validator("epsilon", "delta")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        return v


class TrainingSpec(_Strict):
    iterations: int = Field(100, ge=1, le=10_000_000, description="T, gradient rounds")
    # up to 10⁵: rows live in the unit ball, so a d-feature linear model's step is of order d
    learning_rate: float = Field(1.0, gt=0.0, le=1e5, description="η")
    ls_sigma: float = Field(0.0, ge=0.0, le=1e4, description="Laplacian smoothing σ (0: off); per parameter "
                                                             "tensor for networks")
    weighting: Weighting = "pooled"
    solver_tol: float = Field(1e-9, gt=0.0, le=1e-3, description="certified ‖θ̂−θ*‖ of local solves")
    # networks (DP-SGD / DP-Adam): Poisson sampling and the public optimizer step
    sampling_rate: float = Field(1.0, gt=0.0, le=1.0, description="q: each record joins a round w.p. q")
    batch_size: int | None = Field(None, ge=1, le=10**9, description=(
        "b: exactly b rows a round, drawn uniformly without replacement from all parties' pooled rows by a secret "
        "shuffle among the three parties (trust = 'replicated'), each party told only its own rows' draws; needs "
        "adjacency = 'replace' and privacy.party_rows; None: Poisson batches at sampling_rate"))
    optimizer: Optimizer = "sgd"
    momentum: float = Field(0.0, ge=0.0, lt=1.0, description="sgd momentum")
    adam_betas: tuple[float, float] = (0.9, 0.999)
    schedule: Schedule = "constant"
    schedule_step: int = Field(1, ge=1, description="step schedule: rounds between decays")
    schedule_gamma: float = Field(0.1, gt=0.0, le=1.0, description="step schedule: decay factor")
    # DP-SRM (optimizer = "srm"): each example's increment γ·clip_C1(∇f(θ_t)) + (1−γ)·clip_C2(∇f(θ_t) − ∇f(θ_t−1)),
    # its norm within privacy.clip = γ·C1 + (1−γ)·C2; the public recursion v_t = ṽ_t + (1−γ)·v_t−1
    srm_momentum: float | None = Field(None, gt=0.0, le=1.0, description="γ of DP-SRM's recursive momentum "
                                                                         "(optimizer = 'srm')")
    clip_difference: float | None = Field(None, gt=0.0, le=1e6, description="C₂: DP-SRM's clip of each example's "
                                                                             "gradient difference between the last "
                                                                             "two public models")
    max_step: float | None = Field(None, gt=0.0, le=1e6, description="DP-SRM: the longest public step ‖Δθ‖ "
                                                                      "(the thesis's adaptive step size)")
    # DP-IGHT (sparse linear models): after each public step keep the s largest-magnitude entries of θ
    sparsity: int | None = Field(None, ge=1, le=100_000_000, description="s: hard thresholding to s non-zeros "
                                                                         "after each step (DP-IGHT); linear "
                                                                         "gradient jobs")

    @model_validator(mode="before")
    @classmethod
    def _tuples(cls, data: Any) -> Any:
        return _arrays(data, ("adam_betas",)) if isinstance(data, dict) else data

    @field_validator("adam_betas")
    @classmethod
    def _betas(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError("both betas must be in [0, 1)")
        return v


class FederatedSpec(_Strict):
    """DP-Fed-LS's local training at each sampled data owner (paper 002, Algorithm 1; names of its
    Table H.7). The rest of the round is the job's: T = ``training.iterations``, the owners' join
    rate τ = ``training.sampling_rate``, the global step η_g = ``training.learning_rate``, σ_LS =
    ``training.ls_sigma``, the update radius 𝓛 = ``privacy.clip``, local weight decay
    ``model.lam``."""

    local_epochs: int = Field(5, ge=1, le=1000, description="E: local epochs per round")
    local_batch: int = Field(10, ge=1, le=1_000_000, description="b: local mini-batch size")
    local_lr: float = Field(0.1, gt=0.0, le=1e3, description="η_l: local learning rate")
    local_lr_decay: float = Field(0.99, gt=0.0, le=1.0, description="γ: η_l·γ^t in round t")
    sampling: Literal["poisson", "uniform"] = Field("poisson", description=(
        "poisson: each owner joins a round w.p. τ by its own private coin; accounted add/remove at owner level, "
        "shift 𝓛. uniform: exactly τ·N owners a round (N = privacy.public_n, τN whole), drawn by a secret shuffle "
        "among the three compute parties (replicated trust); accounted replace-one at owner level, shift 2𝓛"))
    send_after_s: float | None = Field(None, gt=0.0, le=3600.0, description=(
        "each owner sends a round's shares this long after it read the previous release (or enrolled), sampled "
        "or not, so that their arrival does not tell the compute parties who ran local epochs; None: when ready"))


class TransferSpec(_Strict):
    """Knowledge transfer (DPSL-KT, thesis ch. 3) on an output-perturbation job: the teacher is the
    weighted sum of the members' certified local minimisers, never revealed; what is released is
    its scores on public feature rows, with the noise added once (sensitivity ‖X̃‖₂·Δθ); a student
    is then fitted to them in the clear by iterative hard thresholding (``student_sparsity``
    non-zeros) or least squares. The public rows are drawn from the job's public seed
    (``public = "seeded"``) or are the features of the data set's public test file, which every
    member holds (``public = "public_test"``)."""

    public: Literal["seeded", "public_test"] = Field("seeded", description=(
        "where the public rows come from: 'seeded', drawn from the seed below; 'public_test', the features of the "
        "public test file every party's [datasets.<id>] names (its digest is compared at the job's agreement)"))
    rows: int | None = Field(None, ge=1, le=1_000_000, description=(
        "m: public rows the teacher labels (required for 'seeded'; for 'public_test', the file's count if given)"))
    distribution: Literal["uniform", "gaussian"] = Field("uniform", description=(
        "the public rows' entries: i.i.d. U(−scale, scale) or N(0, scale²), each row then scaled into the unit ball"))
    scale: float | None = Field(None, gt=0.0, le=1e6, description="entries' half width (uniform) or standard "
                                                                  "deviation (gaussian); default 1/√d")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="the public rows' seed (NumPy PCG64)")
    student_sparsity: int | None = Field(None, ge=1, le=100_000_000, description=(
        "s: the student keeps s non-zeros per output (iterative hard thresholding); default: least squares"))
    student_iterations: int = Field(200, ge=1, le=100_000, description="the student's hard-thresholding steps")

    @model_validator(mode="after")
    def _source(self) -> TransferSpec:
        if self.public == "seeded" and self.rows is None:
            raise ValueError("transfer.rows: required for public = 'seeded' (how many rows to draw)")
        if self.public == "public_test":
            for name in ("distribution", "scale", "seed"):
                if getattr(self, name) != TransferSpec.model_fields[name].default:
                    raise ValueError(f"transfer.{name}: only for public = 'seeded' (the public test file's rows are "
                                     "the parties' own public file)")
        return self


# the training fields a federated job sets for itself (the rest of NETWORK_TRAINING_FIELDS stays default)
FEDERATED_TRAINING_FIELDS = ("sampling_rate",)


class JobSpec(_Strict):
    method: Method
    model: ModelSpec = ModelSpec()
    privacy: PrivacySpec
    training: TrainingSpec = TrainingSpec()
    # DP-Fed-LS with data owners: the owner is the unit of privacy, each runs local epochs
    federated: FederatedSpec | None = None
    # DPSL-KT: release the teacher's scores on public rows instead of its weights
    transfer: TransferSpec | None = None
    seed: int | None = Field(None, ge=0, description="simulation only: seeds the plaintext noise")

    def with_classes(self, n_classes: int) -> JobSpec:
        """This spec with ``model.n_classes`` set (validated again): a softmax job's class count taken
        from the schema its job file pins."""
        d = self.model_dump(mode="json", exclude_none=True)
        d["model"]["n_classes"] = int(n_classes)
        return JobSpec.model_validate(d)

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> JobSpec:
        if self.method == "output":
            if self.model.lam <= 0:
                raise ValueError("model.lam: output perturbation needs λ > 0 (strong convexity bounds the sensitivity)")
            if self.privacy.mechanism == "gaussian" and self.privacy.delta <= 0:
                raise ValueError("privacy.delta: the Gaussian mechanism needs δ > 0")
            if self.privacy.noise == "distributed" and self.privacy.mechanism != "gaussian":
                raise ValueError("privacy.noise: distributed noise is Gaussian (a sum of discrete Laplace shares is "
                                 "no Laplace); set mechanism = 'gaussian', or noise = 'mpc'")
        else:
            if self.privacy.delta <= 0:
                raise ValueError("privacy.delta: gradient perturbation (Gaussian) needs δ > 0")
        if self.model.name == "softmax" and self.model.n_classes is None and not (
                info.context or {}).get("classes_from_schema"):
            raise ValueError("model.n_classes: required for softmax (or pin the parties' schema with "
                             "job.schema_sha256: its label's classes then give it)")
        m, tr = self.model, self.training
        if tr.sparsity is not None and (self.method != "gradient" or m.is_network or self.federated is not None):
            raise ValueError("training.sparsity: hard thresholding (DP-IGHT) applies to a linear model's gradient "
                             "rounds (method = 'gradient', no network, no [federated])")
        if self.transfer is not None and (self.method != "output" or m.is_network or self.federated is not None):
            raise ValueError("transfer: knowledge transfer releases an output-perturbation teacher's scores "
                             "(method = 'output', a linear model, no [federated])")
        if self.privacy.party_rows is not None and tr.batch_size is None:
            raise ValueError("privacy.party_rows: only with training.batch_size (a batch drawn from the pooled rows)")
        if self.federated is not None:
            return self._federated()
        if m.is_network and (tr.optimizer == "srm" or any(getattr(tr, f) is not None for f in SRM_FIELDS)):
            self._srm()
        if m.is_network:
            if self.method != "gradient":
                raise ValueError("method: networks are trained by gradient perturbation (DP-SGD); use 'gradient'")
            self._network_shape()
            if self.privacy.clip is None:
                raise ValueError("privacy.clip: required for a network (its loss has no known Lipschitz constant)")
            if (m.name == "plugin") != (m.plugin is not None) or (m.plugin is None) != (m.plugin_digest is None):
                raise ValueError("model.plugin, model.plugin_digest: both required for name = 'plugin' (the id each "
                                 "party maps to its installed entry point, and the sha256 of its source), and only "
                                 "for it")
            if tr.weighting != "pooled":
                raise ValueError("training.weighting: networks use 'pooled' (one public normaliser)")
            self._batches()
            return self
        for name in NETWORK_MODEL_FIELDS:
            if getattr(m, name) != ModelSpec.model_fields[name].default:
                raise ValueError(f"model.{name}: applies to networks only, not {m.name!r}")
        for name in NETWORK_TRAINING_FIELDS:
            if getattr(tr, name) != TrainingSpec.model_fields[name].default:
                raise ValueError(f"training.{name}: applies to networks (DP-SGD) only; linear models train by "
                                 "full-batch gradient descent")
        return self

    def _srm(self) -> None:
        """DP-SRM: γ and C₂ set, and C₁ = (C − (1−γ)·C₂)/γ positive for C = ``privacy.clip``."""
        tr, clip = self.training, self.privacy.clip
        if tr.optimizer != "srm":
            raise ValueError("training.srm_momentum, training.clip_difference, training.max_step: DP-SRM's "
                             "fields (optimizer = 'srm')")
        if tr.srm_momentum is None or tr.clip_difference is None:
            raise ValueError("training.srm_momentum, training.clip_difference: both required for optimizer = 'srm' "
                             "(γ and C₂; privacy.clip bounds each example's increment γ·C₁ + (1−γ)·C₂)")
        if clip is not None and not (1.0 - tr.srm_momentum) * tr.clip_difference < clip:
            raise ValueError(f"training.clip_difference: (1 − γ)·C₂ = {(1.0 - tr.srm_momentum) * tr.clip_difference:g} "
                             f"leaves no room under privacy.clip = {clip:g} for the gradient's own clip C₁ "
                             "(privacy.clip = γ·C₁ + (1 − γ)·C₂)")
        if tr.momentum:
            raise ValueError("training.momentum: DP-SRM's momentum is training.srm_momentum")

    def _batches(self) -> None:
        """A fixed batch drawn from the pooled rows (``training.batch_size``) or Poisson batches."""
        tr, pv = self.training, self.privacy
        if tr.batch_size is None:
            return
        if tr.sampling_rate != 1.0:
            raise ValueError("training.sampling_rate, training.batch_size: one or the other (Poisson batches at a "
                             "rate, or exactly b rows a round)")
        if pv.adjacency != "replace":
            raise ValueError("privacy.adjacency: a batch of exactly b of the N pooled rows is accounted replace-one, "
                             "with the parties' row counts public: set adjacency = 'replace'")
        if pv.party_rows is None:
            raise ValueError("privacy.party_rows: required with training.batch_size (each party's public row count, "
                             "which the plan's accounting needs: a party sees which of its own rows are drawn)")
        if not tr.batch_size < sum(pv.party_rows.values()):
            raise ValueError(f"training.batch_size: fewer than the {sum(pv.party_rows.values())} pooled rows, got "
                             f"{tr.batch_size}")

    def _network_shape(self) -> None:
        """A network names what every member needs to build it the same."""
        m = self.model
        if m.input_shape is None or m.n_classes is None:
            raise ValueError("model.input_shape, model.n_classes: required for a network")
        if m.name == "char_lstm" and m.vocab is None:
            raise ValueError("model.vocab: required for char_lstm")

    def _federated(self) -> JobSpec:
        m, tr, pv = self.model, self.training, self.privacy
        if self.method != "gradient":
            raise ValueError("method: a federated job sends noisy sums of updates each round; use 'gradient'")
        if m.name not in ("softmax", *NETWORK_MODELS) or m.name == "plugin":
            raise ValueError(f"model.name: a federated job trains 'softmax' or a built-in network, not {m.name!r}")
        if m.is_network:
            self._network_shape()
        if pv.clip is None:
            raise ValueError("privacy.clip: required for a federated job (𝓛, the radius every owner's update is "
                             "projected into)")
        if pv.adjacency != "add_remove":
            raise ValueError('privacy.adjacency: a federated job protects one owner added or removed: "add_remove"')
        if tr.weighting != "pooled":
            raise ValueError("training.weighting: a federated job uses 'pooled' (the public τN)")
        if not m.is_network:
            for name in NETWORK_MODEL_FIELDS:
                if name != "init_seed" and getattr(m, name) != ModelSpec.model_fields[name].default:
                    raise ValueError(f"model.{name}: applies to networks only, not {m.name!r}")
        for name in NETWORK_TRAINING_FIELDS:
            if name not in FEDERATED_TRAINING_FIELDS and getattr(tr, name) != TrainingSpec.model_fields[name].default:
                raise ValueError(f"training.{name}: a federated job's local steps are set in [federated]")
        return self

    def _dump(self) -> dict[str, Any]:
        """The spec as JSON; one without ``federated`` reads as before it existed (same digest)."""
        d = self.model_dump(mode="json")
        if self.privacy.noise == "mpc":
            d["privacy"].pop("noise")  # the default: jobs from before the field keep their digests
        if self.training.sparsity is None:
            d["training"].pop("sparsity")  # jobs from before the field keep their digests
        if self.training.batch_size is None:
            d["training"].pop("batch_size")  # likewise
        if self.privacy.party_rows is None:
            d["privacy"].pop("party_rows")  # likewise
        for name in SRM_FIELDS:
            if getattr(self.training, name) is None:
                d["training"].pop(name)  # likewise
        if self.transfer is None:
            d.pop("transfer")  # jobs from before the field keep their digests
        if self.federated is None:
            d.pop("federated")
        elif self.federated.send_after_s is None:
            d["federated"].pop("send_after_s")  # federated jobs from before the field keep their digests
        return d

    def canonical_json(self) -> str:
        """Canonical form (sorted keys, no whitespace) that every party hashes and compares."""
        return json.dumps(self._dump(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()
