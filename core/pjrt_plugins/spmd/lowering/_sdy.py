"""Sharding annotations in the module: Shardy's (``sdy.mesh``, ``sdy.sharding``, ``sdy.sharding_constraint``) or
GSPMD's (``mhlo.sharding`` strings and ``@Sharding`` custom calls), one kind per program.

Which kind a program gets is the caller's choice (``LoweringOptions.partitioner``); a program whose
shardings have no Shardy form (see ``sharding.plan_sdy``) keeps GSPMD's, with the reason logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import sdy
from jaxlib.mlir.dialects import stablehlo as hlo

from ...errors import ShardingError
from ..sharding import OpSharding, SdyPlan, parse_sharding, plan_sdy

logger = logging.getLogger(__name__)

class ShardyUnavailable(ShardingError):
    """A sharding met while lowering has no Shardy form on the program's mesh: the program is lowered again for
    GSPMD."""


#: The name of the program's one mesh.
MESH_NAME = "mesh"
PARTITIONERS = ("shardy", "gspmd")


def as_op_sharding(spec: OpSharding | str) -> OpSharding:
    return spec if isinstance(spec, OpSharding) else parse_sharding(spec)


def plan_program(shardings: Iterable[tuple[OpSharding | str, Sequence[int] | None]], num_devices: int,
                 meshes: Sequence[tuple[Sequence[int], Sequence[str] | None, Sequence[int]]]) -> SdyPlan | None:
    """The Shardy plan of a program's shardings (each with the shape it splits, if known), or None (logged) when
    it must keep GSPMD.

    A dimension split unevenly keeps the program on GSPMD: Shardy drops the axes that do not divide it, so the
    compiled program would want its arguments laid out otherwise than marked.
    """
    specs = []
    try:
        for s, shape in shardings:
            spec = as_op_sharding(s)
            _check_even(spec, shape)
            specs.append(spec)
        return plan_sdy(specs, num_devices, meshes)
    except ShardingError as exc:
        logger.info("this program keeps GSPMD shardings: %s", exc)
        return None


def _check_even(spec: OpSharding, shape: Sequence[int] | None) -> None:
    if shape is None or spec.rank is None or spec.rank != len(shape):
        return
    for d, (size, tiles) in enumerate(zip(shape, spec.tiles)):
        if size % tiles:
            raise ShardingError(f"dimension {d} of a {list(shape)} tensor is split unevenly ({size} into {tiles} "
                                f"tiles) by {spec}")


def add_mesh(module: ir.Module, plan: SdyPlan) -> None:
    """Put the program's ``sdy.mesh`` first in the module (inside an active context)."""
    axes = [sdy.MeshAxisAttr.get(name, size) for name, size in plan.mesh.axes]
    mesh = sdy.MeshAttr.get(axes, list(plan.mesh.device_ids or ()))
    with ir.InsertionPoint.at_block_begin(module.body):
        sdy.MeshOp(MESH_NAME, mesh)


def sdy_sharding(plan: SdyPlan, spec: OpSharding | str, rank: int) -> ir.Attribute:
    """``#sdy.sharding<@mesh, [...]>`` of ``spec`` for a tensor of ``rank``: every dimension closed, as mark_sharding
    pins the whole layout (a ``None`` entry of the partition spec is a closed, replicated ``{}``)."""
    try:
        dims = plan.sharding(as_op_sharding(spec)).dim_axes(rank)
    except ShardingError as exc:
        raise ShardyUnavailable(str(exc)) from exc
    return sdy.TensorShardingAttr.get(
        MESH_NAME, [sdy.DimensionShardingAttr.get([sdy.AxisRefAttr.get(a) for a in axes], True) for axes in dims])


def keep_unsplit(value: ir.Value, dims: Sequence[int]) -> ir.Value:
    """``value`` with dimensions ``dims`` pinned unsplit (closed, replicated) and the others left to propagation
    (open): a partial ``sdy.sharding_constraint``, which GSPMD's annotations cannot express."""
    rank = len(ir.RankedTensorType(value.type).shape)
    closed = set(dims)
    attr = sdy.TensorShardingAttr.get(MESH_NAME, [sdy.DimensionShardingAttr.get([], d in closed) for d in range(rank)])
    return sdy.sharding_constraint(value, attr)


def argument_attrs(plan: SdyPlan | None, shardings: Sequence[str], ranks: Sequence[int]) -> ir.ArrayAttr:
    """The arguments' attribute dictionaries: ``sdy.sharding`` with a plan, else ``mhlo.sharding``."""
    if plan is None:
        return ir.ArrayAttr.get([ir.DictAttr.get({"mhlo.sharding": ir.StringAttr.get(s)}) for s in shardings])
    return ir.ArrayAttr.get([ir.DictAttr.get({"sdy.sharding": sdy_sharding(plan, s, r)})
                             for s, r in zip(shardings, ranks)])


def constrain(plan: SdyPlan | None, value: ir.Value, spec: OpSharding | str) -> ir.Value:
    """``value`` pinned to ``spec``: an ``sdy.sharding_constraint`` with a plan, else a ``@Sharding`` custom call."""
    if plan is None:
        op = hlo.CustomCallOp([value.type], [value], "Sharding")
        op.attributes["mhlo.sharding"] = ir.StringAttr.get(str(spec))
        return op.results[0]
    rank = len(ir.RankedTensorType(value.type).shape)
    return sdy.sharding_constraint(value, sdy_sharding(plan, spec, rank))
