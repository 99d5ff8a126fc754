"""The public facts of each model, without torch: a linear loss's Lipschitz and smoothness
constants and its parameter count, and a built-in network's layer shapes and parameter count. The
loss classes (:mod:`.losses`, where each constant's derivation is written) and the network
builders (:mod:`.networks`) read them from here, and so do the privacy plan, ``job submit``'s
check and the daemon's admission, which must not pay torch's import (seconds) to plan a job.
"""

from __future__ import annotations

import math
import numbers

__all__ = ["LOSS_NAMES", "NETWORK_NAMES", "TF_CIFAR_CROP", "char_lstm_widths", "cifar_cnn_flat", "conv_out",
           "lipschitz", "mnist_cnn_flat", "network_parameters", "outputs", "param_dim", "ridge_lipschitz_for",
           "smoothness", "tf_cifar_cnn_flat"]

#: Every linear loss a job can name.
LOSS_NAMES = ("logistic", "huber_svm", "ridge", "softmax")
_GLOBAL_LIPSCHITZ = {"logistic": 1.0, "huber_svm": 1.0, "softmax": math.sqrt(2.0)}


def _known(name: str) -> None:
    if name not in LOSS_NAMES:
        raise ValueError(f"model.name: unknown loss {name!r}; expected one of {', '.join(LOSS_NAMES)}")


def ridge_lipschitz_for(lam: float) -> float:
    """Honest G for ridge output perturbation: 1 + 1/√λ (the λ-regularised minimiser lies in
    ‖θ‖ ≤ 1/√λ; :class:`~.losses.SquaredLoss`)."""
    if not (math.isfinite(lam) and lam > 0):
        raise ValueError(f"lam: regularisation must be a finite number > 0, got {lam!r}")
    return 1.0 + 1.0 / math.sqrt(lam)


def lipschitz(name: str, radius: float | None = None) -> float:
    """G with ‖∇θ l‖ ≤ G for ‖x‖ ≤ 1 (and ‖θ‖ ≤ ``radius`` for the squared loss, which is not
    globally Lipschitz: G = R + 1)."""
    _known(name)
    if name != "ridge":
        return _GLOBAL_LIPSCHITZ[name]
    if radius is None:
        raise ValueError(
            "radius: the squared loss is not globally Lipschitz; pass radius=R (bound on "
            "||theta||) to get G = R + 1, or use ridge_lipschitz_for(lam) = 1 + 1/sqrt(lam) "
            "for the regularised minimiser"
        )
    if not (math.isfinite(radius) and radius >= 0):
        raise ValueError(f"radius: must be a finite number >= 0, got {radius!r}")
    return float(radius) + 1.0


def smoothness(name: str, h: float = 0.5) -> float:
    """L with ‖∇²θ l‖ ≤ L for ‖x‖ ≤ 1 (``h``: the Huber width)."""
    _known(name)
    if name == "huber_svm":
        if not (isinstance(h, numbers.Real) and math.isfinite(h) and h > 0):
            raise ValueError(f"h: Huber width must be a finite number > 0, got {h!r}")
        return 1.0 / (2.0 * float(h))
    return {"logistic": 0.25, "ridge": 1.0, "softmax": 0.5}[name]


def outputs(name: str, n_classes: int | None = None) -> int:
    """K_out, the rows of W: the class count for softmax, else 1."""
    _known(name)
    if name != "softmax":
        return 1
    if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 2:
        raise ValueError(f"n_classes: must be an int >= 2, got {n_classes!r}")
    return n_classes


def param_dim(name: str, d: int, n_classes: int | None = None) -> int:
    """The length of θ for ``d`` features."""
    return outputs(name, n_classes) * int(d)


# ---------------------------------------------------------------- built-in networks

#: The networks :mod:`.networks` builds (a party's own, ``plugin:<id>``, has no facts here).
NETWORK_NAMES = ("mlp", "mnist_cnn", "cifar_cnn", "tf_cifar_cnn", "char_lstm")


def conv_out(size: int, kernel: int, stride: int, pad: int = 0) -> int:
    """A convolution's output size along one axis."""
    return (size + 2 * pad - kernel) // stride + 1


