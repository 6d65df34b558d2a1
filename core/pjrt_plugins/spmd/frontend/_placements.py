"""DTensor placements on pjrt tensors: placements to partition specs and back, the placements of a marked tensor,
distributing a tensor onto a mesh (in place), and redistributing it (a new tensor, constrained to a sharding).

A pjrt tensor is always the whole (global) tensor: there is one controller, so no per-rank piece exists.
Placements therefore only say how XLA lays the tensor out over the devices; the partitioner moves the data.
Loaded lazily (``_seam.placements()``): it imports ``torch.distributed.tensor``, which costs seconds.
"""

from __future__ import annotations

import inspect
import logging
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard, _StridedShard

from ...errors import PlacementError, ShardingError, UnsupportedPlacementError
from ..sharding import Mesh, axis_dims_from_spec, spec_from_axis_dims
from ..transport import TensorData
from ._annotate import clear_sharding, mark_sharding
from ._device_mesh import MeshAxes, mesh_axes, mesh_dim_sizes
from ._torch_device import TORCH_DEVICE
from .tensor import XLAShardedTensor, materialize, unwrap

logger = logging.getLogger(__name__)

__all__ = [
    "NO_PLACEMENTS",
    "constrain",
    "distribute",
    "distribute_module",
    "partition_spec",
    "placements_for",
    "placements_of",
    "redistribute",
]

#: PyTorch/XLA 2.9's message, word for word: ported tests compare it.
NO_PLACEMENTS = ("Placements not available: XLAShardedTensor requires mesh_shape and partition_spec to be set. "
                 "Use mark_sharding() to properly initialize sharding information.")

#: The DeviceMesh (and its placements) a tensor was last distributed on, valid while its mark is the same object.
_DISTRIBUTED: weakref.WeakKeyDictionary[TensorData, tuple[Any, MeshAxes, tuple[Placement, ...]]] = (
    weakref.WeakKeyDictionary())


def partition_spec(placements: Sequence[Placement], axes: MeshAxes, rank: int) -> tuple:
    """The partition spec (over ``axes.mesh``) that ``placements`` (one per dimension of ``axes``) describe.

    ``Shard(d)`` on a mesh dimension splits tensor dimension ``d`` over it, ``Replicate()`` copies the tensor
    along it. Raises :class:`PlacementError` for a wrong count or a ``Shard`` past the tensor's rank and
    :class:`UnsupportedPlacementError` for placements no XLA sharding expresses.
    """
    placements = _as_placement_tuple(placements)
    if len(placements) != axes.ndim:
        raise PlacementError(
            f"{len(placements)} placement{'' if len(placements) == 1 else 's'} {placements} for a mesh of "
            f"{axes.ndim} dimension{'' if axes.ndim == 1 else 's'} (sizes {tuple(mesh_dim_sizes(axes))}): "
            "give one placement per mesh dimension (`placements` must have the same length as `device_mesh.ndim`)")
    axis_dims: dict[int, int] = {}
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, _StridedShard):
            raise UnsupportedPlacementError(
                f"{placement!r} on mesh dimension {mesh_dim}: strided shards (FSDP2 over tensor parallelism) have no "
                "XLA sharding here; use Shard(dim) placements (several mesh dimensions may shard one tensor dimension)")
        if isinstance(placement, Partial):
            raise UnsupportedPlacementError(
                f"{placement!r} on mesh dimension {mesh_dim}: an XLA sharding has no pending-reduction state, so a "
                "pjrt tensor is always reduced; use Replicate() (or Shard(dim)). Per-device partial values exist "
                "only inside a manual-sharding region")
        if isinstance(placement, Shard):
            if not -rank <= placement.dim < rank:
                raise PlacementError(
                    f"{placement!r} on mesh dimension {mesh_dim} shards a dimension the tensor does not have: it has "
                    f"{rank} dimension{'' if rank == 1 else 's'}" + (f" (0..{rank - 1}, or -{rank}..-1)" if rank else ""))
            for axis in axes.axes[mesh_dim]:
                axis_dims[axis] = placement.dim % rank
        elif not isinstance(placement, Replicate):
            raise UnsupportedPlacementError(f"placement {placement!r} on mesh dimension {mesh_dim} has no XLA sharding; "
                                            "use Shard(dim) or Replicate()")
    return spec_from_axis_dims(axis_dims, rank)


