"""A party's own network (model plugin, issue 16): pinned by its source's sha256, built only from
an entry point the party (or the user loading a model) names, never from code a job sends."""

from __future__ import annotations

import hashlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mpc_erm.models import build_network
from mpc_erm.models.bundle import BundleError, load_model, save_network_bundle
from mpc_erm.models.networks import NetworkSpec
from mpc_erm.models.plugins import PluginError, load_builder, source_digest

SOURCE = textwrap.dedent("""
    import torch


    def build(spec):
        d = 1
        for s in spec.input_shape:
            d *= s
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(d, 6), torch.nn.Tanh(),
                                   torch.nn.Linear(6, spec.n_outputs))


    def not_a_network(spec):
        return 42
""")


@pytest.fixture()
def plugin(tmp_path: Path) -> Iterator[Path]:
    """A module ``tiny_plugin_<n>`` on sys.path (a fresh name per test: imports are cached)."""
    name = f"tiny_plugin_{abs(hash(tmp_path)) % 10**8}"
    src = tmp_path / "src"
    src.mkdir()
    (src / f"{name}.py").write_text(SOURCE)
    sys.path.insert(0, str(src))
    try:
        yield src / f"{name}.py"
    finally:
        sys.path.remove(str(src))
        sys.modules.pop(name, None)


def _entry(path: Path, fn: str = "build") -> str:
    return f"{path.stem}:{fn}"


def test_the_digest_is_the_sha256_of_the_source_read_not_imported(plugin: Path) -> None:
    assert source_digest(_entry(plugin)) == "sha256:" + hashlib.sha256(plugin.read_bytes()).hexdigest()
    assert plugin.stem not in sys.modules  # reading the digest ran none of it


def test_a_builder_loads_only_for_the_pinned_source(plugin: Path) -> None:
    digest = source_digest(_entry(plugin))
    spec = NetworkSpec(f"plugin:{plugin.stem.replace('_', '-')}", (2, 3), 3, init_seed=5)
    net = build_network(spec, builder=load_builder(_entry(plugin), digest))
    again = build_network(spec, builder=load_builder(_entry(plugin), digest))
    assert sum(p.numel() for p in net.parameters()) == 6 * 6 + 6 + 6 * 3 + 3
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), again.parameters()))  # the job's seed
    with pytest.raises(PluginError, match="the job pins sha256:0000"):
        load_builder(_entry(plugin), "sha256:" + "0" * 64)
    with pytest.raises(PluginError, match="not 'sha256:'"):
        load_builder(_entry(plugin), "md5:abc")
    with pytest.raises(PluginError, match="not 'package.module:function'"):
        source_digest("os.system('x')")
    with pytest.raises(PluginError, match="cannot be found|not an installed"):
        source_digest("no_such_module_here:build")
    with pytest.raises(ValueError, match="not a torch.nn.Module"):
        build_network(spec, builder=load_builder(_entry(plugin, "not_a_network"), digest))
    with pytest.raises(ValueError, match="its builder is needed"):
        build_network(spec)


def test_a_plugin_models_bundle_loads_only_with_its_entry_point_and_source(plugin: Path, tmp_path: Path) -> None:
    digest = source_digest(_entry(plugin))
    spec = NetworkSpec("plugin:tiny", (4,), 2, init_seed=1)
    builder = load_builder(_entry(plugin), digest)
    theta = torch.nn.utils.parameters_to_vector(build_network(spec, builder=builder).parameters()).double()
    d = save_network_bundle(tmp_path / "m", spec, theta, builder=builder, plugin_digest=digest)
    with pytest.raises(BundleError, match=r"plugins=\{'tiny'"):
        load_model(d)
    m = load_model(d, plugins={"tiny": _entry(plugin)})
    assert m.predict([[0.1, 0.2, 0.3, 0.4]]).shape == (1,)
    plugin.write_text(SOURCE + "\n# edited\n")
    with pytest.raises(BundleError, match="plugin_digest|the job pins"):
        load_model(d, plugins={"tiny": _entry(plugin)})


def test_the_job_spec_and_the_daemon_admission_pin_the_plugin(plugin: Path) -> None:
    from mpc_erm.spec import JobSpec
    from parties.admission import _check_plugin

    digest = source_digest(_entry(plugin))
    base = {"method": "gradient", "privacy": {"epsilon": 1.0, "delta": 1e-5, "clip": 1.0}}
    with pytest.raises(ValueError, match="model.plugin, model.plugin_digest: both required"):
        JobSpec.model_validate({**base, "model": {"name": "plugin", "input_shape": [4], "n_classes": 2}})
    with pytest.raises(ValueError, match="model.plugin, model.plugin_digest"):
        JobSpec.model_validate({**base, "model": {"name": "mlp", "input_shape": [4], "n_classes": 2, "plugin": "x",
                                                   "plugin_digest": digest}})
    spec = JobSpec.model_validate({**base, "model": {"name": "plugin", "plugin": "tiny", "plugin_digest": digest,
                                                      "input_shape": [4], "n_classes": 2}})
    assert spec.model.is_network
    cfg = SimpleNamespace(identity=SimpleNamespace(name="alice"),
                          models={"tiny": SimpleNamespace(entry_point=_entry(plugin))})
    assert _check_plugin(cfg, "tiny", digest) is None  # type: ignore[arg-type]
    assert "has no model plugin 'other'" in str(_check_plugin(cfg, "other", digest))  # type: ignore[arg-type]
    assert "model.plugin_digest: alice's plugin 'tiny' has source digest" in str(
        _check_plugin(cfg, "tiny", "sha256:" + "1" * 64))  # type: ignore[arg-type]
