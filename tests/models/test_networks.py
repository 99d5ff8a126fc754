"""Built-in networks: the same spec gives the same module, bit for bit, in any process and whatever
the global RNG did; shapes and parameter counts as published; per-example gradients work on each."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mpc_erm.models import per_example_grads
from mpc_erm.models.networks import NETWORKS, NetworkSpec, build_network, model_digest, parameter_count

MNIST = NetworkSpec("mnist_cnn", (1, 28, 28), 10, init_seed=7)
SPECS = [
    MNIST,
    NetworkSpec("mlp", (20,), 3, hidden=(16, 8), init_seed=1),
    NetworkSpec("cifar_cnn", (3, 32, 32), 10, init_seed=2),
    NetworkSpec("char_lstm", (12,), 30, hidden=(32,), vocab=30, init_seed=3),
]


def test_the_mnist_cnn_is_the_tf_privacy_tutorial_network() -> None:
    net = build_network(MNIST)
    assert parameter_count(net) == 26_010  # TF-Privacy's tutorial CNN (conv 16@8x8/2, conv 32@4x4/2, fc 32, fc 10)
    assert [tuple(p.shape) for p in net.parameters()] == [
        (16, 1, 8, 8), (16,), (32, 16, 4, 4), (32,), (32, 512), (32,), (10, 32), (10,)]
    assert net(torch.zeros(5, 1, 28, 28)).shape == (5, 10)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_same_spec_same_weights_whatever_the_global_rng(spec: NetworkSpec) -> None:
    torch.manual_seed(0)
    a = build_network(spec)
    torch.manual_seed(12345)
    torch.rand(1000)
    b = build_network(spec)
    assert model_digest(a) == model_digest(b)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    other = build_network(NetworkSpec(**{**spec.__dict__, "init_seed": spec.init_seed + 1}))
    assert model_digest(other) != model_digest(a)


def test_another_process_builds_the_same_network() -> None:
    code = ("from mpc_erm.models.networks import NetworkSpec, build_network, model_digest;"
            "print(model_digest(build_network(NetworkSpec('mnist_cnn', (1, 28, 28), 10, init_seed=7))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == model_digest(build_network(MNIST))


def test_initial_weights_have_pytorchs_default_scale() -> None:
    net = build_network(MNIST)
    w = net[7].weight  # fc 512 -> 32: kaiming-uniform bound 1/sqrt(512)
    bound = 1 / 512**0.5
    assert w.abs().max().item() <= bound and w.abs().max().item() > 0.95 * bound
    assert abs(w.mean().item()) < 0.1 * bound


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_per_example_gradients_on_every_network(spec: NetworkSpec) -> None:
    net = build_network(spec, dtype=torch.float64)
    n = 3
    if spec.name == "char_lstm":
        x = torch.randint(0, spec.vocab, (n, *spec.input_shape))
    else:
        x = torch.randn(n, *spec.input_shape, dtype=torch.float64)
    y = torch.randint(0, spec.n_outputs, (n,))
    loss = torch.nn.functional.cross_entropy
    grads = per_example_grads(net, loss, x, y)
    assert list(grads) == [k for k, _ in net.named_parameters()]
    # each example's gradient is the gradient of its own loss
    net.zero_grad()
    loss(net(x[1:2]), y[1:2]).backward()
    for k, p in net.named_parameters():
        assert torch.allclose(grads[k][1], p.grad, atol=1e-10), k


def test_bad_specs_name_the_field() -> None:
    with pytest.raises(ValueError, match="model.network: unknown network 'resnet'"):
        NetworkSpec("resnet", (3, 32, 32), 10)
    with pytest.raises(ValueError, match="model.input_shape"):
        build_network(NetworkSpec("mnist_cnn", (1, 8, 8), 10))
    with pytest.raises(ValueError, match="model.input_shape"):
        build_network(NetworkSpec("cifar_cnn", (3, 30, 30), 10))
    assert set(NETWORKS) == {"mlp", "mnist_cnn", "cifar_cnn", "char_lstm"}
