"""The fused Adam/AdamW and SGD steps (``torch.optim.AdamW(..., fused=True)``) as one op for the whole parameter list.

torch's fused optimizers call ``aten._fused_adam_`` / ``_fused_adamw_`` / ``_fused_sgd_``, which write
several lists of tensors in place. The tracer records each op as one node with one list of results,
so a step is recorded as ``pjrt::adam_step`` / ``pjrt::sgd_step``: the same arguments (the learning
rate as a float or a tensor), and the new parameters and optimizer states as one flat list. Their
floats are run-time scalars, so a learning-rate schedule does not recompile.

The arithmetic is that of torch's fused kernels: the optimizer math in float32 for half types,
Adam's bias corrections from the (already incremented) step tensors in float64.
``grad_scale``/``found_inf`` (GradScaler) are not lowered: those calls take the CPU fallback.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxlib.mlir.dialects import stablehlo as hlo

from ._emitter import Emitter, Operand, TensorValue
from ._promotion import compute_dtype
from ._table import lowers, meta_rule

_library = torch.library.Library("pjrt", "FRAGMENT")  # kept alive: dropping it unregisters the op
_library.define(
    "adam_step(Tensor[] params, Tensor[] grads, Tensor[] exp_avgs, Tensor[] exp_avg_sqs, "
    "Tensor[] max_exp_avg_sqs, Tensor[] state_steps, Tensor? lr_tensor, float lr, float beta1, float beta2, "
    "float weight_decay, float eps, bool amsgrad, bool maximize, bool decoupled_weight_decay) -> Tensor[]"
)
_library.define(
    "sgd_step(Tensor[] params, Tensor[] grads, Tensor[] momentum_buffers, Tensor? lr_tensor, float lr, "
    "float weight_decay, float momentum, float dampening, bool nesterov, bool maximize, bool is_first_step) "
    "-> Tensor[]"
)
ADAM_STEP = torch.ops.pjrt.adam_step.default
SGD_STEP = torch.ops.pjrt.sgd_step.default


def adam_step_outputs(params: Sequence[torch.Tensor], exp_avgs: Sequence[torch.Tensor],
                      exp_avg_sqs: Sequence[torch.Tensor], max_exp_avg_sqs: Sequence[torch.Tensor],
                      amsgrad: bool) -> list[torch.Tensor]:
    """The tensors ``adam_step``'s results are written into, in the order of its flat result list."""
    return [*params, *exp_avgs, *exp_avg_sqs, *(max_exp_avg_sqs if amsgrad else ())]


@meta_rule(ADAM_STEP)
def _adam_step_meta(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr_tensor, lr, beta1,
                    beta2, weight_decay, eps, amsgrad, maximize, decoupled_weight_decay):
    return [torch.empty_like(t) for t in adam_step_outputs(params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, amsgrad)]


def _cpu_adam_step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr_tensor, lr, beta1, beta2,
                   weight_decay, eps, amsgrad, maximize, decoupled_weight_decay):
    """The op on CPU tensors (the fallback's path): torch's own fused kernel on copies."""
    outputs = [t.clone() for t in adam_step_outputs(params, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, amsgrad)]
    n = len(params)
    new_params, new_avgs, new_sqs, new_maxes = outputs[:n], outputs[n:2 * n], outputs[2 * n:3 * n], outputs[3 * n:]
    fused = torch._fused_adamw_ if decoupled_weight_decay else torch._fused_adam_
    fused(new_params, [g.clone() for g in grads], new_avgs, new_sqs, new_maxes if amsgrad else [], list(state_steps),
          lr=lr_tensor if lr_tensor is not None else lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay,
          eps=eps, amsgrad=amsgrad, maximize=maximize)
    return outputs


_library.impl("adam_step", _cpu_adam_step, "CPU")
_library.impl("adam_step", _adam_step_meta, "Meta")


