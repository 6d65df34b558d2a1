"""Manual-sharding regions and their collectives as ops (``pjrt::full_to_shard``, ``pjrt::all_reduce``, ...),
their gradients, and their lowering to XLA's ``SPMDFullToShardShape`` / ``SPMDShardToFullShape`` custom calls
and StableHLO collectives.

Inside a region each device runs the program on its own shard (its values carry ``{manual}``, the partitioner
leaves them alone). Collectives name devices by their ids in the mesh (XLA's partition ids) in replica groups,
with a channel handle and global device ids, as the SPMD partitioner expects of collectives in manual code.
The user-facing checks are made where the ops are called (``spmd/collectives.py``); the lowering refuses a
collective whose operand is not a value of a region, so XLA never sees one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as hlo

from ...errors import ShardingError
from ..sharding import OpSharding, ShardingType, parse_sharding
from ._emitter import Emitter, TensorValue
from ._mlir import tensor_type
from ._table import lowers, meta_rule

__all__ = [
    "ALL_GATHER",
    "ALL_REDUCE",
    "ALL_TO_ALL",
    "COLLECTIVES",
    "COLLECTIVE_PERMUTE",
    "FULL_TO_SHARD",
    "REDUCE_KINDS",
    "REDUCE_SCATTER",
    "SHARD_TO_FULL",
    "replication_groups",
]

_library = torch.library.Library("pjrt", "FRAGMENT")  # kept alive: dropping it unregisters the ops
_library.define("full_to_shard(Tensor x, str sharding, int num_devices) -> Tensor")
_library.define("shard_to_full(Tensor x, str sharding, int[] full_shape, int num_devices) -> Tensor")
_library.define("all_reduce(Tensor x, str reduce_type, float scale, int[] groups, int group_size) -> Tensor")
_library.define("all_gather(Tensor x, int dim, int[] groups, int group_size) -> Tensor")
_library.define("reduce_scatter(Tensor x, str reduce_type, float scale, int dim, int[] groups, int group_size) "
                "-> Tensor")
_library.define("all_to_all(Tensor x, int split_dimension, int concat_dimension, int[] groups, int group_size) "
                "-> Tensor")
_library.define("collective_permute(Tensor x, int[] pairs) -> Tensor")

FULL_TO_SHARD = torch.ops.pjrt.full_to_shard.default
SHARD_TO_FULL = torch.ops.pjrt.shard_to_full.default
ALL_REDUCE = torch.ops.pjrt.all_reduce.default
ALL_GATHER = torch.ops.pjrt.all_gather.default
REDUCE_SCATTER = torch.ops.pjrt.reduce_scatter.default
ALL_TO_ALL = torch.ops.pjrt.all_to_all.default
COLLECTIVE_PERMUTE = torch.ops.pjrt.collective_permute.default
#: The ops that communicate between the devices of a region (their operand must be a value of one).
COLLECTIVES = frozenset({ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, COLLECTIVE_PERMUTE})
#: ``reduce_type`` (PyTorch/XLA's ``xm.REDUCE_*`` strings) -> the StableHLO op combining two values.
REDUCE_KINDS = {"sum": hlo.add, "mul": hlo.multiply, "and": hlo.and_, "or": hlo.or_, "min": hlo.minimum,
                "max": hlo.maximum}
#: XLA's channel type for collectives between devices (``DEVICE_TO_DEVICE``).
_DEVICE_TO_DEVICE = 1


def replication_groups(sharding: OpSharding, num_devices: int) -> list[list[int]]:
    """The groups of devices holding the same tile under ``sharding`` (empty when each tile has one holder).

    >>> replication_groups(OpSharding.from_partition_spec((2, 2), range(4), (0, None)), 4)
    [[0, 1], [2, 3]]
    """
    if sharding.type is ShardingType.REPLICATED:
        return [list(range(num_devices))] if num_devices > 1 else []
    if sharding.type is ShardingType.PARTIAL:
        size = sharding.tile_shape[-1]
        return [list(sharding.devices[i:i + size]) for i in range(0, len(sharding.devices), size)]
    return []


def _groups(flat: Sequence[int], size: int) -> list[list[int]]:
    return [list(flat[i:i + size]) for i in range(0, len(flat), size)]


# -- shapes (meta kernels) ----------------------------------------------------------------------


def _full_to_shard_meta(x: torch.Tensor, sharding: str, num_devices: int) -> torch.Tensor:
    return x.new_empty(parse_sharding(sharding).shard_shape(tuple(x.shape)))


def _shard_to_full_meta(x: torch.Tensor, sharding: str, full_shape: list[int], num_devices: int) -> torch.Tensor:
    return x.new_empty(tuple(full_shape))


def _all_reduce_meta(x: torch.Tensor, reduce_type: str, scale: float, groups: list[int],
                     group_size: int) -> torch.Tensor:
    return torch.empty_like(x)


def _all_gather_meta(x: torch.Tensor, dim: int, groups: list[int], group_size: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] *= group_size
    return x.new_empty(shape)


def _reduce_scatter_meta(x: torch.Tensor, reduce_type: str, scale: float, dim: int, groups: list[int],
                         group_size: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[dim] //= group_size
    return x.new_empty(shape)


def _all_to_all_meta(x: torch.Tensor, split_dimension: int, concat_dimension: int, groups: list[int],
                     group_size: int) -> torch.Tensor:
    shape = list(x.shape)
    shape[split_dimension] //= group_size
    shape[concat_dimension] *= group_size
    return x.new_empty(shape)


def _collective_permute_meta(x: torch.Tensor, pairs: list[int]) -> torch.Tensor:
    return torch.empty_like(x)


for _op, _meta in ((FULL_TO_SHARD, _full_to_shard_meta), (SHARD_TO_FULL, _shard_to_full_meta),
                   (ALL_REDUCE, _all_reduce_meta), (ALL_GATHER, _all_gather_meta),
                   (REDUCE_SCATTER, _reduce_scatter_meta), (ALL_TO_ALL, _all_to_all_meta),
                   (COLLECTIVE_PERMUTE, _collective_permute_meta)):
    meta_rule(_op)(_meta)
    _library.impl(_op._opname, _meta, "Meta")


# -- gradients -----------------------------------------------------------------------------------
# A region's global input is copied to the devices of each replication group and its global output is
# the (equal) copies of those devices: the adjoints sum over a group and share a gradient among it, so
# with all_reduce's adjoint being all_reduce (torch's convention) the gradients are the global ones.


def _save_inputs(ctx: Any, inputs: tuple, output: Any) -> None:
    ctx.args = inputs[1:]
    ctx.shape = tuple(inputs[0].shape)


def _full_to_shard_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    sharding, num_devices = ctx.args
    groups = replication_groups(parse_sharding(sharding), num_devices)
    if groups:  # each copy of a replicated input contributed: sum them
        grad = ALL_REDUCE(grad, "sum", 1.0, [d for g in groups for d in g], len(groups[0]))
    return SHARD_TO_FULL(grad, sharding, list(ctx.shape), num_devices), None, None


def _shard_to_full_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    sharding, _, num_devices = ctx.args
    local = FULL_TO_SHARD(grad, sharding, num_devices)
    groups = replication_groups(parse_sharding(sharding), num_devices)
    if groups:  # the output is the copies' common value: each copy gets its share of the gradient
        local = local / len(groups[0])
    return local, None, None, None


def _refuse_gradient(what: str, reduce_type: str) -> None:
    if reduce_type != "sum":
        raise RuntimeError(f"{what} with reduce_type {reduce_type!r} is not differentiable (only 'sum' is, as in "
                           "torch's functional collectives); detach its input or reduce with 'sum'")


def _all_reduce_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    reduce_type, scale, groups, group_size = ctx.args
    _refuse_gradient("all_reduce", reduce_type)
    return ALL_REDUCE(grad, "sum", scale, groups, group_size), None, None, None, None


def _all_gather_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    dim, groups, group_size = ctx.args
    return REDUCE_SCATTER(grad, "sum", 1.0, dim, groups, group_size), None, None, None


def _reduce_scatter_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    reduce_type, scale, dim, groups, group_size = ctx.args
    _refuse_gradient("reduce_scatter", reduce_type)
    gathered = ALL_GATHER(grad, dim, groups, group_size)
    return (gathered * scale if scale != 1.0 else gathered), None, None, None, None, None


def _all_to_all_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    split_dimension, concat_dimension, groups, group_size = ctx.args
    return ALL_TO_ALL(grad, concat_dimension, split_dimension, groups, group_size), None, None, None, None


def _collective_permute_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    (pairs,) = ctx.args
    inverse = [d for i in range(0, len(pairs), 2) for d in (pairs[i + 1], pairs[i])]
    return COLLECTIVE_PERMUTE(grad, inverse), None


for _op, _backward in ((FULL_TO_SHARD, _full_to_shard_backward), (SHARD_TO_FULL, _shard_to_full_backward),
                       (ALL_REDUCE, _all_reduce_backward), (ALL_GATHER, _all_gather_backward),
                       (REDUCE_SCATTER, _reduce_scatter_backward), (ALL_TO_ALL, _all_to_all_backward),
                       (COLLECTIVE_PERMUTE, _collective_permute_backward)):
    torch.library.register_autograd(f"pjrt::{_op._opname}", _backward, setup_context=_save_inputs, lib=_library)


# -- lowering ------------------------------------------------------------------------------------


def _partitioned(em: Emitter) -> bool:
    return em.options.num_partitions > 1


def _custom_call(x: TensorValue, target: str, sharding: str, shape: Sequence[int]) -> TensorValue:
    op = hlo.CustomCallOp([tensor_type(tuple(shape), x.dtype)], [x.value], target)
    op.attributes["mhlo.sharding"] = ir.StringAttr.get(sharding)
    return TensorValue(op.results[0], tuple(shape), x.dtype)


@lowers(FULL_TO_SHARD)
def _full_to_shard(em: Emitter, out: torch.Tensor, x: TensorValue, sharding: str, num_devices: int) -> TensorValue:
    if not _partitioned(em):
        return x
    pinned = _custom_call(x, "Sharding", sharding, x.shape)
    return _custom_call(pinned, "SPMDFullToShardShape", "{manual}", tuple(out.shape))


@lowers(SHARD_TO_FULL)
def _shard_to_full(em: Emitter, out: torch.Tensor, x: TensorValue, sharding: str, full_shape: list[int],
                   num_devices: int) -> TensorValue:
    if not _partitioned(em):
        return x
    _refuse_outside_region(x, "disable_manual_sharding")
    pinned = _custom_call(x, "Sharding", "{manual}", x.shape)
    return _custom_call(pinned, "SPMDShardToFullShape", sharding, tuple(full_shape))


def _replica_groups(groups: Sequence[int], group_size: int) -> ir.DenseIntElementsAttr:
    array = np.asarray(list(groups), dtype=np.int64).reshape(-1, group_size)
    return ir.DenseIntElementsAttr.get(np.ascontiguousarray(array))


def _channel() -> Any:
    return hlo.ChannelHandle.get(1, _DEVICE_TO_DEVICE)


def _reducer(op: Any, reduce_type: str, dtype: torch.dtype) -> None:
    """Fill ``op``'s region with the scalar computation combining two values."""
    scalar = tensor_type((), dtype)
    block = op.regions[0].blocks.append(scalar, scalar)
    with ir.InsertionPoint(block):
        hlo.return_([REDUCE_KINDS[reduce_type](block.arguments[0], block.arguments[1])])


