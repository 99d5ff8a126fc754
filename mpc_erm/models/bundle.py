"""A trained model as a self-describing directory: ``model.safetensors`` + ``model.json``.

Why: a user must be able to load what a job released and predict without reading our source.
``model.json`` names the architecture (a built-in network with its spec, or a linear loss), the
classes, the feature names, and what the job's privacy report says (mechanism, ε, δ, accountant),
with the sha256 of the weights file so a bundle cannot silently pair with other weights.
``model.safetensors`` holds the parameters under their ``named_parameters`` names (networks) or
``theta`` (linear). Loading checks every name, shape and dtype against the architecture and
refuses a mismatch naming the field — safetensors never executes anything, and neither does
loading: the architecture is rebuilt from our own code by name.

    model = mpc_erm.load_model("results/job-1/")
    model.predict(X)          # class labels (or values, for a regression)
    model.predict_proba(X)    # class probabilities (classifiers)
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..data.sets import file_sha256
from .networks import NETWORKS, NetworkBuilder, NetworkSpec, build_network

__all__ = ["BUNDLE_FORMAT", "BundleError", "LinearModel", "LoadedModel", "load_model", "save_linear_weights",
           "save_network_bundle"]

BUNDLE_FORMAT = "mpc-erm-model/1"
WEIGHTS, META = "model.safetensors", "model.json"


class BundleError(ValueError):
    """A model directory that cannot be loaded; the message names the file and the field."""


def save_network_bundle(directory: str | os.PathLike[str], spec: NetworkSpec, parameters: Tensor, *,
                        classes: list[Any] | None = None, feature_names: list[str] | None = None,
                        privacy: dict[str, Any] | None = None, job: dict[str, Any] | None = None,
                        builder: NetworkBuilder | None = None, plugin_digest: str | None = None,
                        schema: dict[str, Any] | None = None) -> Path:
    """Write a network's bundle: ``parameters`` is the public model as one vector in
    ``named_parameters`` order (what the DP-SGD round loop keeps); ``classes`` the label of each
    output (default 0..K−1); ``privacy`` the job's privacy statement (mechanism, ε, δ, ...); a
    plugin network (``plugin:<id>``) also its ``builder`` and the ``plugin_digest`` its source had."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    module = build_network(spec, builder=builder)
    names = [(k, p.shape) for k, p in module.named_parameters()]
    total = sum(math.prod(s) for _, s in names)
    flat = parameters.detach().to("cpu", torch.float32).reshape(-1)
    if flat.numel() != total:
        raise BundleError(f"parameters: {flat.numel()} values for a {spec.name} of {total} parameters")
    tensors, off = {}, 0
    for k, s in names:
        n = math.prod(s)
        tensors[k] = flat[off : off + n].reshape(s).contiguous()
        off += n
    save_file(tensors, str(d / WEIGHTS))
    meta = {
        "format": BUNDLE_FORMAT,
        "kind": "network",
        "architecture": {"network": spec.name, "input_shape": list(spec.input_shape), "n_outputs": spec.n_outputs,
                         "hidden": list(spec.hidden), "vocab": spec.vocab,
                         **({"plugin_digest": plugin_digest} if plugin_digest else {})},
        "task": "multiclass" if spec.n_outputs > 2 else "binary",
        "classes": list(classes) if classes is not None else list(range(spec.n_outputs)),
        "feature_names": list(feature_names) if feature_names is not None else None,
        "schema": schema,
        "input": ("raw rows (a CSV's columns, by name) mapped by `schema`" if schema else
                  "float32 array of shape (n, *input_shape); for images, pixels scaled to [0, 1]"),
        "privacy": privacy,
        "job": job,
        "weights_sha256": file_sha256(d / WEIGHTS),
    }
    (d / META).write_text(json.dumps(meta, indent=2, default=float) + "\n")
    return d


LINEAR_LOSSES = ("logistic", "huber_svm", "ridge", "softmax")


