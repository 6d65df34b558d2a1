"""torch's fused optimizers (``fused=True``) on pjrt tensors: Adam, AdamW and SGD record one op for the whole step.

The foreach path records a dozen list ops per step, and torch computes each parameter's bias
corrections in Python; the fused path is one ``aten._fused_adam(w)_`` / ``_fused_sgd_`` call,
recorded here as one ``pjrt::adam_step`` / ``pjrt::sgd_step`` whose results become the new
parameters and optimizer states (see the lowering's ``_optim``). What is not lowered (a GradScaler's
``grad_scale``/``found_inf``, the fused Adagrad) runs through the CPU fallback, or is refused when
the fallback is off.
"""

from __future__ import annotations

from typing import Any

import torch

from ...errors import UnsupportedOpError
from ..lowering import ADAM_STEP, SGD_STEP, adam_step_outputs, op_name, sgd_step_outputs
from . import _fallback
from ._dispatch import record_into
from .tensor import XLAShardedTensor

aten = torch.ops.aten


def fused_step(func: Any, args: tuple, kwargs: dict) -> None:
    """A fused optimizer step on pjrt tensors (``torch._fused_adam(w)_`` or ``torch._fused_sgd_``)."""
    if func.overloadpacket is aten._fused_sgd_:
        return fused_sgd_step(func, args, kwargs)
    return fused_adam_step(func, args, kwargs)


def fused_adam_step(func: Any, args: tuple, kwargs: dict) -> None:
    """``torch._fused_adam(w)_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, ...)``."""
    # __torch_dispatch__ passes the six lists positionally (they are not keyword-only in the schema).
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps = (list(x) for x in args[:6])
    amsgrad = bool(kwargs["amsgrad"])
    refusal = _refusal(func, kwargs, adam_step_outputs(params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, amsgrad)
                       + grads + state_steps)
    if refusal is not None:
        return _fallback.refuse_or_run(func, args, kwargs, refusal)
    lr_tensor, lr = _learning_rate(kwargs)
    call = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else [], state_steps, lr_tensor, lr,
            float(kwargs["beta1"]), float(kwargs["beta2"]), float(kwargs["weight_decay"]), float(kwargs["eps"]),
            amsgrad, bool(kwargs["maximize"]), func.overloadpacket is aten._fused_adamw_)
    record_into(ADAM_STEP, call, adam_step_outputs(params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, amsgrad))
    return None


def fused_sgd_step(func: Any, args: tuple, kwargs: dict) -> None:
    """``torch._fused_sgd_(params, grads, momentum_buffers, ...)``; the buffers are ``[]`` without momentum."""
    params, grads, buffers = (list(x) for x in args[:3])
    refusal = _refusal(func, kwargs, sgd_step_outputs(params, buffers) + grads)
    if refusal is not None:
        return _fallback.refuse_or_run(func, args, kwargs, refusal)
    lr_tensor, lr = _learning_rate(kwargs)
    call = (params, grads, buffers, lr_tensor, lr, float(kwargs["weight_decay"]), float(kwargs["momentum"]),
            float(kwargs["dampening"]), bool(kwargs["nesterov"]), bool(kwargs["maximize"]),
            bool(kwargs["is_first_step"]))
    record_into(SGD_STEP, call, sgd_step_outputs(params, buffers))
    return None


def _refusal(func: Any, kwargs: dict, tensors: list[Any]) -> UnsupportedOpError | None:
    """Why this fused step cannot be recorded (it then takes the fallback), or None."""
    name = op_name(func)
    if kwargs.get("grad_scale") is not None or kwargs.get("found_inf") is not None:
        return UnsupportedOpError(name, f"{name} with a GradScaler's grad_scale/found_inf is not lowered to the pjrt "
                                  "device and the CPU fallback is off; turn the fallback on, or use fused=False")
    if not all(isinstance(t, XLAShardedTensor) for t in tensors):
        return UnsupportedOpError(name, f"{name} mixes pjrt tensors with tensors on other devices; keep the "
                                  "parameters, their gradients and the optimizer state on pjrt")
    return None


def _learning_rate(kwargs: dict) -> tuple[torch.Tensor | None, float]:
    """``(lr_tensor, lr)``: a tensor learning rate (the ``tensor_lr`` overloads) or a float."""
    lr = kwargs["lr"]
    return (lr, 0.0) if isinstance(lr, torch.Tensor) else (None, float(lr))