def _scaled(em: Emitter, x: TensorValue, scale: float) -> TensorValue:
    return x if scale == 1.0 else em.mul(x, em.constant(scale, x.dtype, x.shape))


@lowers(ALL_REDUCE)
def _all_reduce(em: Emitter, out: torch.Tensor, x: TensorValue, reduce_type: str, scale: float,
                groups: list[int], group_size: int) -> TensorValue:
    if not _partitioned(em):
        return _scaled(em, x, scale)
    _refuse_outside_region(x, "all_reduce")
    if reduce_type in ("and", "or") and x.dtype != torch.bool:
        return _bitwise_all_reduce(em, x, reduce_type, groups, group_size)
    op = hlo.AllReduceOp([x.value.type], [x.value], _replica_groups(groups, group_size), channel_handle=_channel(),
                         use_global_device_ids=True)
    _reducer(op, reduce_type, x.dtype)
    return _scaled(em, TensorValue(op.results[0], x.shape, x.dtype), scale)


def _bitwise_all_reduce(em: Emitter, x: TensorValue, reduce_type: str, groups: list[int],
                        group_size: int) -> TensorValue:
    """A bitwise AND / OR of integers over each group, as an all-gather and a local fold: XLA's all-reduce
    combines booleans with them, but not every backend integers (the CPU one refuses)."""
    stacked = em.reshape(x, (1, *x.shape))
    shape = (group_size, *x.shape)
    op = hlo.AllGatherOp([tensor_type(shape, x.dtype)], [stacked.value], 0, _replica_groups(groups, group_size),
                         channel_handle=_channel(), use_global_device_ids=True)
    gathered = TensorValue(op.results[0], shape, x.dtype)
    rest = [0] * x.rank
    pieces = [em.reshape(em.slice(gathered, [i, *rest], [i + 1, *x.shape], [1] * len(shape)), x.shape)
              for i in range(group_size)]
    result = pieces[0]
    for piece in pieces[1:]:
        result = em.binary(REDUCE_KINDS[reduce_type], result, piece)
    return result


