"""Payload encoding without pickle.

Tensors travel as their raw little-endian bytes plus dtype name and shape, so a receiver never
executes anything a peer sent. The *_obj calls of CrypTen (which pickle arbitrary objects under
gloo) are limited here to a closed set of types encoded as a protobuf ``Value``: None, bool,
int, float, str, bytes, list, tuple, dict, torch.Size, torch.dtype, torch.device and tensors.
That covers what CrypTen sends (sizes, seeds, the TTP request dicts); anything else is refused
at the sender with a PayloadError, so there is no pickle to accept from anyone.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

from .._proto import transport_pb2 as pb
from .errors import PayloadError

DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
MAX_OBJECT_DEPTH = 32

if sys.byteorder != "little":  # pragma: no cover - no big-endian host in sight
    raise ImportError("the share transport sends native tensor bytes and assumes a little-endian host")


def tensor_header(tensor: torch.Tensor) -> pb.TensorHeader:
    name = DTYPE_NAMES.get(tensor.dtype)
    if name is None:
        raise PayloadError(f"dtype {tensor.dtype} cannot be sent (allowed: {sorted(DTYPES)})")
    return pb.TensorHeader(dtype=name, shape=list(tensor.shape))


def tensor_to_bytes(tensor: torch.Tensor) -> tuple[pb.TensorHeader, memoryview]:
    """Header and a zero-copy view of the tensor's bytes (copied to CPU/contiguous if needed)."""
    header = tensor_header(tensor)
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return header, memoryview(b"")
    raw = t.view(torch.uint8).numpy()
    return header, memoryview(raw).cast("B")


def expected_nbytes(header: pb.TensorHeader) -> int:
    dtype = DTYPES.get(header.dtype)
    if dtype is None:
        raise PayloadError(f"unknown dtype {header.dtype!r}")
    if any(d < 0 for d in header.shape):
        raise PayloadError(f"negative dimension in shape {list(header.shape)}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    return math.prod(header.shape) * itemsize


def tensor_from_bytes(header: pb.TensorHeader, data: bytes | bytearray) -> torch.Tensor:
    """Rebuild a CPU tensor; refuses a byte count that does not match dtype and shape."""
    n = expected_nbytes(header)
    if len(data) != n:
        raise PayloadError(f"tensor {header.dtype}{list(header.shape)} needs {n} bytes, got {len(data)}")
    dtype = DTYPES[header.dtype]
    shape = tuple(header.shape)
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    buf = data if isinstance(data, bytearray) else bytearray(data)
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)


def _encode(obj: Any, depth: int) -> pb.Value:
    if depth > MAX_OBJECT_DEPTH:
        raise PayloadError(f"object nested deeper than {MAX_OBJECT_DEPTH}")
    v = pb.Value()
    if obj is None:
        v.none = True
    elif isinstance(obj, bool):
        v.bool_value = obj
    elif isinstance(obj, int):
        if _INT64_MIN <= obj <= _INT64_MAX:
            v.int_value = obj
        else:
            v.big_int = str(obj)
    elif isinstance(obj, float):
        v.float_value = obj
    elif isinstance(obj, str):
        v.str_value = obj
    elif isinstance(obj, bytes | bytearray):
        v.bytes_value = bytes(obj)
    elif isinstance(obj, torch.Size):  # before tuple: Size is a tuple subclass
        v.size_value.SetInParent()  # an empty container must still select its oneof kind
        v.size_value.dims.extend(int(d) for d in obj)
    elif isinstance(obj, torch.dtype):
        if obj not in DTYPE_NAMES:
            raise PayloadError(f"dtype {obj} cannot be sent")
        v.dtype_value = DTYPE_NAMES[obj]
    elif isinstance(obj, torch.device):
        v.device_value = str(obj)
    elif isinstance(obj, torch.Tensor):
        header, raw = tensor_to_bytes(obj)
        v.tensor_value.header.CopyFrom(header)
        v.tensor_value.data = bytes(raw)
    elif isinstance(obj, list):
        v.list_value.SetInParent()
        v.list_value.items.extend(_encode(x, depth + 1) for x in obj)
    elif type(obj) is tuple:  # not namedtuples or other subclasses: their type would be lost
        v.tuple_value.SetInParent()
        v.tuple_value.items.extend(_encode(x, depth + 1) for x in obj)
    elif type(obj) is dict:
        v.dict_value.SetInParent()
        for key, val in obj.items():
            v.dict_value.keys.append(_encode(key, depth + 1))
            v.dict_value.values.append(_encode(val, depth + 1))
    else:
        raise PayloadError(
            f"objects of type {type(obj).__qualname__} cannot be sent over the share transport "
            "(no pickle: only None/bool/int/float/str/bytes/list/tuple/dict/torch.Size/dtype/device/Tensor)"
        )
    return v


def _decode(v: pb.Value, depth: int) -> Any:
    if depth > MAX_OBJECT_DEPTH:
        raise PayloadError(f"object nested deeper than {MAX_OBJECT_DEPTH}")
    kind = v.WhichOneof("kind")
    if kind == "none":
        return None
    if kind == "bool_value":
        return v.bool_value
    if kind == "int_value":
        return v.int_value
    if kind == "big_int":
        if len(v.big_int) > 4300 or not v.big_int.lstrip("-").isdigit():
            raise PayloadError("malformed big integer")
        return int(v.big_int)
    if kind == "float_value":
        return v.float_value
    if kind == "str_value":
        return v.str_value
    if kind == "bytes_value":
        return v.bytes_value
    if kind == "size_value":
        return torch.Size(v.size_value.dims)
    if kind == "dtype_value":
        if v.dtype_value not in DTYPES:
            raise PayloadError(f"unknown dtype {v.dtype_value!r}")
        return DTYPES[v.dtype_value]
    if kind == "device_value":
        try:
            return torch.device(v.device_value)
        except (RuntimeError, ValueError):
            raise PayloadError(f"malformed device {v.device_value[:40]!r}") from None
    if kind == "tensor_value":
        return tensor_from_bytes(v.tensor_value.header, v.tensor_value.data)
    if kind == "list_value":
        return [_decode(x, depth + 1) for x in v.list_value.items]
    if kind == "tuple_value":
        return tuple(_decode(x, depth + 1) for x in v.tuple_value.items)
    if kind == "dict_value":
        if len(v.dict_value.keys) != len(v.dict_value.values):
            raise PayloadError("malformed dict: keys and values differ in number")
        out = {}
        for k, x in zip(v.dict_value.keys, v.dict_value.values):
            key = _decode(k, depth + 1)
            if isinstance(key, list | dict | torch.Tensor):
                raise PayloadError(f"unhashable dict key of type {type(key).__name__}")
            out[key] = _decode(x, depth + 1)
        return out
    raise PayloadError(f"empty or unknown value kind {kind!r}")


def encode_object(obj: Any) -> bytes:
    """Serialise a Python object of the allowed types (see module docstring)."""
    return _encode(obj, 0).SerializeToString()


def decode_object(data: bytes | bytearray) -> Any:
    value = pb.Value()
    try:
        value.ParseFromString(bytes(data))
    except Exception as exc:  # protobuf's DecodeError and recursion errors alike
        raise PayloadError(f"malformed object payload: {exc}") from None
    return _decode(value, 0)
