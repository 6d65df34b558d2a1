"""Sharding hints inside a computation, eagerly and as torch.compile traces them: constraints that autograd
carries to the gradient, shard groups, custom shardings, optimization barriers.

Each hint is one of the lowering's pass-through operators (``pjrt::sharding_constraint``,
``pjrt::shard_alike``, ``pjrt::optimization_barrier``), recorded like any operator. The public
functions users call are ``_traceable``'s, which dynamo traces; the ``@trace_through`` functions here
are the calls it leaves opaque in its graph (they compute a sharding from a mesh: Python dynamo must
not trace), which AOTAutograd runs on its tracing tensors. Nothing here uploads data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ...errors import ShardingError, SpmdDisabledError
from ..devices import check_mesh_fits, get_global_mesh, virtual_device
from ..sharding import Mesh, OpSharding, PartitionSpec
from . import _seam
from ._tracing_tensors import trace_through
from .tensor import XLAShardedTensor, describe, unwrap

__all__ = [
    "MarkShardingFunction",
    "annotate_custom_sharding",
    "apply_backward_optimization_barrier",
    "as_mesh",
    "hint",
    "is_traced",
    "load_ops",
    "optimization_barrier_",
    "shard_as",
    "sharding_on",
    "with_gradients",
]


def as_mesh(mesh: Mesh | Sequence[int] | None, what: str = "mark_sharding") -> Mesh:
    """``mesh`` as a :class:`Mesh`: a mesh shape (the RFC's form) covers every device in ordinal order."""
    if isinstance(mesh, Mesh):
        return mesh
    if isinstance(mesh, (tuple, list)) and all(isinstance(s, int) and not isinstance(s, bool) for s in mesh):
        return Mesh(range(math.prod(mesh)), tuple(mesh))
    raise TypeError(f"{what} expects a Mesh or a mesh shape (tuple of ints), got {mesh!r}")


def is_traced(t: Any) -> bool:
    """Whether ``t`` is a pjrt tensor torch.compile is tracing (it holds no data: a hint becomes a graph node)."""
    return isinstance(t, XLAShardedTensor) and t._pjrt_data is None


def sharding_on(t: torch.Tensor, mesh: Mesh | Sequence[int] | None, partition_spec: PartitionSpec,
                what: str = "mark_sharding") -> tuple[Mesh, OpSharding]:
    """The mesh and the sharding ``partition_spec`` gives ``t`` on it, checked against the virtual device
    (``mesh=None``: the global mesh)."""
    if not isinstance(t, XLAShardedTensor):
        unwrap(t)  # raises the error that says to move it to pjrt
    vd = virtual_device()
    if not vd.spmd:
        raise SpmdDisabledError(
            f"{what} needs SPMD mode, which is off (XLA_USE_SPMD=0): the virtual device is a single device. "
            "Call pjrt_plugins.spmd.use_spmd() or set XLA_USE_SPMD=1 before using the pjrt device."
        )
    if mesh is None:
        mesh = get_global_mesh()
        if mesh is None:
            raise ShardingError(f"{what} needs a mesh: pass mesh=... or call xs.set_global_mesh(mesh) first")
    mesh = as_mesh(mesh, what)
    check_mesh_fits(mesh, vd)
    spec = mesh.get_op_sharding(partition_spec, rank=t.dim())
    spec.check_devices(vd.device_ids)
    return mesh, spec


def load_ops() -> Any:
    """``torch.ops.pjrt``, with the engine loaded (the lowering defines the hint operators)."""
    _seam.engine()
    return torch.ops.pjrt


def _constrain(t: torch.Tensor, mesh: Mesh, spec: OpSharding, partition_spec: PartitionSpec) -> torch.Tensor:
    """A new tensor: ``t`` constrained to ``spec``; eagerly it is declared with that sharding at once."""
    out = load_ops().sharding_constraint(t, spec.to_hlo())
    if not is_traced(out):
        data = unwrap(out)
        data.annotation, data.mark = spec, (mesh, tuple(partition_spec))
    return out


def _from_graphable(partition_spec: Sequence[Any]) -> tuple[Any, ...]:
    """A partition spec as ``_traceable`` hands it through dynamo (``None`` as ``()``, which dynamo can carry)."""
    return tuple(None if p == () else p for p in partition_spec)


@trace_through
def hint(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence[Any]) -> list[Any]:
    """``mark_sharding`` and ``annotate_custom_sharding`` in compiled code: from here on the graph uses ``t``
    constrained to the sharding (``pjrt::sharding_hint``; in place, unseen by autograd, as in PyTorch/XLA).
    Returns ``[]``: an opaque call must return something dynamo can put in its graph, and None is not."""
    partition_spec = _from_graphable(partition_spec)
    _, spec = sharding_on(t, mesh, partition_spec)
    if is_traced(t):
        load_ops().sharding_hint(t, spec.to_hlo())
    else:  # a backend that runs the graph's Python as it is ("eager"): the eager functions' effect
        annotate_custom_sharding(t, mesh, partition_spec)
    return []


@trace_through
def with_gradients(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence[Any]) -> torch.Tensor:
    """``mark_sharding_with_gradients`` as compiled code calls it."""
    return MarkShardingFunction.apply(t, mesh, _from_graphable(partition_spec))  # type: ignore[no-any-return]


# -- autograd: the gradient gets the annotated sharding too ----------------------------------------


class MarkShardingFunction(torch.autograd.Function):
    """``mark_sharding`` as an autograd function: the result is a new tensor constrained to the sharding, and in
    the backward pass the gradient is constrained to it too (PyTorch/XLA's ``MarkShardingFunction``).

    It guides the partitioner's propagation through the backward pass, where it would otherwise choose a
    layout for the gradient itself (and may insert extra collectives). Works eagerly and under
    ``torch.compile`` (AOTAutograd traces both passes).

    Example (8 devices)::

        h = MarkShardingFunction.apply(x @ w, mesh, ("data", None))   # h and dL/dh split over "data"
    """

    @staticmethod
    def forward(ctx: Any, torch_tensor: torch.Tensor, mesh: Mesh, partition_spec: PartitionSpec) -> torch.Tensor:
        mesh, spec = sharding_on(torch_tensor, mesh, partition_spec, "MarkShardingFunction")
        ctx.mesh, ctx.spec, ctx.partition_spec = mesh, spec, tuple(partition_spec)
        return _constrain(torch_tensor, mesh, spec, partition_spec)

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        if grad_output is None:
            return None, None, None
        return _constrain(grad_output, ctx.mesh, ctx.spec, ctx.partition_spec), None, None


# -- the eager forms of the other hints --------------------------------------------------------------


def annotate_custom_sharding(t: torch.Tensor, mesh: Mesh, partition_spec: PartitionSpec) -> XLAShardedTensor:
    """``xs.annotate_custom_sharding`` on a tensor with data: it holds its value constrained, its data stays."""
    mesh, spec = sharding_on(t, mesh, partition_spec, "annotate_custom_sharding")
    load_ops()
    _seam.engine().record_into(torch.ops.pjrt.sharding_constraint.default, (t, spec.to_hlo()), [t])
    describe(t, mesh.mesh_shape, partition_spec)  # type: ignore[arg-type]
    return t  # type: ignore[return-value]


def shard_as(a: Any, b: Any) -> tuple[Any, Any]:
    """``xs.shard_as``: each pair of corresponding tensors of the trees ``a`` and ``b`` through ``shard_alike``."""
    a_flat, a_spec = tree_flatten(a)
    b_flat, b_spec = tree_flatten(b)
    if a_spec != b_spec:
        raise ValueError(f"shard_as needs two trees of the same structure, got {a_spec} and {b_spec}")
    a_out, b_out = [], []
    for x, y in zip(a_flat, b_flat):
        if x is None or y is None:
            if x is not None or y is not None:
                raise ValueError("shard_as: a None in one tree must be None in the other too")
        else:
            for z in (x, y):
                if not is_traced(z):
                    unwrap(z)
            if x.shape != y.shape:
                raise ShardingError(f"shard_as pairs tensors of one shape, got {tuple(x.shape)} and {tuple(y.shape)}")
            x, y = load_ops().shard_alike(x, y)
        a_out.append(x)
        b_out.append(y)
    return tree_unflatten(a_out, a_spec), tree_unflatten(b_out, b_spec)


def optimization_barrier_(tensors: Sequence[torch.Tensor]) -> None:
    """``xm.optimization_barrier_`` on tensors with data: each holds its value through the barrier (autograd
    does not see the change, as in PyTorch/XLA)."""
    tensors = list(tensors)
    for t in tensors:
        unwrap(t)
    if tensors:
        load_ops()
        _seam.engine().record_into(torch.ops.pjrt.optimization_barrier.default, (tensors,), tensors)


def apply_backward_optimization_barrier(m: torch.nn.Module) -> None:
    """Put an optimization barrier on ``m``'s parameter and input gradients when its backward pass runs.

    A full backward hook, as PyTorch/XLA's: XLA then cannot fuse this module's backward pass
    with the others, which keeps it from allocating huge buffers to synchronize the gradients.
    FSDPv2 applies it to the module it wraps. The numbers are unchanged.

    Example::

        xs.apply_backward_optimization_barrier(model.layers[0])
    """
    m.register_full_backward_hook(_backward_optimization_barrier)


def _backward_optimization_barrier(module: torch.nn.Module, grad_input: Any, grad_output: Any) -> None:
    gradients = [p.grad for p in module.parameters() if isinstance(p.grad, XLAShardedTensor)]
    gradients += [g for g in grad_input if isinstance(g, XLAShardedTensor)]
    traced = [g for g in gradients if is_traced(g)]  # AOTAutograd tracing the backward pass (torch.compile)
    if traced:
        for gradient, result in zip(traced, load_ops().optimization_barrier(traced)):
            gradient.copy_(result)
    gradients = [g for g in gradients if not is_traced(g)]
    if gradients:
        optimization_barrier_(gradients)
