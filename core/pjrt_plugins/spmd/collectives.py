"""Manual sharding and explicit collectives (JAX's ``shard_map`` idea), with PyTorch/XLA's names.

``enable_manual_sharding`` turns a tensor into the shard each device holds; code on it then runs on every
device on its own shard, with the collectives here (``all_reduce``, ``all_gather``, ``reduce_scatter``,
``all_to_all``, ``collective_permute``; ``xm.*``'s signatures) moving data between devices, until
``disable_manual_sharding`` assembles the global tensor again. Every argument is checked here, before
anything is recorded, so XLA never sees a wrong program. Never imports the engine at import time (the
region's ops live in the lowering, loaded through the frontend's seam).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ManualShardingError, ShardingError
from .devices import get_global_mesh, virtual_device
from .frontend import engine, mark_sharding, unwrap
from .sharding import Mesh, OpSharding, PartitionSpec

logger = logging.getLogger(__name__)

__all__ = [
    "REDUCE_AND",
    "REDUCE_MAX",
    "REDUCE_MIN",
    "REDUCE_MUL",
    "REDUCE_OR",
    "REDUCE_SUM",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "collective_permute",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "reduce_scatter",
]

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"
_REDUCE_TYPES = (REDUCE_SUM, REDUCE_MUL, REDUCE_AND, REDUCE_OR, REDUCE_MIN, REDUCE_MAX)


# -- entering and leaving a region ---------------------------------------------------------------


def enable_manual_sharding(t: torch.Tensor, partition_spec: PartitionSpec, *, mesh: Mesh | None = None) -> torch.Tensor:
    """Enter a manual-sharding region: ``t`` is split by ``partition_spec`` and each device gets its shard.

    ``t`` is marked with the sharding in place (``mark_sharding``, as PyTorch/XLA does); the result
    is each device's shard, of the shard shape, whose sharding is ``{manual}``: ops on it run on every
    device on its own shard, the partitioner inserts no communication, and the collectives of this
    module move data between the devices. End the region with :func:`disable_manual_sharding`.
    ``mesh`` defaults to the global mesh (:func:`set_global_mesh`). Each dimension must split evenly.
    Differentiable: the gradient of ``t`` is the global one (copies of a replicated dimension add up).

    Example (8 devices)::

        mesh = xs.Mesh(range(8), (8,), ("x",))
        x = torch.arange(32.0).reshape(16, 2).to("pjrt")
        local = xs.enable_manual_sharding(x, ("x", None), mesh=mesh)   # shape (2, 2) on each device
        total = xm.all_reduce(xm.REDUCE_SUM, local)                     # the sum of the 8 shards
        out = xs.disable_manual_sharding(total, (None, None), (2, 2), mesh=mesh)
    """
    mesh = _mesh(mesh, "enable_manual_sharding")
    data = unwrap(t)
    if engine().in_manual_region(data):
        raise ManualShardingError(
            "enable_manual_sharding: the tensor is already a value of a manual-sharding region (one value per "
            "device); regions do not nest. Leave the region with disable_manual_sharding first")
    spec = mesh.get_op_sharding(partition_spec, rank=t.dim())
    _check_even(t.shape, spec, partition_spec, "enable_manual_sharding")
    mark_sharding(t, mesh, partition_spec)
    local = torch.ops.pjrt.full_to_shard(t, spec.to_hlo(), virtual_device().num_devices)
    local_data = unwrap(local)
    local_data.annotation = OpSharding.manual()
    local_data.mark = (mesh, tuple(partition_spec))
    logger.debug("entered a manual region: %s -> %s", tuple(t.shape), tuple(local.shape))
    return local


def disable_manual_sharding(t: torch.Tensor, partition_spec: PartitionSpec, full_shape: Sequence[int], *,
                            mesh: Mesh | None = None) -> torch.Tensor:
    """Leave a manual-sharding region: each device's value of ``t`` is its shard of a tensor of ``full_shape``.

    ``partition_spec`` says where each device's value goes, as for :func:`enable_manual_sharding`;
    along the mesh axes it leaves unused the devices must hold equal values (the result is that common
    value). The result is an ordinary sharded tensor of ``full_shape`` (its ``sharding_spec`` is the
    partition spec's), which the partitioner handles again. Differentiable.

    Example (8 devices)::

        local = xs.enable_manual_sharding(x, ("x", None), mesh=mesh)   # x: (16, 2)
        y = xs.disable_manual_sharding(local * 2, ("x", None), x.shape, mesh=mesh)   # (16, 2), 2 * x
    """
    mesh = _mesh(mesh, "disable_manual_sharding")
    data = unwrap(t)
    try:
        full = tuple(int(s) for s in full_shape)
    except TypeError:
        raise TypeError(f"disable_manual_sharding: full_shape must be a sequence of ints, got {full_shape!r}") from None
    spec = mesh.get_op_sharding(partition_spec, rank=len(full))
    _check_even(full, spec, partition_spec, "disable_manual_sharding")
    expected = spec.shard_shape(full)
    if tuple(t.shape) != expected:
        raise ShardingError(
            f"disable_manual_sharding: a tensor of full shape {list(full)} split by partition spec "
            f"{tuple(partition_spec)} leaves each device a shard of shape {list(expected)}, but the tensor has "
            f"shape {list(t.shape)}; pass the full shape the shards make up")
    if not engine().in_manual_region(data):
        raise ManualShardingError(
            "disable_manual_sharding: the tensor is not a value of a manual-sharding region; only values made "
            "from enable_manual_sharding's result (or collectives on them) can leave one")
    out = torch.ops.pjrt.shard_to_full(t, spec.to_hlo(), list(full), virtual_device().num_devices)
    out_data = unwrap(out)
    out_data.annotation = spec
    out_data.mark = (mesh, tuple(partition_spec))
    return out


def _mesh(mesh: Mesh | None, what: str) -> Mesh:
    mesh = mesh if mesh is not None else get_global_mesh()
    if mesh is None:
        raise ShardingError(f"{what} needs a mesh: pass mesh=... or set one with xs.set_global_mesh(mesh)")
    if not isinstance(mesh, Mesh):
        raise TypeError(f"{what}: mesh must be an xs.Mesh, got {type(mesh).__name__}")
    return mesh


def _check_even(shape: Sequence[int], spec: OpSharding, partition_spec: PartitionSpec, what: str) -> None:
    for dim, (size, tiles) in enumerate(zip(shape, spec.tiles)):
        if size % tiles:
            raise ShardingError(
                f"{what}: partition spec {tuple(partition_spec)} splits dimension {dim} (size {size}) into {tiles} "
                f"shards, which do not divide it; a manual region needs equal shards (pad the dimension to a "
                f"multiple of {tiles})")


# -- checks shared by the collectives ------------------------------------------------------------


def _region_value(value: Any, what: str) -> torch.Tensor:
    """``value`` if it is a value of a manual-sharding region, else a clear error."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} expects a tensor, got {type(value).__name__}")
    data = unwrap(value)
    if not engine().in_manual_region(data):
        raise ManualShardingError(
            f"{what} is a collective of a manual-sharding region and works on each device's own value, but this "
            f"tensor (shape {list(value.shape)}) is not a value of a region: outside one the partitioner moves the "
            "data itself. Make the input with xs.enable_manual_sharding(t, partition_spec, mesh=...) and call "
            f"{what} before xs.disable_manual_sharding(...)")
    if value.dtype.is_complex:
        raise TypeError(f"{what} does not take complex tensors ({value.dtype}); split them with torch.view_as_real")
    return value