def placements_for(axes: MeshAxes, spec: Sequence[Any], rank: int) -> tuple[Placement, ...]:
    """The placements, one per dimension of ``axes``, of the layout partition spec ``spec`` describes on ``axes.mesh``.

    Raises :class:`PlacementError` for layouts no ``Shard``/``Replicate`` placements describe (a tensor
    dimension split with the later mesh axis major; a sharding along a root axis outside a sub-mesh).
    """
    normalized = axes.mesh.normalize_partition_spec(spec, rank=rank)
    try:
        dims = axis_dims_from_spec(normalized, len(axes.mesh.mesh_shape))
    except ShardingError as exc:
        raise PlacementError(str(exc)) from None
    covered = {a for span in axes.axes for a in span}
    outside = [a for a, d in enumerate(dims) if d is not None and a not in covered]
    if outside:
        raise PlacementError(f"partition spec {tuple(spec)} shards along mesh axes {outside}, which the "
                             f"mesh {axes.device_mesh} does not span")
    result: list[Placement] = []
    for mesh_dim, span in enumerate(axes.axes):
        span_dims = {dims[a] for a in span}
        if len(span_dims) > 1:
            raise PlacementError(f"partition spec {tuple(spec)} splits mesh dimension {mesh_dim} (root axes "
                                 f"{span}) between tensor dimensions {sorted(d for d in span_dims if d is not None)}")
        dim = span_dims.pop() if span_dims else None
        result.append(Replicate() if dim is None else Shard(dim))
    return tuple(result)


def placements_of(tensor: torch.Tensor) -> tuple[Placement, ...]:
    """``tensor.placements``: per dimension of the mesh it was marked or distributed on, ``Shard(d)`` or ``Replicate()``.

    Raises :class:`PlacementError` (a ``ValueError``, with PyTorch/XLA's message) for a tensor no mesh
    was given for.
    """
    data = unwrap(tensor)
    mark = data.mark if data.annotation is not None else None
    if mark is None:
        raise PlacementError(NO_PLACEMENTS)
    known = _DISTRIBUTED.get(data)
    if known is not None and known[0] is mark:
        return known[2]
    mesh, spec = mark
    return placements_for(MeshAxes.of_mesh(mesh), spec, tensor.dim())


def distribute(tensor: torch.Tensor, device_mesh: Any, placements: Sequence[Placement] | None) -> XLAShardedTensor:
    """Lay ``tensor`` out on ``device_mesh`` by ``placements`` (default: replicated); a pjrt tensor is marked in
    place and returned, any other tensor is moved to ``pjrt`` first (a new leaf, ``requires_grad`` kept)."""
    axes = mesh_axes(device_mesh)
    if placements is None:
        placements = (Replicate(),) * axes.ndim
    if isinstance(tensor, DTensor):
        raise PlacementError(
            "Cannot distribute a DTensor with local tensor on xla devices. The input tensor must be global: "
            "pass dtensor.full_tensor() (a pjrt tensor is always the whole tensor)")
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a tensor to distribute, got {type(tensor).__name__}")
    if tensor.is_meta:
        raise PlacementError("a meta tensor has no values to distribute; materialize it on the pjrt device first "
                             "(module.to_empty(device='pjrt') then initialize, or torch.empty(..., device='pjrt'))")
    spec = partition_spec(placements, axes, tensor.dim())
    if not isinstance(tensor, XLAShardedTensor):
        tensor = tensor.detach().to(TORCH_DEVICE).requires_grad_(tensor.requires_grad)
    mark_sharding(tensor, axes.mesh, spec)
    _remember(unwrap(tensor), axes, placements, tensor.dim())
    return tensor  # type: ignore[return-value]


def constrain(tensor: torch.Tensor, axes: MeshAxes, placements: Sequence[Placement], *, wait: bool) -> XLAShardedTensor:
    """A new tensor equal to ``tensor``, laid out by ``placements`` on ``axes`` (``tensor`` keeps its own layout).

    Differentiable: the gradient flows back unchanged, constrained to ``tensor``'s declared sharding if it
    has one (as DTensor's redistribute lays the gradient out like the input). ``wait``: compute the result
    now (this runs the pending graph it belongs to); otherwise it is a constraint in the pending graph.
    """
    data = unwrap(tensor)
    spec = partition_spec(placements, axes, tensor.dim())
    back = data.mark if data.annotation is not None else None
    out = _Constrain.apply(tensor, axes.mesh, spec, back)
    _remember(unwrap(out), axes, placements, tensor.dim())
    if wait:
        materialize([unwrap(out)])
    return out  # type: ignore[no-any-return]


