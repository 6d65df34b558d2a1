"""``torch.autocast("pjrt")``: the autocast kernels of the pjrt device (torch ships none for PrivateUse1).

Registered once by ``_device.register_backend``. The policy is CUDA's: matrix products and
convolutions run in the autocast dtype, numerically sensitive ops (reductions, norms, losses,
exp/log, softmax) in float32, ops mixing dtypes in the widest; every other op passes through.
Never computes anything itself: kernels cast their arguments and call the op again below autocast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

#: Ops that run in the autocast dtype (bfloat16 or float16).
LOWER_PRECISION = (
    "mm", "bmm", "addmm", "addmv", "addr", "baddbmm", "addbmm", "matmul", "linear", "mv", "einsum", "prelu",
    "chain_matmul", "linalg_multi_dot", "linalg_vecdot", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "convolution", "_convolution", "conv_tbc", "scaled_dot_product_attention",
)
#: Ops that run in float32 (their inputs in the autocast dtype are cast up).
FLOAT32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt", "sinh",
    "tan", "pow", "softplus", "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm", "nuclear_norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss",
    "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist",
    "pdist", "cdist", "renorm", "logsumexp", "softmax", "log_softmax", "cumsum", "cumprod", "prod", "sum",
    "cross_entropy_loss", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "upsample_linear1d",
    "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d",
)
#: Ops whose floating-point arguments are all cast to the widest of their dtypes.
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sampler", "index_put", "scatter_add",
           "tensordot", "stack", "cat")

_KEY = "AutocastPrivateUse1"
_libraries: tuple[torch.library.Library, ...] = ()  # kept alive: dropping them unregisters the kernels


def _eligible(value: Any, device_type: str) -> bool:
    """What autocast casts: floating-point tensors (not float64) on our device."""
    return (isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64
            and value.device.type == device_type)


def _cast(value: Any, dtype: torch.dtype, device_type: str) -> Any:
    if _eligible(value, device_type):
        return value.to(dtype) if value.dtype != dtype else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype, device_type) for v in value)
    return value


def _floats(value: Any, device_type: str) -> list[torch.Tensor]:
    if _eligible(value, device_type):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _floats(v, device_type)]
    return []


def _kernel(op: Any, policy: str, device_type: str) -> Callable[..., Any]:
    exclude = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)  # type: ignore[attr-defined]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype: torch.dtype | None
        if policy == "lower":
            dtype = torch.get_autocast_dtype(device_type)
        elif policy == "float32":
            dtype = torch.float32
        else:
            found = _floats((args, tuple(kwargs.values())), device_type)
            dtype = None
            if found:
                widest = found[0].dtype
                for t in found[1:]:
                    widest = torch.promote_types(widest, t.dtype)
                dtype = widest
        with torch._C._ExcludeDispatchKeyGuard(exclude):
            if dtype is not None:
                args = _cast(args, dtype, device_type)
                kwargs = {k: _cast(v, dtype, device_type) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    kernel.__name__ = f"autocast_{policy}_{op.__name__}"
    return kernel


def register(device_type: str) -> None:
    """Register the fallthrough and the policy kernels for the autocast key of PrivateUse1 (idempotent)."""
    global _libraries
    if _libraries:
        return
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, dispatch_key=_KEY)
    library = torch.library.Library("aten", "IMPL")
    for policy, names in (("lower", LOWER_PRECISION), ("float32", FLOAT32), ("promote", PROMOTE)):
        for name in names:
            packet = getattr(torch.ops.aten, name, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                if "out" in overload:  # an out= tensor cannot be cast: torch's own kernels skip them too
                    continue
                op = getattr(packet, overload)
                if not torch._C._dispatch_has_kernel(op.name()) or torch._C._dispatch_has_kernel_for_dispatch_key(
                        op.name(), _KEY):
                    continue  # a Python-only overload (einsum.sublist), or registered already
                library.impl(op, _kernel(op, policy, device_type), _KEY)
    _libraries = (fallback, library)