def _replica_groups(groups: Any, what: str) -> tuple[list[int], int]:
    """``groups`` (PyTorch/XLA's list of lists of device ids, or None for all devices) checked to be a partition of
    the devices into groups of one size; returns the groups flattened and their size."""
    n = virtual_device().num_devices
    if groups is None or (isinstance(groups, (list, tuple)) and len(groups) == 0):
        return list(range(n)), n
    if not isinstance(groups, (list, tuple)) or not all(isinstance(g, (list, tuple)) for g in groups):
        raise ShardingError(f"{what}: groups must be a list of lists of device ids, e.g. [[0, 1, 2, 3], [4, 5, 6, 7]]; "
                            f"got {groups!r}")
    flat: list[int] = []
    for group in groups:
        for d in group:
            if isinstance(d, bool) or not isinstance(d, int):
                raise ShardingError(f"{what}: device ids in groups must be ints, got {d!r} in {list(group)}")
            flat.append(int(d))
    sizes = sorted({len(g) for g in groups})
    if sizes[0] == 0:
        raise ShardingError(f"{what}: replica group {[list(g) for g in groups].index([])} is empty")
    if len(sizes) > 1:
        raise ShardingError(f"{what}: replica groups must all have the same size; got sizes "
                            f"{[len(g) for g in groups]} in {[list(g) for g in groups]}")
    outside = sorted({d for d in flat if not 0 <= d < n})
    if outside:
        raise ShardingError(f"{what}: device ids {outside} in groups are out of range; the devices are 0..{n - 1}")
    twice = sorted({d for d in flat if flat.count(d) > 1})
    if twice:
        raise ShardingError(f"{what}: device ids {twice} appear in more than one place of groups; each device "
                            "belongs to exactly one replica group")
    missing = sorted(set(range(n)) - set(flat))
    if missing:
        raise ShardingError(f"{what}: the replica groups must cover every device (a partition of 0..{n - 1}); "
                            f"devices {missing} are in none")
    return flat, sizes[0]


