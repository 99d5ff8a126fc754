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
    NetworkSpec("tf_cifar_cnn", (3, 32, 32), 10, init_seed=4),
    NetworkSpec("char_lstm", (12,), 30, hidden=(32,), vocab=30, init_seed=3),
]


def test_the_mnist_cnn_is_the_tf_privacy_tutorial_network() -> None:
    net = build_network(MNIST)
    assert parameter_count(net) == 26_010  # TF-Privacy's tutorial CNN (conv 16@8x8/2, conv 32@4x4/2, fc 32, fc 10)
    assert [tuple(p.shape) for p in net.parameters()] == [
        (16, 1, 8, 8), (16,), (32, 16, 4, 4), (32,), (32, 512), (32,), (10, 32), (10,)]
    assert net(torch.zeros(5, 1, 28, 28)).shape == (5, 10)


def test_the_tf_cifar_cnn_is_the_tensorflow_tutorial_network_on_its_central_crop() -> None:
    """TensorFlow's CIFAR-10 tutorial network (the DP-LSSGD paper's CIFAR-10 model): 1,068,298
    parameters in its layers' shapes; the input is the central 24×24 crop, standardised per image
    as tf.image.per_image_standardization does (population std, floored at 1/√N)."""
    net = build_network(NetworkSpec("tf_cifar_cnn", (3, 32, 32), 10))
    assert parameter_count(net) == 1_068_298
    assert [tuple(p.shape) for p in net.parameters()] == [
        (64, 3, 5, 5), (64,), (64, 64, 5, 5), (64,), (384, 2304), (384,), (192, 384), (192,), (10, 192), (10,)]
    x = torch.rand(4, 3, 32, 32, dtype=torch.float64)
    crop = x[..., 4:28, 4:28]
    flat = crop.reshape(4, -1)
    want = (flat - flat.mean(1, keepdim=True)) / flat.std(1, unbiased=False, keepdim=True).clamp(min=1 / 1728**0.5)
    assert torch.allclose(net[0](x).reshape(4, -1), want, atol=1e-12)
    # the border never matters, a constant image gives zeros (the std floor, no 0/0)
    y = x.clone()
    y[..., :4, :] = 7.0
    assert torch.equal(net[0](x), net[0](y))
    assert torch.equal(net[0](torch.full((1, 3, 32, 32), 0.5)), torch.zeros(1, 3, 24, 24))
    assert build_network(NetworkSpec("tf_cifar_cnn", (3, 32, 32), 10))(torch.zeros(5, 3, 32, 32)).shape == (5, 10)


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
    with pytest.raises(ValueError, match="model.input_shape: tf_cifar_cnn crops the central 24×24"):
        build_network(NetworkSpec("tf_cifar_cnn", (3, 23, 32), 10))
    assert set(NETWORKS) == {"mlp", "mnist_cnn", "cifar_cnn", "tf_cifar_cnn", "char_lstm"}


COUNTED = [*SPECS, NetworkSpec("mnist_cnn", (3, 64, 48), 7), NetworkSpec("mlp", (4, 5, 6), 2, hidden=()),
           NetworkSpec("mlp", (122,), 2, hidden=(64, 64, 32)), NetworkSpec("cifar_cnn", (1, 16, 24), 4),
           NetworkSpec("tf_cifar_cnn", (1, 28, 25), 3),
           NetworkSpec("char_lstm", (40,), 5, hidden=(200,), vocab=90), NetworkSpec("char_lstm", (5,), 2, hidden=(),
                                                                                   vocab=2)]


@pytest.mark.parametrize("spec", COUNTED, ids=lambda s: f"{s.name}{s.input_shape}")
def test_the_parameter_count_from_the_spec_alone_is_the_built_networks(spec: NetworkSpec) -> None:
    """The privacy plan's dimension for a network job comes from mpc_erm.models.facts, without
    torch: it must be the count of the network every party builds."""
    from mpc_erm.models import facts

    assert facts.network_parameters(spec.name, spec.input_shape, spec.n_outputs, spec.hidden,
                                    spec.vocab) == parameter_count(build_network(spec))


def test_the_counts_refuse_what_building_refuses_naming_the_same_field() -> None:
    from mpc_erm.models import facts

    for name, shape, vocab in [("mnist_cnn", (1, 8, 8), 0), ("cifar_cnn", (3, 30, 30), 0), ("mnist_cnn", (28, 28), 0),
                               ("tf_cifar_cnn", (3, 20, 32), 0), ("tf_cifar_cnn", (32, 32), 0),
                               ("char_lstm", (12,), 1)]:
        with pytest.raises(ValueError) as built:
            build_network(NetworkSpec(name, shape, 10, vocab=vocab))
        with pytest.raises(ValueError) as counted:
            facts.network_parameters(name, shape, 10, vocab=vocab)
        assert str(counted.value) == str(built.value)


def test_planning_a_network_job_does_not_import_torch() -> None:
    """The daemon's admission and `job submit`'s check plan a network job (its dimension, clip and
    noise) in the control process: a fresh process does it without torch."""
    from tests.fresh_python import fresh_python

    out = fresh_python(
        "import sys\n"
        "from mpc_erm.spec import JobSpec\n"
        "from mpc_erm.models.job_model import parameter_dim\n"
        "spec = JobSpec.model_validate({'method': 'gradient',"
        " 'model': {'name': 'mnist_cnn', 'input_shape': [1, 28, 28], 'n_classes': 10},"
        " 'privacy': {'epsilon': 1.0, 'delta': 1e-5, 'clip': 1.0}, 'training': {'iterations': 10}})\n"
        "print(parameter_dim(spec, None), 'torch' in sys.modules)\n"
    )
    assert out == ["26010 False"], out
