"""Neural networks a job can name: every party builds the identical ``torch.nn.Module``.

Identical means: the same parameter names, order and shapes, and the same initial values, bit for
bit, on every party whatever its device. Initialisation is seeded from the job (``init_seed``),
drawn on the CPU in float32 with a private ``torch.Generator`` (never the global RNG, which a
party's other work may have advanced), and only then moved to the party's device.
:func:`model_digest` hashes names, shapes, dtypes and initial values, so parties can compare
one digest in the job agreement instead of trusting each other's code.

Built in (``NETWORKS``):

- ``mlp``: fully connected, ReLU, hidden widths from the spec.
- ``mnist_cnn``: the small CNN of TF-Privacy's DP-SGD MNIST tutorial that DP-LSSGD uses:
  conv 16@8×8 stride 2 pad 3 → tanh → maxpool 2 stride 1 → conv 32@4×4 stride 2 → tanh →
  maxpool 2 stride 1 → fc 32 → tanh → fc 10 (26,010 parameters on 1×28×28 inputs).
- ``cifar_cnn``: the CIFAR-10 CNN of the same tutorial family (Papernot et al. 2020, tanh):
  conv 32,32 → pool → conv 64,64 → pool → conv 128,128 → pool → fc 128 → fc 10.
- ``tf_cifar_cnn``: the CIFAR-10 network of TensorFlow's tutorial (``tutorials/image/cifar10``),
  which DP-LSSGD's CIFAR-10 experiment names: the central 24×24 crop, per-image standardisation,
  conv 64@5×5 → ReLU → max-pool 3/2 → LRN → conv 64@5×5 → ReLU → LRN → max-pool 3/2 → fc 384 →
  ReLU → fc 192 → ReLU → fc 10 (1,068,298 parameters on 3×32×32 inputs). Not the tutorial's:
  its random training crops, flips and colour distortions (every input here is the central crop),
  its weight decay and truncated-normal initial weights (PyTorch's defaults here, as for every
  built-in), and TensorFlow's asymmetric "SAME" pooling pad (torch pads one pixel each side).
- ``char_lstm``: embedding → one LSTM layer → linear, for next-character prediction.

None uses batch statistics (no BatchNorm): per-example gradients must not mix examples.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..plugin_ids import PLUGIN_NAME_RE  # a party's own network (.plugins)
from . import facts

__all__ = ["NETWORKS", "NetworkSpec", "build_network", "model_digest", "parameter_count"]


@dataclass(frozen=True)
class NetworkSpec:
    """What every party needs to build the same network: its name, the input shape of one example
    (C, H, W for images, (L,) token ids for text, (d,) for tabular), the number of outputs, hidden
    widths (``mlp``) or the vocabulary (``char_lstm``), and the seed of the initial weights."""

    name: str
    input_shape: tuple[int, ...]
    n_outputs: int
    hidden: tuple[int, ...] = (128,)
    vocab: int = 0
    init_seed: int = 0

    def __post_init__(self) -> None:
        if self.name not in NETWORKS and not PLUGIN_NAME_RE.fullmatch(self.name):
            raise ValueError(f"model.network: unknown network {self.name!r} (built in: {', '.join(sorted(NETWORKS))}; "
                             "a party's own: 'plugin:<id>')")
        if not self.input_shape or any(int(s) < 1 for s in self.input_shape):
            raise ValueError(f"model.input_shape: positive sizes needed, got {self.input_shape}")
        if self.n_outputs < 1:
            raise ValueError("model.n_outputs: at least 1")
        if any(int(h) < 1 for h in self.hidden):
            raise ValueError(f"model.hidden: positive widths needed, got {self.hidden}")
        if not 0 <= self.init_seed < 2**63:
            raise ValueError("model.init_seed: in [0, 2^63)")


def _mlp(spec: NetworkSpec) -> nn.Module:
    widths = [math.prod(spec.input_shape), *spec.hidden]
    layers: list[nn.Module] = [nn.Flatten()]
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], spec.n_outputs))
    return nn.Sequential(*layers)


def _mnist_cnn(spec: NetworkSpec) -> nn.Module:
    flat = facts.mnist_cnn_flat(spec.input_shape)
    return nn.Sequential(
        nn.Conv2d(spec.input_shape[0], 16, 8, stride=2, padding=3), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Flatten(), nn.Linear(flat, 32), nn.Tanh(), nn.Linear(32, spec.n_outputs),
    )


def _cifar_cnn(spec: NetworkSpec) -> nn.Module:
    flat = facts.cifar_cnn_flat(spec.input_shape)
    layers: list[nn.Module] = []
    for a, b in ((spec.input_shape[0], 32), (32, 64), (64, 128)):
        layers += [nn.Conv2d(a, b, 3, padding=1), nn.Tanh(), nn.Conv2d(b, b, 3, padding=1), nn.Tanh(),
                   nn.MaxPool2d(2)]
    layers += [nn.Flatten(), nn.Linear(flat, 128), nn.Tanh(), nn.Linear(128, spec.n_outputs)]
    return nn.Sequential(*layers)


class CentralCropStandardised(nn.Module):
    """The TF CIFAR-10 tutorial's evaluation input: the central ``side``×``side`` crop of each image,
    then per-image standardisation (x − mean) / max(std, 1/√N) over its N values — per example and
    without parameters, so per-example gradients and the bound on each row are unchanged."""

    def __init__(self, side: int) -> None:
        super().__init__()
        self.side = side

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        top, left = (h - self.side) // 2, (w - self.side) // 2
        x = x[..., top:top + self.side, left:left + self.side]
        dims = (-3, -2, -1)
        floor = 1.0 / math.sqrt(x.shape[-3] * self.side * self.side)
        std = x.std(dim=dims, keepdim=True, unbiased=False).clamp(min=floor)
        return (x - x.mean(dim=dims, keepdim=True)) / std


def _tf_cifar_cnn(spec: NetworkSpec) -> nn.Module:
    flat = facts.tf_cifar_cnn_flat(spec.input_shape)

    def lrn() -> nn.Module:  # tf.nn.lrn(depth_radius=4, bias=1, alpha=0.001/9, beta=0.75): torch divides α by size
        return nn.LocalResponseNorm(9, alpha=0.001, beta=0.75, k=1.0)

    return nn.Sequential(
        CentralCropStandardised(facts.TF_CIFAR_CROP),
        nn.Conv2d(spec.input_shape[0], 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2, padding=1), lrn(),
        nn.Conv2d(64, 64, 5, padding=2), nn.ReLU(), lrn(), nn.MaxPool2d(3, 2, padding=1),
        nn.Flatten(), nn.Linear(flat, 384), nn.ReLU(), nn.Linear(384, 192), nn.ReLU(), nn.Linear(192, spec.n_outputs),
    )


class CharLSTM(nn.Module):
    """Token ids (L,) → logits of the next token after the sequence (the last step's state).

    The LSTM cell is written out with two ``nn.Linear`` (input and recurrent gates, PyTorch's gate
    order i, f, g, o) and unrolled over the sequence, as Opacus's DPLSTM does: ``nn.LSTM``'s fused
    kernel cannot be vmapped, so per-example gradients through it are impossible with torch.func."""

    def __init__(self, vocab: int, embed: int, hidden: int, n_outputs: int) -> None:
        super().__init__()
        self.hidden = hidden
        self.embed = nn.Embedding(vocab, embed)
        self.ih = nn.Linear(embed, 4 * hidden)
        self.hh = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(hidden, n_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = self.embed(x.long())  # (N, L, E)
        h = e.new_zeros(e.shape[0], self.hidden)
        c = e.new_zeros(e.shape[0], self.hidden)
        for t in range(e.shape[1]):
            i, f, g, o = (self.ih(e[:, t]) + self.hh(h)).chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
        return self.out(h)


def _char_lstm(spec: NetworkSpec) -> nn.Module:
    embed, hidden = facts.char_lstm_widths(spec.input_shape, spec.hidden, spec.vocab)
    return CharLSTM(spec.vocab, embed, hidden, spec.n_outputs)


NETWORKS: dict[str, Callable[[NetworkSpec], nn.Module]] = {
    "mlp": _mlp,
    "mnist_cnn": _mnist_cnn,
    "cifar_cnn": _cifar_cnn,
    "tf_cifar_cnn": _tf_cifar_cnn,
    "char_lstm": _char_lstm,
}
assert tuple(NETWORKS) == facts.NETWORK_NAMES


#: A plugin network's builder: the party's own code that builds the module for a spec (:mod:`.plugins`).
NetworkBuilder = Callable[["NetworkSpec"], nn.Module]


def build_network(spec: NetworkSpec, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32, builder: Callable[[NetworkSpec], nn.Module] | None = None
                  ) -> nn.Module:
    """The job's network with its agreed initial weights, on ``device`` (module docstring).
    ``builder``: a plugin network's ``plugin:<id>`` builder (:mod:`.plugins`), required for those.

    Each parameter and buffer, in ``named_parameters`` order, is re-drawn from one seeded CPU
    generator with PyTorch's default scheme for its layer (Kaiming-uniform weights, uniform biases
    in ±1/√fan_in; LSTM gates and embeddings as ``nn.LSTM``/``nn.Embedding`` draw them), so the
    values do not depend on the global RNG, the device, or the order modules were constructed."""
    if spec.name in NETWORKS:
        module = NETWORKS[spec.name](spec)
    elif builder is None:
        raise ValueError(f"model.plugin: {spec.name!r} is a party's own network; its builder is needed to build it")
    else:
        module = builder(spec)
        if not isinstance(module, nn.Module) or not any(True for _ in module.parameters()):
            raise ValueError(f"model.plugin: the builder of {spec.name!r} returned {type(module).__name__}, not a "
                             "torch.nn.Module with parameters")
    g = torch.Generator().manual_seed(spec.init_seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(_initial(name, p, module, g))
    return module.to(device=device, dtype=dtype)


def _initial(name: str, p: torch.Tensor, module: nn.Module, g: torch.Generator) -> torch.Tensor:
    path = name.rsplit(".", 1)[0] if "." in name else ""
    owner = module.get_submodule(path) if path else module
    parent = module.get_submodule(path.rsplit(".", 1)[0]) if "." in path else module
    shape = p.shape
    if isinstance(parent, CharLSTM) and path.rsplit(".", 1)[-1] in ("ih", "hh"):
        return _uniform(shape, 1.0 / math.sqrt(parent.hidden), g)  # nn.LSTM's U(±1/√hidden)
    if isinstance(owner, nn.Embedding):
        return torch.randn(shape, generator=g, dtype=torch.float32)
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else None
    if name.endswith("weight"):
        # kaiming_uniform_(a=√5): bound = √(6 / ((1 + a²)·fan_in)) = 1/√fan_in
        return _uniform(shape, 1.0 / math.sqrt(fan_in or 1), g)
    weight = getattr(owner, "weight", None)
    w_fan = math.prod(weight.shape[1:]) if weight is not None and weight.dim() > 1 else 1
    return _uniform(shape, 1.0 / math.sqrt(w_fan), g)


def _uniform(shape: Sequence[int], bound: float, g: torch.Generator) -> torch.Tensor:
    return (torch.rand(tuple(shape), generator=g, dtype=torch.float32) * 2.0 - 1.0) * bound


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def model_digest(module: nn.Module) -> str:
    """sha256 over every parameter's name, shape, dtype and value (CPU bytes, little endian): two
    parties with the same digest hold the same network, bit for bit."""
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        t = p.detach().to("cpu").contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}|".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()