def _dim(dim: Any, rank: int, what: str, name: str = "dim") -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{what}: {name} must be an int, got {dim!r}")
    if not -rank <= dim < rank:
        raise IndexError(f"{what}: {name} {dim} is out of range for a tensor of rank {rank}")
    return dim % rank


def _reduce_type(reduce_type: Any, dtype: torch.dtype, scale: Any, what: str) -> float:
    """Check ``reduce_type`` and ``scale`` for ``dtype``; returns the scale as a float."""
    if reduce_type not in _REDUCE_TYPES:
        raise ValueError(f"{what}: reduce_type must be one of xm.REDUCE_SUM, REDUCE_MUL, REDUCE_AND, REDUCE_OR, "
                         f"REDUCE_MIN, REDUCE_MAX ({list(_REDUCE_TYPES)}), got {reduce_type!r}")
    if reduce_type in (REDUCE_AND, REDUCE_OR) and dtype.is_floating_point:
        raise TypeError(f"{what}: reduce_type {reduce_type!r} combines bits; it takes bool or integer tensors, not "
                        f"{dtype}")
    if reduce_type in (REDUCE_SUM, REDUCE_MUL) and dtype == torch.bool:
        raise TypeError(f"{what}: reduce_type {reduce_type!r} on bool tensors: use REDUCE_OR / REDUCE_AND, or "
                        "convert to an integer dtype first")
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: scale must be a number, got {scale!r}") from None
    if scale != 1.0 and not dtype.is_floating_point:
        raise TypeError(f"{what}: scale {scale} applies to floating-point tensors, not {dtype}")
    return scale


def _global_ids(use_global_device_ids: Any, what: str) -> None:
    if use_global_device_ids is False:
        raise ValueError(f"{what}: collectives in a manual region always name devices by their global ids "
                         "(the mesh's device ids); use_global_device_ids=False is not supported")


def _into(output: Any, result: torch.Tensor, what: str) -> torch.Tensor:
    """``result`` written into ``output`` (PyTorch/XLA's ``output=``), or ``result`` when no output is given."""
    if output is None:
        return result
    if not isinstance(output, torch.Tensor) or tuple(output.shape) != tuple(result.shape):
        shape = list(output.shape) if isinstance(output, torch.Tensor) else type(output).__name__
        raise ShardingError(f"{what}: output has shape {shape}, the result has shape {list(result.shape)}")
    output.copy_(result)
    return output


def _each(value: Any, output: Any, what: str, one: Any) -> Any:
    """``one(tensor, output)`` for a tensor, or for each tensor of a list (with its output, if given)."""
    if isinstance(value, torch.Tensor):
        return one(value, output)
    if isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value):
        if output is not None and (not isinstance(output, (list, tuple)) or len(output) != len(value)):
            raise ShardingError(f"{what}: output must be a list of {len(value)} tensors, like the input")
        return [one(v, output[i] if output is not None else None) for i, v in enumerate(value)]
    raise TypeError(f"{what} expects a tensor or a list of tensors, got {type(value).__name__}")


