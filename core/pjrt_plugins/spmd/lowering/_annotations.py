"""Operators that only guide the compiler: a sharding constraint, "shard these alike", an optimization barrier.

They are ``torch.library`` operators (``pjrt::sharding_constraint``, ``pjrt::shard_alike``,
``pjrt::optimization_barrier``) so that eager code records them like any operator and ``torch.compile``
traces them into its graph without a break; the values pass through unchanged. Lowered here to the
``@Sharding`` custom call the SPMD partitioner reads, and to StableHLO's ``optimization_barrier``.

``pjrt::sharding_hint(t, sharding)`` returns nothing: the graph uses ``t`` constrained from that node on
(the lowering rebinds ``t``, see ``REBINDING_OPS``). It is ``mark_sharding`` inside a compiled graph: an
in-place annotation that neither autograd nor functionalization sees, as PyTorch/XLA's is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy
from jaxlib.mlir.dialects import stablehlo as hlo

from ._collectives import refuse_mark_in_region
from ._emitter import Emitter, TensorValue
from ._table import REBINDING_OPS, lowers

__all__ = ["OPTIMIZATION_BARRIER", "SHARDING_CONSTRAINT", "SHARDING_HINT", "SHARD_ALIKE"]

_library = torch.library.Library("pjrt", "FRAGMENT")  # kept alive: dropping it unregisters the ops
_library.define("sharding_constraint(Tensor x, str sharding) -> Tensor")
_library.define("shard_alike(Tensor x, Tensor y) -> (Tensor, Tensor)")
_library.define("optimization_barrier(Tensor[] tensors) -> Tensor[]")
_library.define("sharding_hint(Tensor t, str sharding) -> ()")
SHARDING_CONSTRAINT = torch.ops.pjrt.sharding_constraint.default
SHARD_ALIKE = torch.ops.pjrt.shard_alike.default
OPTIMIZATION_BARRIER = torch.ops.pjrt.optimization_barrier.default
SHARDING_HINT = torch.ops.pjrt.sharding_hint.default
# Kept by every dead-code elimination (torch.fx's, AOTAutograd's, ours) although nothing uses its result.
torch.fx.node.has_side_effect(SHARDING_HINT)
REBINDING_OPS.add(SHARDING_HINT)


# -- kernels: every value passes through (a copy: operators return new tensors) ---------------------


def _sharding_constraint(x: torch.Tensor, sharding: str) -> torch.Tensor:
    return x.clone()


def _shard_alike(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.clone(), y.clone()


def _optimization_barrier(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]


def _sharding_hint(t: torch.Tensor, sharding: str) -> None:
    return None


for _name, _kernel in (("sharding_constraint", _sharding_constraint), ("shard_alike", _shard_alike),
                       ("optimization_barrier", _optimization_barrier), ("sharding_hint", _sharding_hint)):
    # The CPU and meta kernels (meta: what torch.compile and the tracer infer shapes with). pjrt tensors reach
    # the engine through their __torch_dispatch__ before any kernel, and are recorded and lowered below.
    _library.impl(_name, _kernel, "CompositeExplicitAutograd")


def _pass_gradient(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    return grad, None


def _pass_gradients(ctx: object, grad_x: torch.Tensor, grad_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return grad_x, grad_y


def _pass_gradient_list(ctx: object, grads: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor]]:
    return (list(grads),)


def _no_context(ctx: object, inputs: tuple, output: object) -> None:
    return None


# The gradient of a pass-through is the output's gradient. (A constraint on the gradient as well is
# MarkShardingFunction's job, in the frontend.)
torch.library.register_autograd("pjrt::sharding_constraint", _pass_gradient, setup_context=_no_context)
torch.library.register_autograd("pjrt::shard_alike", _pass_gradients, setup_context=_no_context)
torch.library.register_autograd("pjrt::optimization_barrier", _pass_gradient_list, setup_context=_no_context)


# -- lowerings ----------------------------------------------------------------------------------------


@lowers(SHARDING_CONSTRAINT)
def _lower_sharding_constraint(em: Emitter, out: torch.Tensor, x: TensorValue, sharding: str) -> TensorValue:
    if em.options.num_partitions == 1:
        return x
    refuse_mark_in_region(em, x, sharding)
    return em.constrain(x, sharding)


@lowers(SHARDING_HINT)
def _lower_sharding_hint(em: Emitter, out: None, t: TensorValue, sharding: str) -> TensorValue:
    """``t`` constrained: what the nodes after this one use for ``t`` (see ``REBINDING_OPS``)."""
    return _lower_sharding_constraint(em, out, t, sharding)


@lowers(SHARD_ALIKE)
def _lower_shard_alike(em: Emitter, out: tuple, x: TensorValue, y: TensorValue) -> tuple[TensorValue, TensorValue]:
    """Both values in one shard group (JAX's ``shard_alike`` under GSPMD): the partitioner gives them one sharding."""
    if em.options.num_partitions == 1:
        return x, y
    group = em.shard_groups
    em.shard_groups += 1
    if em.sdy_plan is not None:  # Shardy: both values in one sdy.sharding_group
        for v in (x, y):
            sdy.ShardingGroupOp(v.value, group)
        return x, y
    spec = f"{{unknown shard_as {group}}}"
    return _shard_group_member(x, spec), _shard_group_member(y, spec)


def _shard_group_member(x: TensorValue, spec: str) -> TensorValue:
    """GSPMD's form of a shard group: a ``@Sharding`` custom call with the group, kept although its result may
    look unused."""
    op = hlo.CustomCallOp([x.value.type], [x.value], "Sharding", has_side_effect=True)
    op.attributes["mhlo.sharding"] = ir.StringAttr.get(spec)
    return TensorValue(op.results[0], x.shape, x.dtype)


@lowers(OPTIMIZATION_BARRIER)
def _lower_optimization_barrier(em: Emitter, out: list, tensors: Sequence[TensorValue]) -> tuple[TensorValue, ...]:
    if not tensors:
        return ()
    op = hlo.OptimizationBarrierOp([t.value for t in tensors])
    return tuple(TensorValue(result, t.shape, t.dtype) for result, t in zip(op.results, tensors))