def save_linear_weights(directory: str | os.PathLike[str], theta: Tensor, *, job_id: str, job_digest: str,
                        loss: str, n_classes: int | None = None, feature_names: list[str] | None = None,
                        schema: dict[str, Any] | None = None, privacy: dict[str, Any] | None = None,
                        job: dict[str, Any] | None = None) -> Path:
    """A linear model's bundle: ``theta`` in ``model.safetensors`` and ``model.json`` naming the
    job, the loss, the classes, the feature
    names and — when the data set had one — the data schema, so ``predict`` takes raw rows."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / WEIGHTS
    theta = theta.detach().to("cpu").contiguous()
    save_file({"theta": theta}, str(path))  # no metadata: the same model is the same bytes at every party
    k = int(n_classes or 2) if loss == "softmax" else 1
    label = (schema or {}).get("label") or {}
    if loss == "ridge":
        task, classes = "regression", None
    elif loss == "softmax":
        task, classes = "multiclass", list(label.get("classes") or range(k))
    else:
        task = "binary"
        classes = ([label.get("negative") or f"not {label['positive']}", label["positive"]] if label.get("positive")
                   else [-1, 1])
    meta = {
        "format": BUNDLE_FORMAT,
        "kind": "linear",
        "architecture": {"loss": loss, "n_features": int(theta.numel()) // k, "n_outputs": k,
                         "layout": "theta.reshape(n_outputs, n_features); score = features @ W.T"},
        "task": task,
        "classes": classes,
        "feature_names": list(feature_names) if feature_names else None,
        "schema": schema,
        "input": ("raw rows (a CSV's columns, by name) mapped by `schema`" if schema else
                  "float64 array (n, n_features), each row scaled as the training rows were (norm <= 1)"),
        "privacy": privacy,
        "job": {"job_id": job_id, "job_digest": job_digest, **(job or {})},
        "weights_sha256": file_sha256(path),
    }
    (d / META).write_text(json.dumps(meta, indent=2, default=float) + "\n")
    return path


def _schema_of(meta: dict[str, Any]) -> Any:
    """The bundle's data schema (``model.json``'s ``schema``), parsed, or None."""
    from ..data.schema import schema_from_mapping

    s = meta.get("schema")
    return None if s is None else schema_from_mapping(s, "model.json: schema")


def _schema_rows(schema: Any, frame: Any) -> tuple[np.ndarray, np.ndarray]:
    """Raw rows through the bundle's schema: (features, positions of the rows it kept)."""
    if schema is None:
        raise BundleError("X: this model has no schema; pass the model's input array")
    sub, kept = schema.prepare(frame.astype(str), "X", with_label=False)
    return schema.features(sub, "X"), kept