# -- the collectives ------------------------------------------------------------------------------


def all_reduce(reduce_type: str, inputs: torch.Tensor | list[torch.Tensor], scale: float = 1.0,
               groups: list[list[int]] | None = None, pin_layout: bool = True) -> Any:
    """Reduce each device's value over its replica group; every member gets the result, times ``scale``.

    ``reduce_type`` is one of the ``REDUCE_*`` strings. ``groups`` lists the replica groups as device
    ids (``[[0, 1, 2, 3], [4, 5, 6, 7]]``: a partition of the devices into groups of one size), or
    ``None`` for all devices in one group. Given a tensor, returns the result; given a list, reduces
    each tensor in place and returns the list (as ``xm.all_reduce``). ``pin_layout`` is accepted for
    ported code and has no effect. Differentiable with ``REDUCE_SUM`` (the gradient is the all-reduce
    of the gradients).

    Example (in a region over 8 devices)::

        s = xm.all_reduce(xm.REDUCE_SUM, local)                                # sum over all 8 devices
        m = xm.all_reduce(xm.REDUCE_MAX, local, groups=[[0, 1, 2, 3], [4, 5, 6, 7]])
    """
    what = "all_reduce"
    tensors = [inputs] if isinstance(inputs, torch.Tensor) else inputs
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError(f"{what} expects a tensor or a list of tensors, got {type(inputs).__name__}")
    flat, size = _replica_groups(groups, what)
    results = []
    for t in tensors:
        _region_value(t, what)
        factor = _reduce_type(reduce_type, t.dtype, scale, what)
        results.append(torch.ops.pjrt.all_reduce(t, reduce_type, factor, flat, size))
    if isinstance(inputs, torch.Tensor):
        return results[0]
    for t, r in zip(tensors, results):
        t.copy_(r)
    return inputs


def all_gather(value: torch.Tensor | list[torch.Tensor], dim: int = 0, groups: list[list[int]] | None = None,
               output: Any = None, pin_layout: bool = True, channel_id: int | None = None,
               use_global_device_ids: bool | None = None) -> Any:
    """Concatenate the values of the devices of each replica group along ``dim``, in group order; every member
    gets the whole.

    ``output``, if given, receives the result. ``channel_id`` is chosen by the lowering (ignored);
    device ids are global. Differentiable: the gradient is the reduce-scatter of the gradients.

    Example (in a region over 8 devices, each holding a (2, 4) shard)::

        whole = xm.all_gather(local, dim=0)                                   # (16, 4) on every device
        pairs = xm.all_gather(local, dim=1, groups=[[0, 1], [2, 3], [4, 5], [6, 7]])   # (2, 8)
    """
    what = "all_gather"
    _global_ids(use_global_device_ids, what)
    flat, size = _replica_groups(groups, what)

    def one(t: torch.Tensor, out: Any) -> torch.Tensor:
        _region_value(t, what)
        d = _dim(dim, t.dim(), what)
        return _into(out, torch.ops.pjrt.all_gather(t, d, flat, size), what)

    return _each(value, output, what, one)


