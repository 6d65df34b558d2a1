"""PyTorch/XLA's einsum ``nn.Linear`` patch (``xs.XLAPatchedLinear``, ``xs.apply_xla_patch_to_nn_linear``, ...).

PyTorch/XLA routes ``nn.Linear`` through ``einsum`` because its own lowering of ``F.linear`` is a
reshape, a transpose and a matmul that hide the batch dimensions from sharding propagation. Here
``F.linear`` already lowers to one ``dot_general`` over the unflattened operands, so the patch
changes no sharding; it is provided with the same names and results so that ported code runs,
and it computes forward and backward with ``torch.einsum`` as PyTorch/XLA's does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["EinsumLinear", "XLAPatchedLinear", "apply_xla_patch_to_nn_linear", "xla_patched_nn_linear_forward"]


class XLAPatchedLinear(torch.autograd.Function):
    """``F.linear(input, weight, bias)`` as einsums, forward and backward; the backward reads ``weight`` itself.

    Example::

        y = xs.XLAPatchedLinear.apply(x, layer.weight, layer.bias)   # == layer(x)
    """

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
        ctx.save_for_backward(input, weight, bias)
        product = torch.einsum("...n,mn->...m", input, weight)
        return product if bias is None else product + bias

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input, weight, bias = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = torch.einsum("...m,mn->...n", grad_output, weight)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.einsum("...m,...n->mn", grad_output, input)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad_output.reshape(-1, grad_output.shape[-1]).sum(0)
        return grad_input, grad_weight, grad_bias


def xla_patched_nn_linear_forward(m: nn.Linear, input: torch.Tensor) -> torch.Tensor:
    """The forward of ``nn.Linear`` ``m`` through :class:`XLAPatchedLinear`."""
    return XLAPatchedLinear.apply(input, m.weight, m.bias)


class EinsumLinear(nn.Linear):
    """An ``nn.Linear`` whose forward is :func:`xla_patched_nn_linear_forward` (same parameters, same results)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return xla_patched_nn_linear_forward(self, input)


def apply_xla_patch_to_nn_linear(module: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` inside ``module`` (not ``module`` itself) with an :class:`EinsumLinear` holding the
    same parameter objects, so optimizers and shardings made before keep applying. Returns ``module``.

    Example::

        model = xs.apply_xla_patch_to_nn_linear(model)   # model.fc is an EinsumLinear now
    """
    for name, child in module.named_children():
        if isinstance(child, nn.Linear) and not isinstance(child, EinsumLinear):
            with torch.device("meta"):
                patched = EinsumLinear(child.in_features, child.out_features, bias=child.bias is not None)
            patched.weight = child.weight  # the Parameter objects themselves, not copies
            patched.bias = child.bias
            patched.train(child.training)
            setattr(module, name, patched)
        else:
            apply_xla_patch_to_nn_linear(child)
    return module
