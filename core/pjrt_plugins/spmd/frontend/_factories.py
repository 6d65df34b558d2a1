"""The ``pjrt`` device's own kernels: factories (``torch.empty(..., device="pjrt")``, ``arange``, ...) and the
copies torch makes with the Python dispatch key excluded (``torch.tensor(..., device="pjrt")``).

Everything else on pjrt tensors reaches ``XLAShardedTensor.__torch_dispatch__``. Factories make deferred
host data: nothing is uploaded until a tensor is used.
"""

from __future__ import annotations

from typing import Any

import torch

from ..transport import TensorData
from ._torch_device import check_torch_device
from .tensor import XLAShardedTensor, copy_into, to_cpu, wrap

__all__ = ["HOST_FACTORIES", "register_factory_kernels"]


def _empty_memory_format(
    size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None, memory_format: Any = None
) -> torch.Tensor:
    return _new_empty(size, dtype, layout, device)


def _empty_strided(
    size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> torch.Tensor:
    return _new_empty(size, dtype, layout, device)


def _check_factory_target(device: Any, layout: Any) -> None:
    check_torch_device(device)
    if layout not in (None, torch.strided):
        raise NotImplementedError(f"the pjrt device holds dense (strided) tensors only, not {layout}")


def _new_empty(size: Any, dtype: Any, layout: Any, device: Any) -> torch.Tensor:
    _check_factory_target(device, layout)
    return wrap(TensorData.empty(tuple(size), dtype or torch.get_default_dtype()))


def _efficient_zero_tensor(
    size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> torch.Tensor:
    """Autograd's zero gradients (``sgn``'s backward, ...): plain zeros here (torch marks them ZeroTensor to skip
    arithmetic on them; with us they cost one fill in the program)."""
    _check_factory_target(device, layout)
    dtype = dtype or torch.get_default_dtype()
    data = TensorData.from_host(torch.zeros(tuple(size), dtype=dtype), copy=False)
    data.recipe = (torch.ops.aten.full.default, (list(data.shape), 0), {"dtype": dtype})
    return wrap(data)


def _resize_(self: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
    """``resize_`` (and ``resize_as_``) reach this kernel with the wrapper's metadata: a pjrt tensor keeps its shape."""
    if tuple(int(s) for s in size) == tuple(self.shape):
        return self
    raise RuntimeError(f"resize_: a pjrt tensor cannot change its shape (from {list(self.shape)} to {list(size)}); "
                       "make a new tensor of the new shape (torch.empty(shape, device='pjrt')), or reshape/view it")


#: Factories whose size comes from their arguments (torch implements them as ``empty`` + an
#: ``out=`` kernel that resizes the result, which a pjrt tensor cannot do). Ours build the
#: values on the CPU with torch's own kernel and keep them as deferred host data, like
#: ``torch.zeros(..., device="pjrt")``: nothing moves until the tensor is used.
HOST_FACTORIES = (
    "arange",
    "arange.start",
    "arange.start_step",
    "eye",
    "eye.m",
    "linspace",
    "linspace.Tensor_Tensor",
    "linspace.Tensor_Scalar",
    "linspace.Scalar_Tensor",
    "logspace",
    "logspace.Tensor_Tensor",
    "logspace.Tensor_Scalar",
    "logspace.Scalar_Tensor",
    "tril_indices",
    "triu_indices",
)


def _host_factory(name: str) -> Any:
    packet, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.aten, packet), overload or "default")

    def kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        _check_factory_target(kwargs.get("device"), kwargs.get("layout"))
        # linspace/logspace take their ends as 0-d tensors too, which may be pjrt tensors
        args = tuple(to_cpu(a) if isinstance(a, XLAShardedTensor) else a for a in args)
        values = op(*args, **{**kwargs, "device": torch.device("cpu"), "pin_memory": False})
        data = TensorData.from_host(values, copy=False)
        if packet == "arange" and not values.dtype.is_floating_point:  # exact: an engine may compute it itself
            data.recipe = (op, args, {"dtype": values.dtype})
        return wrap(data)

    kernel.__name__ = f"pjrt_{packet}_{overload or 'default'}"
    return kernel


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return copy_into(dst, src)


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if tuple(dst.shape) != tuple(src.shape):
        raise NotImplementedError(
            f"resizing a pjrt tensor from {tuple(dst.shape)} to {tuple(src.shape)} is not supported; "
            "allocate the output with the right shape"
        )
    return copy_into(dst, src)


_library: torch.library.Library | None = None  # kept alive: dropping it unregisters the kernels


def register_factory_kernels() -> None:
    """Register the kernels above for the PrivateUse1 key (once)."""
    global _library
    if _library is not None:
        return
    library = torch.library.Library("aten", "IMPL")
    library.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    library.impl("empty_strided", _empty_strided, "PrivateUse1")
    library.impl("_copy_from", _copy_from, "PrivateUse1")
    library.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
    library.impl("_efficientzerotensor", _efficient_zero_tensor, "PrivateUse1")
    library.impl("resize_", _resize_, "PrivateUse1")
    for name in HOST_FACTORIES:
        library.impl(name, _host_factory(name), "PrivateUse1")
    _library = library


register_factory_kernels()