def reduce_scatter(reduce_type: str, input: torch.Tensor | list[torch.Tensor], scale: float, scatter_dim: int,
                   shard_count: int, groups: list[list[int]] | None = None, output: Any = None,
                   pin_layout: bool = True, channel_id: int | None = None,
                   use_global_device_ids: bool | None = None) -> Any:
    """Reduce over each replica group and split the result along ``scatter_dim`` into ``shard_count`` pieces:
    the group's ``i``-th device gets piece ``i``, times ``scale``.

    ``shard_count`` must be the size of the replica groups, and divide ``scatter_dim``. Differentiable
    with ``REDUCE_SUM`` (the gradient is the all-gather of the gradients, times ``scale``).

    Example (in a region over 8 devices, each holding an (8, 4) value)::

        piece = xm.reduce_scatter(xm.REDUCE_SUM, local, 1.0, 0, 8)   # (1, 4): row d of the sum, on device d
    """
    what = "reduce_scatter"
    _global_ids(use_global_device_ids, what)
    flat, size = _replica_groups(groups, what)
    if isinstance(shard_count, bool) or not isinstance(shard_count, int) or shard_count != size:
        raise ShardingError(f"{what}: shard_count {shard_count!r} must equal the size of the replica groups ({size})")

    def one(t: torch.Tensor, out: Any) -> torch.Tensor:
        _region_value(t, what)
        factor = _reduce_type(reduce_type, t.dtype, scale, what)
        d = _dim(scatter_dim, t.dim(), what, "scatter_dim")
        if t.shape[d] % size:
            raise ShardingError(f"{what}: dimension {d} (size {t.shape[d]}) does not split into {size} equal "
                                "pieces")
        return _into(out, torch.ops.pjrt.reduce_scatter(t, reduce_type, factor, d, flat, size), what)

    return _each(input, output, what, one)


def all_to_all(value: torch.Tensor, split_dimension: int, concat_dimension: int, split_count: int,
               groups: list[list[int]] | None = None, pin_layout: bool = True) -> torch.Tensor:
    """Split each device's value along ``split_dimension`` into ``split_count`` pieces, send piece ``i`` to the
    group's ``i``-th device, and concatenate what arrives along ``concat_dimension`` (in group order).

    ``split_count`` must be the size of the replica groups, and divide ``split_dimension``.
    Differentiable: the gradient is the all-to-all back (split and concat dimensions swapped).

    Example (in a region over 8 devices, each holding an (8, 2) value)::

        swapped = xm.all_to_all(local, 0, 1, 8)   # (1, 16): row d of every device's value, on device d
    """
    what = "all_to_all"
    _region_value(value, what)
    flat, size = _replica_groups(groups, what)
    if isinstance(split_count, bool) or not isinstance(split_count, int) or split_count != size:
        raise ShardingError(f"{what}: split_count {split_count!r} must equal the size of the replica groups ({size})")
    split = _dim(split_dimension, value.dim(), what, "split_dimension")
    concat = _dim(concat_dimension, value.dim(), what, "concat_dimension")
    if value.shape[split] % size:
        raise ShardingError(f"{what}: split_dimension {split} (size {value.shape[split]}) does not split into "
                            f"{size} equal pieces")
    return torch.ops.pjrt.all_to_all(value, split, concat, flat, size)


def collective_permute(value: torch.Tensor, pairs: Sequence[Sequence[int]]) -> torch.Tensor:
    """Send each device's value along ``pairs`` of ``(source, target)`` device ids; a device no pair targets gets
    zeros.

    Each device sends to at most one target and receives from at most one source. Differentiable:
    the gradient travels the pairs backwards.

    Example (a ring over 8 devices)::

        shifted = xm.collective_permute(local, [[i, (i + 1) % 8] for i in range(8)])
    """
    what = "collective_permute"
    _region_value(value, what)
    n = virtual_device().num_devices
    flat: list[int] = []
    try:
        items = [tuple(p) for p in pairs]
    except TypeError:
        raise ShardingError(f"{what}: pairs must be a list of [source, target] device ids, got {pairs!r}") from None
    for pair in items:
        if len(pair) != 2 or any(isinstance(d, bool) or not isinstance(d, int) for d in pair):
            raise ShardingError(f"{what}: each pair is [source, target] device ids; got {list(pair)!r}")
        if not all(0 <= d < n for d in pair):
            raise ShardingError(f"{what}: pair {list(pair)} names a device out of range; the devices are 0..{n - 1}")
        flat += [int(pair[0]), int(pair[1])]
    for side, ids in (("source", flat[0::2]), ("target", flat[1::2])):
        twice = sorted({d for d in ids if ids.count(d) > 1})
        if twice:
            raise ShardingError(f"{what}: devices {twice} are the {side} of more than one pair; each device sends "
                                "to at most one device and receives from at most one")
    return torch.ops.pjrt.collective_permute(value, flat)
