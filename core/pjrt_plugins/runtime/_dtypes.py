"""Element types: PJRT_Buffer_Type <-> numpy dtypes (ml_dtypes for bfloat16 and fp8) <-> torch.

torch is imported only when a torch tensor is converted; nothing here touches a plugin.
"""

from __future__ import annotations

import sys
from typing import Any

import ml_dtypes
import numpy as np

from ._cdef import enum_values

_PJRT_TYPES = {name.removeprefix("PJRT_Buffer_Type_"): value for name, value in enum_values("PJRT_Buffer_Type").items()}

# numpy dtype name (ml_dtypes names for the narrow floats) per PJRT element type.
_NUMPY_NAME_BY_PJRT_NAME = {
    "PRED": "bool",
    "S8": "int8",
    "S16": "int16",
    "S32": "int32",
    "S64": "int64",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "BF16": "bfloat16",
    "C64": "complex64",
    "C128": "complex128",
    "F8E5M2": "float8_e5m2",
    "F8E4M3FN": "float8_e4m3fn",
    "F8E4M3B11FNUZ": "float8_e4m3b11fnuz",
    "F8E5M2FNUZ": "float8_e5m2fnuz",
    "F8E4M3FNUZ": "float8_e4m3fnuz",
    "F8E4M3": "float8_e4m3",
    "F8E3M4": "float8_e3m4",
    "F8E8M0FNU": "float8_e8m0fnu",
}


def _numpy_dtype(name: str) -> np.dtype | None:
    if name == "bool":
        return np.dtype(np.bool_)
    kind = getattr(np, name) if hasattr(np, name) else getattr(ml_dtypes, name, None)
    if kind is None:
        return None
    dtype: np.dtype[Any] = np.dtype(kind)
    return dtype


NUMPY_BY_PJRT: dict[int, np.dtype] = {}
PJRT_BY_NUMPY: dict[np.dtype, int] = {}
for _pjrt_name, _np_name in _NUMPY_NAME_BY_PJRT_NAME.items():
    _dtype = _numpy_dtype(_np_name)
    if _dtype is not None:
        NUMPY_BY_PJRT[_PJRT_TYPES[_pjrt_name]] = _dtype
        PJRT_BY_NUMPY[_dtype] = _PJRT_TYPES[_pjrt_name]

PJRT_TYPE_NAMES: dict[int, str] = {value: name for name, value in _PJRT_TYPES.items()}


def pjrt_type_of(dtype: Any) -> int:
    """The PJRT_Buffer_Type for a numpy dtype; raises NotImplementedError if we cannot carry it."""
    dtype = np.dtype(dtype)
    try:
        return PJRT_BY_NUMPY[dtype]
    except KeyError:
        supported = ", ".join(sorted(str(d) for d in PJRT_BY_NUMPY))
        raise NotImplementedError(
            f"pjrt-plugins cannot transfer arrays of dtype {dtype}; supported dtypes: {supported}"
        ) from None


def numpy_dtype_of(pjrt_type: int) -> np.dtype:
    """The numpy dtype for a PJRT_Buffer_Type; raises NotImplementedError for the others."""
    try:
        return NUMPY_BY_PJRT[int(pjrt_type)]
    except KeyError:
        name = PJRT_TYPE_NAMES.get(int(pjrt_type), str(int(pjrt_type)))
        raise NotImplementedError(
            f"PJRT element type {name} has no numpy equivalent in pjrt-plugins (sub-byte and token "
            "types are not supported for host transfers)"
        ) from None


# -- torch (imported lazily) --------------------------------------------------------------

# torch dtypes numpy cannot hold natively: (torch dtype name, same-size integer torch dtype name).
_TORCH_REINTERPRET = {
    "bfloat16": "int16",
    "float8_e5m2": "uint8",
    "float8_e4m3fn": "uint8",
    "float8_e5m2fnuz": "uint8",
    "float8_e4m3fnuz": "uint8",
    "float8_e8m0fnu": "uint8",
}
_NUMPY_INT_OF_SIZE = {1: np.uint8, 2: np.int16}


def is_torch_tensor(value: Any) -> bool:
    """True for a torch.Tensor, without importing torch (if torch is not loaded, it is not one)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def torch_to_numpy(tensor: Any) -> np.ndarray:
    """A numpy view of a CPU tensor's memory (same strides), ml_dtypes for bf16/fp8."""
    import torch

    if tensor.device.type != "cpu":
        raise TypeError(
            f"only CPU torch tensors can be transferred, got one on {tensor.device}; call .cpu() first"
        )
    tensor = tensor.detach()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    name = str(tensor.dtype).removeprefix("torch.")
    if name in _TORCH_REINTERPRET:
        target = _numpy_dtype(name)
        if target is None:
            raise NotImplementedError(f"torch dtype {tensor.dtype} has no ml_dtypes equivalent installed")
        raw: np.ndarray = tensor.view(getattr(torch, _TORCH_REINTERPRET[name])).numpy()
        return raw.view(target)
    try:
        array: np.ndarray = tensor.numpy()
        return array
    except TypeError as exc:
        raise NotImplementedError(f"cannot transfer torch tensors of dtype {tensor.dtype}: {exc}") from None


def numpy_to_torch(array: np.ndarray) -> Any:
    """A torch tensor sharing ``array``'s memory (bf16/fp8 reinterpreted)."""
    import torch

    name = array.dtype.name
    if name in _TORCH_REINTERPRET:
        torch_dtype = getattr(torch, name, None)
        if torch_dtype is None:
            raise NotImplementedError(f"this torch has no dtype {name}")
        raw = array.view(_NUMPY_INT_OF_SIZE[array.dtype.itemsize])
        return torch.from_numpy(raw).view(torch_dtype)
    try:
        return torch.from_numpy(array)
    except TypeError as exc:
        raise NotImplementedError(f"cannot make a torch tensor of dtype {array.dtype}: {exc}") from None


# xla.PrimitiveType (xla_data.proto) values; names match PJRT_Buffer_Type's. Used to read the
# parameter shapes of a compiled HloModuleProto.
_XLA_PRIMITIVE_NAMES = {
    1: "PRED",
    2: "S8",
    3: "S16",
    4: "S32",
    5: "S64",
    6: "U8",
    7: "U16",
    8: "U32",
    9: "U64",
    10: "F16",
    11: "F32",
    12: "F64",
    15: "C64",
    16: "BF16",
    18: "C128",
    19: "F8E5M2",
    20: "F8E4M3FN",
    23: "F8E4M3B11FNUZ",
    24: "F8E5M2FNUZ",
    25: "F8E4M3FNUZ",
    28: "F8E4M3",
    29: "F8E3M4",
    33: "F8E8M0FNU",
}


def numpy_dtype_of_xla_primitive(primitive: int) -> np.dtype | None:
    """The numpy dtype of an xla.PrimitiveType value, or None (tuples, tokens, sub-byte types)."""
    name = _XLA_PRIMITIVE_NAMES.get(int(primitive))
    if name is None:
        return None
    return NUMPY_BY_PJRT.get(_PJRT_TYPES[name])