def redistribute(tensor: torch.Tensor, device_mesh: Any, placements: Sequence[Placement] | None,
                 async_op: bool) -> XLAShardedTensor:
    """``XLAShardedTensor.redistribute``: see there."""
    data = unwrap(tensor)
    if placements is None:
        raise PlacementError("placements is needed for redistribute: give one placement per mesh dimension")
    if device_mesh is None:
        known = _DISTRIBUTED.get(data)
        if known is not None and known[0] is data.mark and data.mark is not None:
            axes = known[1]
        elif data.mark is not None and data.annotation is not None:
            axes = MeshAxes.of_mesh(data.mark[0])
        else:
            raise PlacementError("redistribute needs device_mesh: this tensor was never marked on a mesh")
    else:
        axes = mesh_axes(device_mesh)
    return constrain(tensor, axes, placements, wait=not async_op)


def distribute_module(module: nn.Module, device_mesh: Any, partition_fn: Callable | None = None,
                      input_fn: Callable | None = None, output_fn: Callable | None = None) -> nn.Module:
    """Move ``module`` to ``pjrt``, run ``partition_fn(name, submodule, device_mesh)`` on every submodule, lay out
    the parameters and buffers it left unmarked replicated, and install ``input_fn`` / ``output_fn`` as forward
    (pre-)hooks called with ``(module, inputs or outputs, device_mesh)``; returns ``module``."""
    if partition_fn is not None and getattr(partition_fn, "__name__", None) == "auto_policy":
        raise NotImplementedError("automatic sharding (partition_fn=auto_policy) is not supported: give a "
                                  "partition_fn that distributes the parameters, or mark them with xs.mark_sharding")
    mesh_axes(device_mesh)
    module.to(TORCH_DEVICE)
    if partition_fn is not None:
        for name, submodule in module.named_modules():
            partition_fn(name, submodule, device_mesh)
    for submodule in module.modules():
        for tensors in (submodule._parameters, submodule._buffers):
            for tensor in tensors.values():
                if isinstance(tensor, XLAShardedTensor) and unwrap(tensor).annotation is None:
                    distribute(tensor, device_mesh, None)
    if input_fn is not None:
        hook_in = _module_hook(input_fn, "input_fn", device_mesh)
        module.register_forward_pre_hook(lambda mod, inputs: hook_in(mod, inputs))
    if output_fn is not None:
        hook_out = _module_hook(output_fn, "output_fn", device_mesh)
        module.register_forward_hook(lambda mod, inputs, outputs: hook_out(mod, outputs))
    return module


def _module_hook(fn: Callable, what: str, device_mesh: Any) -> Callable[[nn.Module, Any], Any]:
    count = len(inspect.signature(fn).parameters)
    if count == 3:
        return lambda mod, value: fn(mod, value, device_mesh)
    if count == 2:
        warnings.warn(f"Deprecating {what} that takes two arguments (inputs, device_mesh), please use {what} that "
                      "takes in (module, inputs, device_mesh) instead!", FutureWarning, stacklevel=4)
        return lambda mod, value: fn(value, device_mesh)
    raise ValueError(f"{what} should take in 3 arguments (module, inputs or outputs, device_mesh), but got {count} "
                     "arguments!")


class _Constrain(torch.autograd.Function):
    """A copy of the input constrained to a sharding; the gradient is a copy constrained to the input's."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mesh: Mesh, spec: tuple, back: tuple | None) -> torch.Tensor:  # type: ignore[override]
        ctx.back = back
        out = clear_sharding(x.clone())  # a clone carries its source's sharding; this one gets its own
        mark_sharding(out, mesh, spec)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple:  # type: ignore[override]
        if grad is None:
            return None, None, None, None
        out = grad.clone()
        if ctx.back is not None and isinstance(out, XLAShardedTensor):
            mark_sharding(clear_sharding(out), *ctx.back)
        return out, None, None, None


def _as_placement_tuple(placements: Any) -> tuple[Placement, ...]:
    if isinstance(placements, Placement) or not isinstance(placements, Sequence):
        raise PlacementError(f"placements must be a list or tuple with one Placement per mesh dimension, "
                             f"got {placements!r}")
    return tuple(placements)


def _remember(data: TensorData, axes: MeshAxes, placements: Sequence[Placement], rank: int) -> None:
    normalized = tuple(Shard(p.dim % rank) if isinstance(p, Shard) and p.dim < 0 else p for p in placements)
    _DISTRIBUTED[data] = (data.mark, axes, normalized)
