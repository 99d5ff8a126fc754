"""The job spec refuses nonsense before anything runs, naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mpc_erm.protocols import JobSpec


def _spec(**over):
    base = {"method": "gradient", "privacy": {"epsilon": 1.0, "delta": 1e-5}}
    for k, v in over.items():
        base[k] = v
    return JobSpec(**base)


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"privacy": {"epsilon": 0.0, "delta": 1e-5}}, "privacy.epsilon"),
        ({"privacy": {"epsilon": -1.0, "delta": 1e-5}}, "privacy.epsilon"),
        ({"privacy": {"epsilon": float("nan"), "delta": 1e-5}}, "privacy.epsilon"),
        ({"privacy": {"epsilon": 1.0, "delta": 1.0}}, "privacy.delta"),
        ({"privacy": {"epsilon": 1.0, "delta": 0.0}}, "privacy.delta"),
        ({"method": "output", "model": {"lam": 0.0}, "privacy": {"epsilon": 1.0}}, "model.lam"),
        ({"model": {"name": "softmax"}}, "model.n_classes"),
        ({"model": {"name": "svm"}}, "model.name"),
        ({"training": {"iterations": 0}}, "training.iterations"),
        ({"training": {"weighting": "median"}}, "training.weighting"),
        ({"privacy": {"epsilon": 1.0, "delta": 1e-5, "accountant": "moments"}}, "privacy.accountant"),
        ({"privacy": {"epsilon": 1.0, "delta": 1e-5, "colour": "red"}}, "privacy.colour"),
        ({"method": "output", "privacy": {"epsilon": 1.0, "mechanism": "gaussian"}}, "privacy.delta"),
    ],
)
def test_bad_specs_name_the_field(over: dict, field: str) -> None:
    with pytest.raises(ValidationError) as err:
        _spec(**over)
    text = str(err.value).replace("\n", " ")
    head = field.split(".")[0]
    assert head in text and (field.split(".")[-1] in text), text


def test_digest_is_canonical_and_sensitive() -> None:
    a = _spec()
    b = JobSpec.model_validate_json(a.model_dump_json())
    assert a.digest() == b.digest()
    assert a.digest() != _spec(privacy={"epsilon": 1.0000001, "delta": 1e-5}).digest()