@dataclass
class LinearModel:
    """A loaded linear bundle: scores ``X @ W.T`` with ``W = theta.reshape(n_outputs, d)``.

    ``predict``/``predict_proba`` take a feature matrix, or — when the bundle has a schema — a
    pandas DataFrame of raw rows, which the schema maps exactly as the training rows were."""

    theta: np.ndarray
    meta: dict[str, Any]

    @property
    def classes(self) -> list[Any]:
        return list(self.meta.get("classes") or [])

    @cached_property
    def schema(self) -> Any:
        return _schema_of(self.meta)

    def features(self, X: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """The model's input rows and, for a DataFrame, the positions of the rows the schema kept
        (under ``missing = "drop"`` a row with an empty listed cell gets no prediction)."""
        import pandas as pd

        if isinstance(X, pd.DataFrame):
            return _schema_rows(self.schema, X)
        x = np.asarray(X, dtype=np.float64)
        d = int(self.meta["architecture"]["n_features"])
        if x.ndim != 2 or x.shape[1] != d:
            raise BundleError(f"X: rows of shape {tuple(x.shape[1:])}, the model takes {d} features")
        return x, None

    def _scores(self, X: Any) -> tuple[np.ndarray, np.ndarray | None, int]:
        arch = self.meta["architecture"]
        W = self.theta.reshape(int(arch["n_outputs"]), int(arch["n_features"]))
        x, kept = self.features(X)
        return x @ W.T, kept, len(X)

    @staticmethod
    def _spread(values: np.ndarray, kept: np.ndarray | None, n: int, fill: Any) -> np.ndarray:
        """Values of the kept rows back at their positions; ``fill`` where a row was dropped."""
        if kept is None or len(kept) == n:
            return values
        out = np.full((n, *values.shape[1:]), fill, dtype=object if fill is None else values.dtype)
        out[kept] = values
        return out

    def predict_proba(self, X: Any) -> np.ndarray:
        """(n, K) class probabilities: logistic and softmax only (a Huber SVM has none); NaN for a
        row the schema dropped."""
        z, kept, n = self._scores(X)
        loss = self.meta["architecture"]["loss"]
        if loss == "logistic":
            p = 1.0 / (1.0 + np.exp(-z[:, 0]))
            proba = np.stack([1.0 - p, p], axis=1)
        elif loss == "softmax":
            e = np.exp(z - z.max(axis=1, keepdims=True))
            proba = e / e.sum(axis=1, keepdims=True)
        else:
            raise BundleError(f"predict_proba: a {loss} model gives no probabilities (use predict)")
        return self._spread(proba, kept, n, np.nan)

    def predict(self, X: Any) -> np.ndarray:
        """Class labels (in the user's words when the bundle has a schema), or a regression's value
        in the label's units (the schema's public bounds undo the scaling onto [-1, 1]); None (NaN
        for a regression) for a row the schema dropped for a missing value."""
        z, kept, n = self._scores(X)
        loss = self.meta["architecture"]["loss"]
        if loss == "ridge":
            schema = self.schema
            return self._spread((schema.decode(z[:, 0]) if schema is not None else z[:, 0]).astype(float),
                                kept, n, np.nan)
        if loss == "softmax":
            labels = np.asarray(self.classes, dtype=object)[z.argmax(axis=1)]
        else:
            labels = np.asarray(self.classes, dtype=object)[(z[:, 0] > 0).astype(np.int64)]
        return self._spread(labels, kept, n, None)


def _load_linear(meta: dict[str, Any], meta_path: Path, weights_path: Path) -> LinearModel:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    arch = meta.get("architecture") or {}
    if arch.get("loss") not in LINEAR_LOSSES:
        raise BundleError(f"{meta_path}: architecture.loss: {arch.get('loss')!r} is not one of {list(LINEAR_LOSSES)}")
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError) as exc:
        raise BundleError(f"{weights_path}: not a safetensors file ({exc})") from None
    if set(tensors) != {"theta"}:
        raise BundleError(f"{weights_path}: holds {sorted(tensors)}, a linear model holds only 'theta'")
    theta = tensors["theta"].to(torch.float64).numpy().reshape(-1)
    try:
        k, d = int(arch["n_outputs"]), int(arch["n_features"])
    except (KeyError, TypeError, ValueError):
        raise BundleError(f"{meta_path}: architecture: needs n_outputs and n_features") from None
    if theta.size != k * d:
        raise BundleError(f"{weights_path}: theta has {theta.size} values, the architecture says {k} x {d}")
    model = LinearModel(theta=theta, meta=meta)
    if meta.get("schema") is not None:
        try:
            schema = model.schema
        except ValueError as exc:
            raise BundleError(str(exc)) from None
        if schema.n_features != d:
            raise BundleError(f"{meta_path}: schema: gives {schema.n_features} features, the model takes {d}")
    return model


@dataclass
class LoadedModel:
    """A loaded bundle: ``module`` (the network, eval mode), ``meta`` (model.json)."""

    module: nn.Module
    meta: dict[str, Any]

    @property
    def classes(self) -> list[Any]:
        return list(self.meta["classes"])

    def _inputs(self, X: Any) -> Tensor:
        import pandas as pd

        if isinstance(X, pd.DataFrame):  # raw rows: the bundle's schema maps them as in training
            n = len(X)
            X, kept = _schema_rows(_schema_of(self.meta), X)
            if len(kept) != n:
                raise BundleError("X: some rows have empty cells the schema drops (missing = \"drop\"); "
                                  "fill or remove them first")
        x = torch.tensor(np.asarray(X, dtype=np.float32))  # a copy: the caller's array may be read-only
        shape = tuple(self.meta["architecture"]["input_shape"])
        if x.shape[1:] != shape:
            if x.ndim >= 2 and math.prod(x.shape[1:]) == math.prod(shape):  # flat rows, or (H, W) without C
                return x.reshape(x.shape[0], *shape)
            raise BundleError(f"X: rows of shape {tuple(x.shape[1:])}, the model takes {shape}")
        return x

    @torch.no_grad()
    def predict_proba(self, X: Any) -> np.ndarray:
        """(n, K) class probabilities."""
        return torch.softmax(self.module(self._inputs(X)), dim=-1).numpy()

    def predict(self, X: Any) -> np.ndarray:
        """The most probable class label of each row (the labels of ``classes``)."""
        return np.asarray(self.classes)[self.predict_proba(X).argmax(axis=1)]


