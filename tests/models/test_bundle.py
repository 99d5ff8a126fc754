"""Model bundles: what a job writes, ``mpc_erm.load_model`` reads back and predicts with, and a
damaged or mismatched bundle is refused naming the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import mpc_erm
from mpc_erm.models.bundle import BundleError, save_network_bundle
from mpc_erm.models.networks import NetworkSpec, build_network

MLP = NetworkSpec("mlp", (5,), 3, hidden=(7,), init_seed=2)


def _trained(spec: NetworkSpec) -> torch.Tensor:
    """A parameter vector that is not the initial one (as a job would release)."""
    net = build_network(spec)
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).double()
    return flat + 0.1 * torch.randn(flat.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def test_a_bundle_loads_and_predicts_like_the_released_model(tmp_path: Path) -> None:
    theta = _trained(MLP)
    save_network_bundle(tmp_path, MLP, theta, classes=["low", "mid", "high"], feature_names=list("abcde"),
                        privacy={"mechanism": "gaussian", "epsilon": 1.0, "delta": 1e-5})
    model = mpc_erm.load_model(tmp_path)
    X = np.random.default_rng(0).normal(size=(50, 5)).astype(np.float32)
    ref = build_network(MLP)
    torch.nn.utils.vector_to_parameters(theta.float(), ref.parameters())
    want = torch.softmax(ref(torch.from_numpy(X)), dim=-1).detach().numpy()
    assert np.allclose(model.predict_proba(X), want, atol=1e-6)
    assert np.allclose(model.predict_proba(X).sum(axis=1), 1.0)
    assert list(model.predict(X)) == [["low", "mid", "high"][i] for i in want.argmax(axis=1)]
    meta = json.loads((tmp_path / "model.json").read_text())
    assert meta["privacy"]["epsilon"] == 1.0 and meta["feature_names"] == list("abcde")


def test_image_rows_may_come_flat(tmp_path: Path) -> None:
    spec = NetworkSpec("mnist_cnn", (1, 28, 28), 10, init_seed=0)
    save_network_bundle(tmp_path, spec, _trained(spec))
    model = mpc_erm.load_model(tmp_path)
    X = np.random.default_rng(1).random((4, 784), dtype=np.float32)
    assert np.array_equal(model.predict(X), model.predict(X.reshape(4, 1, 28, 28)))
    with pytest.raises(BundleError, match=r"X: rows of shape \(3,\)"):
        model.predict(np.zeros((2, 3)))


def test_damaged_or_mismatched_bundles_are_refused_naming_the_field(tmp_path: Path) -> None:
    save_network_bundle(tmp_path, MLP, _trained(MLP))
    weights, meta_path = tmp_path / "model.safetensors", tmp_path / "model.json"
    meta = json.loads(meta_path.read_text())

    raw = bytearray(weights.read_bytes())
    raw[-1] ^= 0xFF
    weights.write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="weights_sha256 does not match"):
        mpc_erm.load_model(tmp_path)

    other = tmp_path / "other"
    save_network_bundle(other, NetworkSpec("mlp", (5,), 3, hidden=(9,)), _trained(NetworkSpec("mlp", (5,), 3,
                                                                                                hidden=(9,))))
    weights.write_bytes((other / "model.safetensors").read_bytes())
    meta["weights_sha256"] = json.loads((other / "model.json").read_text())["weights_sha256"]
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(BundleError, match=r"1\.weight: .*\[9, 5\], expected .*\[7, 5\]"):
        mpc_erm.load_model(tmp_path)

    for bad, fragment in (({**meta, "format": "pickle"}, "format: expected"),
                          ({**meta, "architecture": {**meta["architecture"], "network": "resnet"}}, "architecture:"),
                          ({**meta, "kind": "tree"}, "kind:"),
                          ({**meta, "kind": "linear"}, "architecture.loss:")):
        meta_path.write_text(json.dumps(bad))
        with pytest.raises(BundleError, match=fragment):
            mpc_erm.load_model(tmp_path)
    meta_path.write_text("{not json")
    with pytest.raises(BundleError, match="model.json: not readable as JSON"):
        mpc_erm.load_model(tmp_path)
    with pytest.raises(BundleError, match="no such file"):
        mpc_erm.load_model(tmp_path / "missing")


def test_a_linear_bundle_predicts_raw_rows_through_its_schema(tmp_path) -> None:
    import numpy as np
    import pandas as pd
    import torch

    from mpc_erm.data.schema import schema_from_mapping
    from mpc_erm.models.bundle import save_linear_weights

    schema = schema_from_mapping({
        "intercept": True, "missing": "drop",
        "label": {"column": "y", "task": "binary", "positive": "sick", "negative": "well"},
        "columns": [{"name": "age", "type": "numeric", "low": 0, "high": 100},
                    {"name": "site", "type": "categorical", "categories": ["a", "b"]}]})
    theta = torch.tensor([2.0, -1.0, 1.0, -0.5], dtype=torch.float64)
    for d in (tmp_path / "one", tmp_path / "two"):
        save_linear_weights(d, theta, job_id="j", job_digest="0" * 64, loss="logistic",
                            feature_names=list(schema.feature_names), schema=schema.to_dict(),
                            privacy={"epsilon": 1.0})
    # the same model is the same bytes (what the coordinator compares across parties)
    one, two = (tmp_path / d / "model.safetensors" for d in ("one", "two"))
    assert one.read_bytes() == two.read_bytes()
    m = mpc_erm.load_model(tmp_path / "one")
    frame = pd.DataFrame({"site": ["a", "b", "", "a"], "age": ["90", "10", "50", "0"], "note": ["x"] * 4})
    X = schema.features(frame.iloc[[0, 1, 3]].reset_index(drop=True))
    z = X @ theta.numpy()
    want = np.where(z > 0, "sick", "well")
    got = m.predict(frame)
    assert list(got[[0, 1, 3]]) == list(want) and got[2] is None  # row 2 has an empty cell: dropped
    proba = m.predict_proba(frame)
    np.testing.assert_allclose(proba[[0, 1, 3], 1], 1 / (1 + np.exp(-z)))
    assert np.isnan(proba[2]).all()
    assert m.meta["classes"] == ["well", "sick"] and m.meta["privacy"] == {"epsilon": 1.0}
    np.testing.assert_array_equal(m.predict(X), want)  # a feature matrix is taken as is


def test_a_ridge_bundle_predicts_in_the_labels_units(tmp_path) -> None:
    import numpy as np
    import pandas as pd
    import torch

    from mpc_erm.data.schema import schema_from_mapping
    from mpc_erm.models.bundle import save_linear_weights

    schema = schema_from_mapping({"row_norm": 1.0, "label": {"column": "price", "task": "regression", "low": 100,
                                                             "high": 500},
                                  "columns": [{"name": "x", "type": "numeric", "low": 0, "high": 1}]})
    save_linear_weights(tmp_path, torch.tensor([0.5], dtype=torch.float64), job_id="j", job_digest="0" * 64,
                        loss="ridge", schema=schema.to_dict())
    m = mpc_erm.load_model(tmp_path)
    np.testing.assert_allclose(m.predict(pd.DataFrame({"x": ["1", "0"]})), [400.0, 300.0])  # 0.5 → 400; 0 → 300
    with pytest.raises(BundleError, match="no probabilities"):
        m.predict_proba(pd.DataFrame({"x": ["1"]}))
