"""The CrypTen shim: crypten must import and compute on the pinned torch, and fail loudly if
torch moves the aliased module again."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from mpc_erm.mpc import crypten_compat


def test_the_relocated_registry_still_exists_in_this_torch() -> None:
    # If this fails, torch moved the ONNX symbolic registry again: update crypten_compat.NEW_PATH.
    import importlib

    moved = importlib.import_module(crypten_compat.NEW_PATH)
    assert hasattr(moved, "registry"), f"{crypten_compat.NEW_PATH}.registry is gone in torch {torch.__version__}"


def test_crypten_imports_and_computes_in_a_fresh_interpreter() -> None:
    # A fresh interpreter: the alias must be installed before crypten's first import.
    code = textwrap.dedent(
        """
        import torch
        from mpc_erm.mpc.crypten_compat import import_crypten
        crypten = import_crypten()
        crypten.init()
        a = crypten.cryptensor(torch.tensor([1.5, -2.25, 3.0]))
        b = crypten.cryptensor(torch.tensor([0.5, 4.0, -1.0]))
        out = (a * b + a).get_plain_text()
        assert torch.allclose(out, torch.tensor([2.25, -11.25, 0.0]), atol=1e-3), out
        assert (a > b).get_plain_text().tolist() == [1, 0, 1]
        print("ok")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


def test_a_torch_without_either_path_fails_with_a_named_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crypten_compat, "OLD_PATH", "torch.onnx._internal.no_such_registration")
    monkeypatch.setattr(crypten_compat, "NEW_PATH", "torch.onnx._internal.also_missing_registration")
    with pytest.raises(crypten_compat.CryptenCompatError, match="also_missing_registration"):
        crypten_compat.install_aliases()


def test_install_check_passes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mpc_erm.mpc.install_check"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "OK" in proc.stdout


def test_plain_takes_the_tensor_out_of_cryptens_cuda_wrapper_and_back() -> None:
    """CrypTen wraps CUDA shares in CUDALongTensor, whose ``out=`` recurses without end (seen on
    an H100): the samplers and the transport unwrap it, the communicator gives CrypTen back the
    type it sent. Built here around a CPU tensor (the wrapper's constructor needs CUDA)."""
    crypten_compat.import_crypten()
    from crypten.cuda import CUDALongTensor

    t = torch.arange(4)
    w = object.__new__(CUDALongTensor)
    w._tensor = t
    assert crypten_compat.plain(w) is t and crypten_compat.plain(t) is t and crypten_compat.plain(3) == 3
    args, found = crypten_compat.unwrap_all((w, [w, 3], "x"))
    assert found and args[0] is t and args[1][0] is t and args[1][1] == 3 and args[2] == "x"
    assert crypten_compat.unwrap_all((t, [t])) == ((t, [t]), False)
    assert crypten_compat.rewrap_all([t, (t,)])[0] is t  # a CPU tensor is never wrapped
    assert {"contiguous", "detach"} <= set(vars(CUDALongTensor))  # what CrypTen's CUDA paths call on it
    if torch.cuda.is_available():
        w = CUDALongTensor(t.cuda())
        assert isinstance(w.contiguous(), CUDALongTensor) and torch.equal(w.detach().tensor().cpu(), t)
        back = crypten_compat.rewrap_all([t.cuda()])
        assert isinstance(back[0], CUDALongTensor) and torch.equal(back[0].tensor().cpu(), t)
