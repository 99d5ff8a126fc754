"""mpc_erm: secure multi-party differentially private model training (see README.md)."""

from __future__ import annotations

from typing import Any

__all__ = ["load_model"]


def load_model(directory: Any, plugins: dict[str, str] | None = None) -> Any:
    """A trained model's directory (``model.json`` + ``model.safetensors``) as an object with
    ``predict`` and ``predict_proba`` (:mod:`mpc_erm.models.bundle`); ``plugins`` names the entry
    point of a party's own network ({id: "package.module:function"}). Imported lazily: ``import
    mpc_erm`` stays cheap."""
    from .models.bundle import load_model as _load

    return _load(directory, plugins=plugins)