@lowers(ALL_GATHER)
def _all_gather(em: Emitter, out: torch.Tensor, x: TensorValue, dim: int, groups: list[int],
                group_size: int) -> TensorValue:
    if not _partitioned(em):
        return x
    _refuse_outside_region(x, "all_gather")
    shape = tuple(out.shape)
    op = hlo.AllGatherOp([tensor_type(shape, x.dtype)], [x.value], dim, _replica_groups(groups, group_size),
                         channel_handle=_channel(), use_global_device_ids=True)
    return TensorValue(op.results[0], shape, x.dtype)


@lowers(REDUCE_SCATTER)
def _reduce_scatter(em: Emitter, out: torch.Tensor, x: TensorValue, reduce_type: str, scale: float, dim: int,
                    groups: list[int], group_size: int) -> TensorValue:
    if not _partitioned(em):
        return _scaled(em, x, scale)
    _refuse_outside_region(x, "reduce_scatter")
    shape = tuple(out.shape)
    op = hlo.ReduceScatterOp(tensor_type(shape, x.dtype), x.value, dim, _replica_groups(groups, group_size),
                             channel_handle=_channel(), use_global_device_ids=True)
    _reducer(op, reduce_type, x.dtype)
    return _scaled(em, TensorValue(op.results[0], shape, x.dtype), scale)