@lowers(ADAM_STEP)
def _adam_step(em: Emitter, out: list[torch.Tensor], params: list[TensorValue], grads: list[TensorValue],
               exp_avgs: list[TensorValue], exp_avg_sqs: list[TensorValue], max_exp_avg_sqs: list[TensorValue],
               state_steps: list[TensorValue], lr_tensor: TensorValue | None, lr: Operand, beta1: Operand,
               beta2: Operand, weight_decay: Operand, eps: Operand, amsgrad: bool, maximize: bool,
               decoupled_weight_decay: bool) -> list[TensorValue]:
    f64 = torch.float64
    lr64 = em.convert(em.reshape(lr_tensor, ()), f64) if lr_tensor is not None else em.as_tensor(lr, f64)
    b1, b2 = em.as_tensor(beta1, f64), em.as_tensor(beta2, f64)
    one = em.constant(1, f64)
    new_params, new_avgs, new_sqs, new_maxes = [], [], [], []
    for i, p in enumerate(params):
        cdt, shape = compute_dtype(p.dtype), p.shape

        def scalar(x: TensorValue) -> TensorValue:
            return em.broadcast_to(em.convert(x, cdt), shape)

        step = em.convert(em.reshape(state_steps[i], ()), f64)
        bias_correction1 = em.sub(one, em.binary(hlo.power, b1, step))
        bias_correction2 = em.sub(one, em.binary(hlo.power, b2, step))
        step_size = scalar(em.div(lr64, bias_correction1))
        bias_correction2_sqrt = scalar(em.unary(hlo.sqrt, bias_correction2))

        param = em.as_tensor(p, cdt, shape)
        grad = em.as_tensor(grads[i], cdt, shape)
        if maximize:
            grad = em.unary(hlo.negate, grad)
        if weight_decay != 0:
            decay = em.as_tensor(weight_decay, cdt, shape)
            if decoupled_weight_decay:  # AdamW: param -= lr * weight_decay * param
                param = em.sub(param, em.mul(em.mul(scalar(lr64), decay), param))
            else:  # Adam: L2 penalty in the gradient
                grad = em.add(grad, em.mul(param, decay))
        exp_avg = em.as_tensor(exp_avgs[i], cdt, shape)
        exp_avg = em.add(exp_avg, em.mul(scalar(em.sub(one, b1)), em.sub(grad, exp_avg)))  # lerp by 1 - beta1
        exp_avg_sq = em.as_tensor(exp_avg_sqs[i], cdt, shape)
        exp_avg_sq = em.add(em.mul(exp_avg_sq, scalar(b2)), em.mul(em.mul(scalar(em.sub(one, b2)), grad), grad))
        second = exp_avg_sq
        if amsgrad:
            second = em.maximum(em.as_tensor(max_exp_avg_sqs[i], cdt, shape), exp_avg_sq)
            new_maxes.append(em.convert(second, max_exp_avg_sqs[i].dtype))
        denom = em.add(em.div(em.unary(hlo.sqrt, second), bias_correction2_sqrt), em.as_tensor(eps, cdt, shape))
        param = em.sub(param, em.div(em.mul(step_size, exp_avg), denom))
        new_params.append(em.convert(param, p.dtype))
        new_avgs.append(em.convert(exp_avg, exp_avgs[i].dtype))
        new_sqs.append(em.convert(exp_avg_sq, exp_avg_sqs[i].dtype))
    return [*new_params, *new_avgs, *new_sqs, *new_maxes]


def sgd_step_outputs(params: Sequence[torch.Tensor], momentum_buffers: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The tensors ``sgd_step``'s results are written into (the buffers only with momentum)."""
    return [*params, *momentum_buffers]


@meta_rule(SGD_STEP)
def _sgd_step_meta(params, grads, momentum_buffers, lr_tensor, lr, weight_decay, momentum, dampening, nesterov,
                   maximize, is_first_step):
    return [torch.empty_like(t) for t in sgd_step_outputs(params, momentum_buffers)]


def _cpu_sgd_step(params, grads, momentum_buffers, lr_tensor, lr, weight_decay, momentum, dampening, nesterov,
                  maximize, is_first_step):
    """The op on CPU tensors (the fallback's path): torch's own fused kernel on copies."""
    outputs = [t.clone() for t in sgd_step_outputs(params, momentum_buffers)]
    n = len(params)
    torch._fused_sgd_(outputs[:n], [g.clone() for g in grads], outputs[n:],
                      lr=lr_tensor if lr_tensor is not None else lr, weight_decay=weight_decay, momentum=momentum,
                      dampening=dampening, nesterov=nesterov, maximize=maximize, is_first_step=is_first_step)
    return outputs


_library.impl("sgd_step", _cpu_sgd_step, "CPU")
_library.impl("sgd_step", _sgd_step_meta, "Meta")


@lowers(SGD_STEP)
def _sgd_step(em: Emitter, out: list[torch.Tensor], params: list[TensorValue], grads: list[TensorValue],
              momentum_buffers: list[TensorValue], lr_tensor: TensorValue | None, lr: Operand, weight_decay: Operand,
              momentum: Operand, dampening: Operand, nesterov: bool, maximize: bool,
              is_first_step: bool) -> list[TensorValue]:
    new_params, new_buffers = [], []
    for i, p in enumerate(params):
        cdt, shape = compute_dtype(p.dtype), p.shape
        param = em.as_tensor(p, cdt, shape)
        grad = em.as_tensor(grads[i], cdt, shape)
        if maximize:
            grad = em.unary(hlo.negate, grad)
        if weight_decay != 0:
            grad = em.add(grad, em.mul(em.as_tensor(weight_decay, cdt, shape), param))
        if momentum != 0:
            if is_first_step:  # torch's buffers are fresh (empty_like): the gradient starts them
                buffer = grad
            else:
                previous = em.as_tensor(momentum_buffers[i], cdt, shape)
                kept = em.sub(em.constant(1, cdt, shape), em.as_tensor(dampening, cdt, shape))
                buffer = em.add(em.mul(em.as_tensor(momentum, cdt, shape), previous), em.mul(kept, grad))
            new_buffers.append(em.convert(buffer, momentum_buffers[i].dtype))
            grad = em.add(grad, em.mul(em.as_tensor(momentum, cdt, shape), buffer)) if nesterov else buffer
        rate = (em.broadcast_to(em.convert(em.reshape(lr_tensor, ()), cdt), shape) if lr_tensor is not None
                else em.as_tensor(lr, cdt, shape))
        param = em.sub(param, em.mul(rate, grad))
        new_params.append(em.convert(param, p.dtype))
    return [*new_params, *new_buffers]
