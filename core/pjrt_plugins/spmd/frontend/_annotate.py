"""Annotating pjrt tensors: ``mark_sharding`` (declare a sharding, upload each device's shard), ``clear_sharding``
and ``to_device``, with PyTorch/XLA's names and semantics."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from ...errors import ShardingConflictError, SpmdDisabledError
from ..devices import check_mesh_fits, virtual_device
from ..sharding import Mesh, PartitionSpec, ShardingType
from ..transport import TensorState, check_current, upload
from . import _seam
from ._constraints import as_mesh
from ._torch_device import TORCH_DEVICE
from .tensor import XLAShardedTensor, describe, unwrap

logger = logging.getLogger(__name__)

__all__ = ["clear_sharding", "mark_sharding", "to_device", "wrap_as_sharded_tensor", "wrap_if_sharded"]


def mark_sharding(t: torch.Tensor, mesh: Mesh | Sequence[int], partition_spec: PartitionSpec) -> XLAShardedTensor:
    """``xs.mark_sharding`` (documented in ``_traceable``, the module users call) on a tensor with data."""
    data = unwrap(t)
    vd = virtual_device()
    if not vd.spmd:
        raise SpmdDisabledError(
            "mark_sharding needs SPMD mode, which is off (XLA_USE_SPMD=0): the virtual device is a single "
            "device. Call pjrt_plugins.spmd.use_spmd() or set XLA_USE_SPMD=1 before using the pjrt device."
        )
    mesh = as_mesh(mesh)
    check_mesh_fits(mesh, vd)
    spec = mesh.get_op_sharding(partition_spec, rank=t.dim())
    spec.check_devices(vd.device_ids)
    current = data.annotation
    if current == spec:
        data.mark = (mesh, tuple(partition_spec))
        return t  # type: ignore[return-value]
    if current is not None and current.type is not ShardingType.REPLICATED:
        raise ShardingConflictError(
            f"the tensor already has sharding {current}; it cannot be re-marked as {spec}. "
            "Call xs.clear_sharding(t) first (re-marking with the same sharding, or over a replicated one, is allowed)"
        )
    if data.state is TensorState.DEVICE:
        check_current(data, vd)
    data.annotation = spec
    data.mark = (mesh, tuple(partition_spec))
    if data.state is TensorState.LAZY:
        _seam.engine().on_mark_sharding(data)  # pending values exist only where the engine does
    else:
        upload(data, spec)
    logger.debug("marked %r", data)
    return t  # type: ignore[return-value]


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Forget ``t``'s declared sharding (its shards stay where they are); returns ``t``.

    Afterwards ``t`` may be marked with any sharding.

    Example::

        xs.mark_sharding(t, mesh, (0, 1))
        xs.mark_sharding(t, mesh, (1, 0))   # ShardingConflictError: already {devices=[...]...}
        xs.clear_sharding(t)                # t.sharding_spec == ''
        xs.mark_sharding(t, mesh, (1, 0))   # re-shards
    """
    data = unwrap(t)
    data.annotation = None
    data.mark = None
    return t


def to_device(obj: Any) -> Any:
    """Place a CPU tensor or an ``nn.Module``'s parameters and buffers on ``pjrt:0`` (nothing is uploaded).

    The same as ``obj.to("pjrt")``, which also works; returns the tensor or the module.

    Example::

        model = xs.to_device(torch.nn.Linear(4, 2))   # parameters are deferred host data
        model.weight.device                           # device(type='pjrt', index=0)
        model = torch.nn.Linear(4, 2).to("pjrt")      # the same
    """
    if isinstance(obj, torch.nn.Module):
        return obj.to(TORCH_DEVICE)
    if isinstance(obj, torch.Tensor):
        return obj.to(TORCH_DEVICE)
    raise TypeError(f"to_device expects a tensor or an nn.Module, got {type(obj).__name__}")


def wrap_as_sharded_tensor(
    t: torch.Tensor, mesh_shape: Sequence[int] | None = None, partition_spec: PartitionSpec | None = None
) -> XLAShardedTensor:
    """``t`` as an :class:`XLAShardedTensor` (PyTorch/XLA's ``xla_sharding.wrap_as_sharded_tensor``).

    Every tensor on ``pjrt`` already is one and is returned as is; a CPU tensor is
    placed on ``pjrt`` (nothing is uploaded). ``mesh_shape`` and ``partition_spec``,
    if given, only describe it (its ``mesh_shape`` / ``partition_spec`` attributes),
    as in PyTorch/XLA: they shard nothing (use :func:`mark_sharding` for that).

    Example::

        t = xs.wrap_as_sharded_tensor(torch.zeros(8, 4))   # a pjrt tensor, not yet uploaded
        xs.wrap_as_sharded_tensor(t) is t                    # True
    """
    if not isinstance(t, XLAShardedTensor):
        return XLAShardedTensor(t, mesh_shape, partition_spec)
    if mesh_shape is not None or partition_spec is not None:
        describe(t, mesh_shape, partition_spec)
    return t


def wrap_if_sharded(x: Any) -> Any:
    """``x`` itself: a sharded tensor here is already an :class:`XLAShardedTensor` (PyTorch/XLA wraps its raw
    sharded XLA tensors); anything else is returned unchanged too. Kept so ported code runs.

    Example::

        out = xs.wrap_if_sharded(model(x))   # the same tensor
    """
    return x


def unwrap_sharded_tensor(x: Any) -> Any:
    """``x`` itself: PyTorch/XLA unwraps an :class:`XLAShardedTensor` into its global XLA tensor, and here the
    sharded tensor is the global tensor (``x.cpu()`` gathers it). Kept so ported code runs.

    Example::

        out = xs.unwrap_sharded_tensor(xs.wrap_if_sharded(y))   # y
    """
    return x