def load_model(directory: str | os.PathLike[str], plugins: dict[str, str] | None = None
               ) -> LoadedModel | LinearModel:
    """Load a bundle written by :func:`save_network_bundle` (module docstring). A party's own
    network (``plugin:<id>``) is rebuilt only from an entry point the caller names in ``plugins``
    ({id: "package.module:function"}) whose source has the digest the bundle records."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    d = Path(directory)
    meta_path, weights_path = d / META, d / WEIGHTS
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise BundleError(f"{meta_path}: no such file (a model directory holds {META} and {WEIGHTS})") from None
    except (OSError, ValueError) as exc:
        raise BundleError(f"{meta_path}: not readable as JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"{meta_path}: format: expected {BUNDLE_FORMAT!r}, got {meta.get('format')!r}"
                          if isinstance(meta, dict) else f"{meta_path}: not a JSON object")
    if meta.get("kind") not in ("network", "linear"):
        raise BundleError(f"{meta_path}: kind: {meta.get('kind')!r} is neither 'network' nor 'linear'")
    if not weights_path.is_file():
        raise BundleError(f"{weights_path}: no such file")
    if file_sha256(weights_path) != meta.get("weights_sha256"):
        raise BundleError(f"{meta_path}: weights_sha256 does not match {WEIGHTS} (another model's weights?)")
    if meta["kind"] == "linear":
        return _load_linear(meta, meta_path, weights_path)
    arch = meta.get("architecture") or {}
    try:
        spec = NetworkSpec(str(arch["network"]), tuple(int(s) for s in arch["input_shape"]),
                           int(arch["n_outputs"]), hidden=tuple(int(h) for h in arch.get("hidden", (128,))),
                           vocab=int(arch.get("vocab") or 0))
        builder = None
        if spec.name not in NETWORKS:  # a plugin: never imported unless the caller names it
            from .plugins import load_builder

            pid = spec.name.split(":", 1)[1]
            if pid not in (plugins or {}):
                raise ValueError(f"{spec.name!r} is a party's own network: name its entry point, "
                                 f"load_model(dir, plugins={{{pid!r}: 'package.module:function'}})")
            builder = load_builder((plugins or {})[pid], str(arch.get("plugin_digest")))
        module = build_network(spec, builder=builder)
    except (KeyError, TypeError, ValueError) as exc:
        known = ", ".join(sorted(NETWORKS))
        raise BundleError(f"{meta_path}: architecture: {exc} (built-in networks: {known})") from None
    try:
        tensors = load_file(str(weights_path))
    except (SafetensorError, OSError) as exc:
        raise BundleError(f"{weights_path}: not a safetensors file ({exc})") from None
    want = dict(module.named_parameters())
    if set(tensors) != set(want):
        raise BundleError(f"{weights_path}: parameters {sorted(tensors)} do not match {spec.name}'s {sorted(want)}")
    with torch.no_grad():
        for k, p in want.items():
            t = tensors[k]
            if t.shape != p.shape or t.dtype != p.dtype:
                raise BundleError(f"{weights_path}: {k}: {t.dtype}{list(t.shape)}, expected {p.dtype}{list(p.shape)}")
            p.copy_(t)
    if len(meta.get("classes") or ()) != spec.n_outputs:
        raise BundleError(f"{meta_path}: classes: {len(meta.get('classes') or ())} labels for {spec.n_outputs} outputs")
    module.eval()
    return LoadedModel(module=module, meta=meta)