@lowers(ALL_TO_ALL)
def _all_to_all(em: Emitter, out: torch.Tensor, x: TensorValue, split_dimension: int, concat_dimension: int,
                groups: list[int], group_size: int) -> TensorValue:
    if not _partitioned(em):
        return x
    _refuse_outside_region(x, "all_to_all")
    op = hlo.AllToAllOp([x.value], split_dimension, concat_dimension, group_size,
                        _replica_groups(groups, group_size), channel_handle=_channel())
    return TensorValue(op.results[0], tuple(out.shape), x.dtype)


@lowers(COLLECTIVE_PERMUTE)
def _collective_permute(em: Emitter, out: torch.Tensor, x: TensorValue, pairs: list[int]) -> TensorValue:
    if not _partitioned(em):
        sends_to_itself = any(pairs[i] == pairs[i + 1] == 0 for i in range(0, len(pairs), 2))
        return x if sends_to_itself else em.constant(0, x.dtype, x.shape)
    _refuse_outside_region(x, "collective_permute")
    table = np.ascontiguousarray(np.asarray(list(pairs), dtype=np.int64).reshape(-1, 2))
    op = hlo.CollectivePermuteOp(x.value, ir.DenseIntElementsAttr.get(table), channel_handle=_channel())
    return TensorValue(op.results[0], x.shape, x.dtype)


# -- the guard: collectives only on values of a region -------------------------------------------


def _refuse_outside_region(x: TensorValue, what: str) -> None:
    """Raise :class:`ShardingError` unless ``x`` derives from a region's input (``SPMDFullToShardShape``) or a
    ``{manual}`` argument, without leaving the region (``SPMDShardToFullShape``) on the way.

    XLA would reject such a program with an internal error, or worse; ``spmd/collectives.py`` checks the same
    where the op is called, this catches what reaches the lowering another way.
    """
    if not in_manual_region(x.value):
        raise ShardingError(f"{what} is a collective of a manual-sharding region, but its operand is not a value "
                            "of one: make it from xs.enable_manual_sharding(...)'s result (and call "
                            "xs.disable_manual_sharding only after the collective)")


def refuse_mark_in_region(em: Emitter, x: TensorValue, spec: OpSharding | str) -> None:
    """Raise :class:`ShardingError` for a sharding mark ``spec`` on a value of a manual-sharding region, which XLA
    would answer by aborting the process (``hlo_sharding.cc Check failed: !IsManual()``): such a value is one
    device's own shard, which no partitioner lays out. ``{manual}`` itself is what the value is, and passes."""
    if not em.has_manual_regions:
        return
    manual = spec.is_manual if isinstance(spec, OpSharding) else parse_sharding(spec).is_manual
    if not manual and in_manual_region(x.value):
        raise ShardingError("mark_sharding on a value of a manual-sharding region: inside the region each device "
                            "holds its own shard and the partitioner lays nothing out; mark the tensor before "
                            "xs.enable_manual_sharding or after xs.disable_manual_sharding")


def in_manual_region(value: ir.Value) -> bool:
    """Whether ``value`` is a value of a manual-sharding region: it derives from a region's input
    (``SPMDFullToShardShape``) or a ``{manual}`` argument without leaving the region on the way."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if isinstance(v, ir.BlockArgument):
            parent = v.owner.owner
            if parent is not None and parent.operation.name == "func.func" and "arg_attrs" in parent.attributes:
                attrs = ir.DictAttr(ir.ArrayAttr(parent.attributes["arg_attrs"])[v.arg_number])
                if "mhlo.sharding" in attrs and parse_sharding(ir.StringAttr(attrs["mhlo.sharding"]).value).is_manual:
                    return True
            continue
        op = v.owner.operation
        if op.name == "stablehlo.custom_call":
            target = ir.StringAttr(op.attributes["call_target_name"]).value
            if target == "SPMDFullToShardShape":
                return True
            if target == "SPMDShardToFullShape":
                continue
        stack.extend(op.operands)
    return False
