"""torch's fused optimizers (``fused=True``) on pjrt tensors: Adam and AdamW record one op for the whole step.

The foreach path records a dozen list ops per step, and torch computes each parameter's bias
corrections in Python; the fused path is one ``aten._fused_adam(w)_`` call, recorded here as one
``pjrt::adam_step`` whose results become the new parameters and optimizer states (see
``_lowering/_optim.py``). What is not lowered (a GradScaler's ``grad_scale``/``found_inf``, the
fused SGD and Adagrad) runs through the CPU fallback, or is refused when the fallback is off.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedOpError
from . import _fallback, _lazy
from ._lowering import op_name
from ._lowering._optim import ADAM_STEP, adam_step_outputs

aten = torch.ops.aten

FUSED_ADAM_OPS = (aten._fused_adam_.default, aten._fused_adam_.tensor_lr,
                  aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr)


def fused_adam_step(func: Any, args: tuple, kwargs: dict) -> None:
    """``torch._fused_adam(w)_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, ...)``."""
    from .tensor import XLAShardedTensor

    # __torch_dispatch__ passes the six lists positionally (they are not keyword-only in the schema).
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps = (list(x) for x in args[:6])
    name = op_name(func)
    if kwargs.get("grad_scale") is not None or kwargs.get("found_inf") is not None:
        return _fallback.refuse_or_run(func, args, kwargs, UnsupportedOpError(
            name, f"{name} with a GradScaler's grad_scale/found_inf is not lowered to the pjrt device and the CPU "
            "fallback is off; turn the fallback on, or use fused=False"))
    amsgrad = bool(kwargs["amsgrad"])
    tensors = adam_step_outputs(params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, amsgrad) + grads + state_steps
    if not all(isinstance(t, XLAShardedTensor) for t in tensors):
        return _fallback.refuse_or_run(func, args, kwargs, UnsupportedOpError(
            name, f"{name} mixes pjrt tensors with tensors on other devices; keep the parameters, their gradients "
            "and the optimizer state on pjrt"))
    lr = kwargs["lr"]
    lr_tensor = lr if isinstance(lr, torch.Tensor) else None
    call = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else [], state_steps, lr_tensor,
            0.0 if lr_tensor is not None else float(lr), float(kwargs["beta1"]), float(kwargs["beta2"]),
            float(kwargs["weight_decay"]), float(kwargs["eps"]), amsgrad, bool(kwargs["maximize"]),
            func.overloadpacket is aten._fused_adamw_)
    _lazy.record_into(ADAM_STEP, call, adam_step_outputs(params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, amsgrad))
    return None
