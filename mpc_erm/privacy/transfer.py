"""A knowledge-transfer job's release (``[transfer]``, DPSL-KT) as its privacy plan holds it: the
teacher's K scores on m public rows, and the certified ‖X̃‖₂ that multiplies the output release's
sensitivity (:mod:`.plan`, "What is public"; the rows and the norm: :mod:`mpc_erm.models.public_features`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mpc_erm.models.public_features import PublicFeatures, PublicFile
from mpc_erm.spec import JobSpec

from .errors import PlanError

__all__ = ["TransferPlan", "transfer_plan"]


@dataclass(frozen=True)
class TransferPlan:
    """A knowledge-transfer release: the teacher's K scores on each of ``rows`` public rows.
    ``public`` and ``norm`` (its certified ‖X̃‖₂) are known once the feature count is; until then
    the plan has an event (what admission reserves) but no sensitivity."""

    rows: int | None  # m: None until a public test file's rows are read
    outputs: int | None  # K: None until a softmax job's classes are read from the schema
    public: PublicFeatures | PublicFile | None = None
    norm: float | None = None

    @property
    def dim(self) -> int:
        if self.outputs is None or self.rows is None:
            raise ValueError("transfer: a knowledge-transfer release's size needs its public rows and the class count")
        return self.rows * self.outputs

    def describe(self) -> dict[str, Any]:
        pf = self.public
        seeded = isinstance(pf, PublicFeatures)
        return {"rows": self.rows, "outputs": self.outputs, "operator_norm": self.norm,
                "features": None if pf is None else pf.features,
                "distribution": pf.distribution if seeded else None if pf is None else "public_test",
                "scale": pf.scale if seeded else None, "seed": pf.seed if seeded else None,
                "sha256": pf.sha256 if isinstance(pf, PublicFile) else None,
                "public_rows": None if pf is None else pf.describe()}


def transfer_plan(spec: JobSpec, n_features: int | None, public_rows: np.ndarray | None = None) -> TransferPlan | None:
    """A knowledge-transfer job's release shape, with its public rows and their certified norm
    once the feature count (and, for a public test file, its rows) is known (None for any other
    job)."""
    tr = spec.transfer
    if tr is None:
        return None
    from mpc_erm.models import facts

    m = spec.model
    outputs = None if m.name == "softmax" and m.n_classes is None else facts.outputs(m.name, m.n_classes)
    pending = TransferPlan(rows=tr.rows, outputs=outputs)
    if n_features is None or outputs is None:  # the schema's classes or the features not known yet
        return pending
    pf: PublicFeatures | PublicFile
    if tr.public == "public_test":
        if public_rows is None:
            return pending  # only a member holding the file can bind it
        try:
            pf = PublicFile.of(public_rows)
        except ValueError as e:
            raise PlanError("transfer.public", str(e).split(": ", 1)[-1]) from e
        if pf.features != n_features:
            raise PlanError("transfer.public", f"the public test file has {pf.features} features, the rows "
                            f"{n_features}")
        if tr.rows is not None and tr.rows != pf.rows:
            raise PlanError("transfer.rows", f"{tr.rows} asked, the public test file has {pf.rows} rows")
    else:
        try:
            pf = PublicFeatures(int(tr.rows or 0), int(n_features), tr.distribution, tr.scale, tr.seed)
        except ValueError as e:
            raise PlanError("transfer.rows", str(e).split(": ", 1)[-1]) from e
    return TransferPlan(rows=pf.rows, outputs=outputs, public=pf, norm=pf.operator_norm())