def mnist_cnn_flat(input_shape: tuple[int, ...]) -> int:
    """The flattened width after mnist_cnn's two conv + max-pool blocks (Abadi et al.'s CNN)."""
    if len(input_shape) != 3:
        raise ValueError(f"model.input_shape: mnist_cnn takes (C, H, W) images, got {input_shape}")
    _, h, w = input_shape
    h, w = conv_out(h, 8, 2, 3) - 1, conv_out(w, 8, 2, 3) - 1  # conv 8/2 pad 3, then max-pool 2 stride 1
    h, w = conv_out(h, 4, 2) - 1, conv_out(w, 4, 2) - 1
    if h < 1 or w < 1:
        raise ValueError(f"model.input_shape: {input_shape} is too small for mnist_cnn")
    return 32 * h * w


def cifar_cnn_flat(input_shape: tuple[int, ...]) -> int:
    """The flattened width after cifar_cnn's three conv-conv-pool blocks."""
    if len(input_shape) != 3:
        raise ValueError(f"model.input_shape: cifar_cnn takes (C, H, W) images, got {input_shape}")
    _, h, w = input_shape
    if h % 8 or w % 8:
        raise ValueError(f"model.input_shape: cifar_cnn needs H and W divisible by 8, got {input_shape}")
    return 128 * (h // 8) * (w // 8)


#: tf_cifar_cnn's input: the central crop of this side (the TF CIFAR-10 tutorial's IMAGE_SIZE).
TF_CIFAR_CROP = 24


def tf_cifar_cnn_flat(input_shape: tuple[int, ...]) -> int:
    """The flattened width after tf_cifar_cnn's two conv-pool blocks on its 24×24 crop: 64·6·6."""
    if len(input_shape) != 3:
        raise ValueError(f"model.input_shape: tf_cifar_cnn takes (C, H, W) images, got {input_shape}")
    if min(input_shape[1:]) < TF_CIFAR_CROP:
        raise ValueError(f"model.input_shape: tf_cifar_cnn crops the central {TF_CIFAR_CROP}×{TF_CIFAR_CROP}, "
                         f"got {input_shape}")
    side = conv_out(conv_out(TF_CIFAR_CROP, 3, 2, 1), 3, 2, 1)  # two max-pools 3/2 pad 1: 24 → 12 → 6
    return 64 * side * side


def char_lstm_widths(input_shape: tuple[int, ...], hidden: tuple[int, ...], vocab: int) -> tuple[int, int]:
    """(embedding width, hidden width) of char_lstm."""
    if len(input_shape) != 1 or vocab < 2:
        raise ValueError("model.input_shape / model.vocab: char_lstm takes (L,) token ids and a vocabulary ≥ 2")
    width = hidden[0] if hidden else 128
    return min(64, width), width


def _linear(a: int, b: int) -> int:
    return a * b + b


def _conv(a: int, b: int, k: int) -> int:
    return a * b * k * k + b


def network_parameters(name: str, input_shape: tuple[int, ...], n_outputs: int, hidden: tuple[int, ...] = (128,),
                       vocab: int = 0) -> int:
    """The parameter count of a built-in network, from its spec alone (the privacy plan's
    dimension); the same ValueErrors, naming the field, as building it."""
    shape = tuple(int(v) for v in input_shape)
    if name == "mlp":
        widths = [math.prod(shape), *hidden, n_outputs]
        return sum(_linear(a, b) for a, b in zip(widths, widths[1:], strict=False))
    if name == "mnist_cnn":
        flat = mnist_cnn_flat(shape)
        return _conv(shape[0], 16, 8) + _conv(16, 32, 4) + _linear(flat, 32) + _linear(32, n_outputs)
    if name == "cifar_cnn":
        flat = cifar_cnn_flat(shape)
        blocks = sum(_conv(a, b, 3) + _conv(b, b, 3) for a, b in ((shape[0], 32), (32, 64), (64, 128)))
        return blocks + _linear(flat, 128) + _linear(128, n_outputs)
    if name == "tf_cifar_cnn":
        flat = tf_cifar_cnn_flat(shape)
        return (_conv(shape[0], 64, 5) + _conv(64, 64, 5) + _linear(flat, 384) + _linear(384, 192)
                + _linear(192, n_outputs))
    if name == "char_lstm":
        embed, width = char_lstm_widths(shape, hidden, vocab)
        return vocab * embed + _linear(embed, 4 * width) + _linear(width, 4 * width) + _linear(width, n_outputs)
    raise ValueError(f"model.network: no parameter count for {name!r} without building it")
