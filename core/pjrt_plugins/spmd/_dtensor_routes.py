"""torch's own DTensor API on ``pjrt`` meshes: ``distribute_tensor``, ``distribute_module``, the DTensor factories,
``DTensor.from_local`` and the tensor-parallel styles of ``parallelize_module`` turn placements into XLA shardings;
the partitioner does the rest.

Why routes: torch hands only PyTorch/XLA's ``xla`` meshes to an outside implementation. On any other mesh
its functions cut the tensor into per-rank pieces and run collectives over process groups, and a single
controller has neither ranks nor groups: its tensors are whole. So when the DTensor bridge loads, these
entry points are wrapped once: a ``pjrt`` mesh goes to the bridge, every other mesh to torch's code,
unchanged. The styles and ``from_local`` are patched on their classes and the factories' helper in torch's
module, so they route whenever they were imported; ``distribute_tensor`` and ``distribute_module`` are
module attributes, so such a name imported from torch before the bridge loaded stays torch's (and says so
on a pjrt mesh). The only module that patches torch.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed.tensor as torch_dtensor
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, _mesh_resources
from torch.distributed.tensor import DTensor, _api
from torch.distributed.tensor.parallel import style as torch_style
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard, _StridedShard

from ..errors import PlacementError
from .frontend import XLAShardedTensor
from .frontend._device_mesh import MeshAxes, mesh_axes
from .frontend._placements import constrain, distribute, distribute_module
from .frontend._torch_device import DEVICE_TYPE, TORCH_DEVICE

logger = logging.getLogger(__name__)

__all__ = ["install", "installed"]

_installed = False


def installed() -> bool:
    """Whether :func:`install` ran in this process."""
    return _installed


def install() -> None:
    """Route torch's DTensor entry points to the bridge for ``pjrt`` meshes (once per process; idempotent)."""
    global _installed
    if _installed:
        return
    routed_tensor = _route_distribute_tensor(_api.distribute_tensor)
    routed_module = _route_distribute_module(_api.distribute_module)
    for namespace in (_api, torch_dtensor):
        namespace.distribute_tensor = routed_tensor  # type: ignore[attr-defined]
        namespace.distribute_module = routed_module  # type: ignore[attr-defined]
    _api._dtensor_init_helper = _route_factories(_api._dtensor_init_helper)  # torch.distributed.tensor.zeros, ...
    DTensor.from_local = staticmethod(_route_from_local(DTensor.from_local))  # type: ignore[method-assign]
    for cls, apply in _STYLES.items():
        cls._apply = _route_style(cls, apply)  # type: ignore[attr-defined]
    for cls, name in ((Shard, "_make_shard_tensor"), (_StridedShard, "_make_shard_tensor"),
                      (Replicate, "_make_replicate_tensor")):
        setattr(cls, name, classmethod(_refuse_per_rank_pieces(getattr(cls, name).__func__)))
    _installed = True
    logger.debug("torch's DTensor entry points route pjrt meshes to pjrt_plugins.spmd.dtensor")


def _on_pjrt(device_mesh: DeviceMesh | None) -> DeviceMesh | None:
    """The mesh (an explicit one, else the enclosing ``with mesh:``) if it is a ``pjrt`` mesh, else ``None``."""
    mesh = device_mesh if device_mesh is not None else _mesh_resources.get_current_mesh()
    return mesh if mesh.device_type == DEVICE_TYPE else None


def _refuse_per_rank_pieces(original: Callable[..., Any]) -> Callable[..., Any]:
    """Guard torch's per-rank split of a tensor (its generic ``distribute_tensor``): on a pjrt mesh it would fail
    deep inside torch, so say why it ran and what to call instead."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def guarded(cls: type, *args: Any, **kwargs: Any) -> Any:
        mesh = signature.bind(cls, *args, **kwargs).arguments.get("mesh")
        if isinstance(mesh, DeviceMesh) and mesh.device_type == DEVICE_TYPE:
            raise PlacementError(
                "torch's multi-process distribute_tensor ran on a pjrt mesh: it cuts per-rank pieces, and on the "
                "pjrt device one process holds every tensor whole. This distribute_tensor was imported from torch "
                "before pjrt_plugins.spmd.dtensor loaded (which routes it): import pjrt_plugins.spmd.dtensor first, "
                "call torch.distributed.tensor.distribute_tensor(...) through the module, or use "
                "xs.xla_distribute_tensor")
        return original(cls, *args, **kwargs)

    return guarded


def _route_distribute_tensor(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def distribute_tensor(tensor: torch.Tensor, device_mesh: DeviceMesh | None = None,
                          placements: Sequence[Placement] | None = None, *, src_data_rank: int | None = 0) -> Any:
        mesh = _on_pjrt(device_mesh)
        if mesh is None:
            return original(tensor, device_mesh, placements, src_data_rank=src_data_rank)
        if not tensor.is_leaf:
            raise RuntimeError("`distribute_tensor` should be used to distribute leaf tensors! but found non-leaf "
                               "tensor! (to lay out an intermediate pjrt tensor, use xs.mark_sharding)")
        return distribute(tensor, mesh, placements)  # src_data_rank: the one process holds the only copy

    return distribute_tensor


def _route_distribute_module(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def distribute_module(module: nn.Module, device_mesh: DeviceMesh | None = None,
                          partition_fn: Callable | None = None, input_fn: Callable | None = None,
                          output_fn: Callable | None = None) -> nn.Module:
        mesh = _on_pjrt(device_mesh)
        if mesh is None:
            return original(module, device_mesh, partition_fn, input_fn, output_fn)  # type: ignore[no-any-return]
        return _distribute_once(module, mesh, partition_fn, input_fn, output_fn)

    return distribute_module


def _distribute_once(module: nn.Module, mesh: DeviceMesh, partition_fn: Callable | None,
                     input_fn: Callable | None, output_fn: Callable | None) -> nn.Module:
    if getattr(module, "_distribute_module_applied", False):
        raise RuntimeError("distribute_module should only be called once on a module, "
                           "but it has already been called on this module!")
    distribute_module(module, mesh, partition_fn, input_fn, output_fn)
    module._distribute_module_applied = True  # type: ignore[assignment]
    return module


def _route_factories(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch.distributed.tensor's ``zeros``/``ones``/``empty``/``full``/``rand``/``randn`` (all through this helper):
    on a pjrt mesh, the whole tensor made on the device and laid out (torch's code would make rank 0's piece)."""

    @functools.wraps(original)
    def _dtensor_init_helper(init_op: Callable[..., torch.Tensor], size: torch.Size,
                             device_mesh: DeviceMesh | None = None, placements: Sequence[Placement] | None = None,
                             **kwargs: Any) -> Any:
        mesh = _on_pjrt(device_mesh)
        if mesh is None:
            return original(init_op, size, device_mesh, placements, **kwargs)
        if kwargs.get("layout", torch.strided) != torch.strided:
            raise PlacementError(f"layout {kwargs['layout']} is not supported on a pjrt mesh (strided only)")
        kwargs["device"] = TORCH_DEVICE
        requires_grad = kwargs.pop("requires_grad", False)
        if init_op is torch.full:
            tensor = torch.full(tuple(size), kwargs.pop("fill_value", 0), **kwargs)
        else:
            tensor = init_op(tuple(size), **kwargs)
        return distribute(tensor, mesh, placements).requires_grad_(requires_grad)

    return _dtensor_init_helper


def _route_from_local(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def from_local(local_tensor: torch.Tensor, device_mesh: DeviceMesh | None = None,
                   placements: Sequence[Placement] | None = None, *, run_check: bool = False,
                   shape: torch.Size | None = None, stride: tuple[int, ...] | None = None,
                   grad_placements: Sequence[Placement] | None = None) -> Any:
        mesh = _on_pjrt(device_mesh)
        if mesh is None:
            return original(local_tensor, device_mesh, placements, run_check=run_check, shape=shape, stride=stride,
                            grad_placements=grad_placements)
        if shape is not None and tuple(shape) != tuple(local_tensor.shape):
            raise PlacementError(
                f"DTensor.from_local on a pjrt mesh takes the whole tensor (one process drives every device, so "
                f"there are no per-rank pieces): shape={tuple(shape)} differs from the tensor's {tuple(local_tensor.shape)}")
        axes = mesh_axes(mesh)
        return constrain(_on_device(local_tensor), axes, _placements_or_replicate(placements, axes), wait=False)

    return from_local


def _on_device(tensor: torch.Tensor) -> torch.Tensor:
    return tensor if isinstance(tensor, XLAShardedTensor) else tensor.to(TORCH_DEVICE)


def _placements_or_replicate(placements: Sequence[Placement] | None, axes: MeshAxes) -> Sequence[Placement]:
    return tuple(placements) if placements is not None else (Replicate(),) * axes.ndim


def _constrained(value: Any, axes: MeshAxes, placement: Placement | None) -> Any:
    """``value`` (a tensor) laid out by ``placement`` in the pending graph; other values, or ``None``, unchanged.

    On a sub-mesh (``mesh["tp"]`` of a 2-D mesh) activations are left to the partitioner: a constraint would
    also fix the other mesh dimensions (replicated), and DTensor leaves those to each rank's own data; XLA
    propagates them from the data-parallel inputs and the parameters instead (see docs/dtensor.md).
    """
    if placement is None or not isinstance(value, torch.Tensor):
        return value
    value = _on_device(value)
    if _is_sub_mesh(axes):
        return value
    return constrain(value, axes, (placement,), wait=False)


def _is_sub_mesh(axes: MeshAxes) -> bool:
    """Whether ``axes`` leaves some axis of its root mesh out (sizes of 1 do not count)."""
    shape = axes.mesh.mesh_shape
    covered = {a for span in axes.axes for a in span}
    return any(size > 1 and a not in covered for a, size in enumerate(shape))


# -- the styles ------------------------------------------------------------------------------------------------
# On a pjrt mesh a style's layouts become sharding constraints on the module's parameters, inputs and outputs.
# The input layout a style declares ("arrives as") needs no step of its own: the value is whole, XLA knows
# its actual layout and moves it to the desired one. use_local_output has no effect: tensors stay whole.


#: The hooks torch's styles run; on a pjrt mesh the route applies the layouts instead, so a subclass that
#: overrides one would be silently ignored: it is refused.
_STYLE_HOOKS = ("_partition_linear_fn", "_partition_embedding_fn", "_replicate_module_fn", "_prepare_input_fn",
                "_prepare_output_fn", "_prepare_input_arg", "_prepare_input_kwarg_fn", "_prepare_out_fn")


def _route_style(cls: type, pjrt_apply: Callable[..., nn.Module]) -> Callable[..., Any]:
    original = cls._apply  # type: ignore[attr-defined]

    @functools.wraps(original)
    def _apply(self: Any, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if device_mesh.device_type != DEVICE_TYPE:
            return original(self, module, device_mesh)  # type: ignore[no-any-return]
        overridden = [name for name in _STYLE_HOOKS
                      if hasattr(cls, name) and getattr(type(self), name) is not getattr(cls, name)]
        if overridden:
            raise NotImplementedError(
                f"{type(self).__name__} overrides {', '.join(overridden)} of {cls.__name__}; on a pjrt mesh the "
                f"style's layouts are applied by pjrt_plugins.spmd, not by its hooks, so the override would be "
                "ignored. Give the layouts through the style's arguments instead")
        return pjrt_apply(self, module, device_mesh)

    return _apply


def _shard_parameters(placement_by_type: dict[type, Placement], style_name: str) -> Callable[..., None]:
    def partition(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for kind, placement in placement_by_type.items():
            if isinstance(module, kind):
                for param in module.parameters(recurse=False):  # type: ignore[attr-defined]
                    distribute(param, mesh, [placement])
                return
        raise NotImplementedError(f"{style_name} currently only support nn.Linear and nn.Embedding!")

    return partition


def _layout_io(module: nn.Module, mesh: DeviceMesh, partition: Callable[..., None],
               input_layout: Placement | None, output_layout: Placement | None) -> nn.Module:
    axes = mesh_axes(mesh)

    def prepare_input(mod: nn.Module, inputs: Any, _mesh: DeviceMesh) -> Any:
        if not inputs:
            return inputs
        return (_constrained(inputs[0], axes, input_layout), *inputs[1:])

    def prepare_output(mod: nn.Module, outputs: Any, _mesh: DeviceMesh) -> Any:
        return _constrained(outputs, axes, output_layout)

    def partition_top(name: str, submodule: nn.Module, m: DeviceMesh) -> None:
        if submodule is module:
            partition(name, submodule, m)

    return _distribute_once(module, mesh, partition_top, prepare_input, prepare_output)


def _colwise(style: torch_style.ColwiseParallel, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    partition = _shard_parameters({nn.Linear: Shard(0), nn.Embedding: Shard(1)}, "ColwiseParallel")
    _check_kind(module, "ColwiseParallel")
    return _layout_io(module, mesh, partition, style.desired_input_layouts[0], style.output_layouts[0])


def _rowwise(style: torch_style.RowwiseParallel, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    _check_kind(module, "RowwiseParallel")
    if isinstance(module, nn.Linear):
        def partition(name: str, mod: nn.Module, m: DeviceMesh) -> None:
            distribute(mod.weight, m, [Shard(1)])
            if getattr(mod, "bias", None) is not None:
                distribute(mod.bias, m, [Replicate()])

        desired: Placement = Shard(-1)
    else:
        partition = _shard_parameters({nn.Embedding: Shard(0)}, "RowwiseParallel")
        desired = Replicate()
    style.desired_input_layouts = (desired,)  # as torch's _apply sets it
    return _layout_io(module, mesh, partition, desired, style.output_layouts[0])


def _sequence(style: torch_style.SequenceParallel, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    def replicate(name: str, mod: nn.Module, m: DeviceMesh) -> None:
        for param in mod.parameters(recurse=False):
            distribute(param, m, [Replicate()])

    sequence = style.sequence_sharding[0]
    return _layout_io(module, mesh, replicate, sequence, sequence)


def _prepare_input(style: torch_style.PrepareModuleInput, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    axes = mesh_axes(mesh)

    def layouts(inputs: Any) -> tuple:
        if style.input_layouts is None:
            return inputs
        values = inputs if isinstance(inputs, tuple) else (inputs,)
        if len(values) != len(style.input_layouts):
            raise ValueError(f"module inputs and input_layouts should have same length! ({len(values)} inputs, "
                             f"{len(style.input_layouts)} input_layouts)")
        return tuple(_constrained(v, axes, _wanted(given, wanted))
                     for v, given, wanted in zip(values, style.input_layouts, style.desired_input_layouts))

    if style.with_kwargs:
        def prepare_with_kwargs(mod: nn.Module, inputs: Any, kwargs: dict) -> tuple:
            prepared = {key: _constrained(value, axes, _wanted(style.input_kwarg_layouts.get(key),
                                                                style.desired_input_kwarg_layouts.get(key)))
                        for key, value in kwargs.items()}
            return layouts(inputs), prepared

        module.register_forward_pre_hook(prepare_with_kwargs, with_kwargs=True)
    else:
        module.register_forward_pre_hook(lambda mod, inputs: layouts(inputs))
    return module


def _prepare_output(style: torch_style.PrepareModuleOutput, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    axes = mesh_axes(mesh)

    def prepare(mod: nn.Module, inputs: Any, outputs: Any) -> Any:
        values = outputs if isinstance(outputs, tuple) else (outputs,)
        if len(values) != len(style.output_layouts):
            raise ValueError(f"module outputs and output_layouts should have same length! ({len(values)} outputs, "
                             f"{len(style.output_layouts)} output_layouts)")
        prepared = tuple(_constrained(v, axes, _wanted(given, wanted))
                         for v, given, wanted in zip(values, style.output_layouts, style.desired_output_layouts))
        return prepared[0] if len(prepared) == 1 else prepared

    module.register_forward_hook(prepare)
    return module


def _wanted(given: Placement | None, wanted: Placement | None) -> Placement | None:
    """The layout a prepared value gets: the desired one, else the declared one; ``None`` (not a DTensor) if undeclared."""
    if given is None:
        return None
    return wanted if wanted is not None else given


def _check_kind(module: nn.Module, style_name: str) -> None:
    if not isinstance(module, (nn.Linear, nn.Embedding)):
        raise NotImplementedError(f"{style_name} currently only support nn.Linear and nn.Embedding!")


_STYLES: dict[type, Callable[..., nn.Module]] = {
    torch_style.ColwiseParallel: _colwise,
    torch_style.RowwiseParallel: _rowwise,
    torch_style.SequenceParallel: _sequence,
    torch_style.PrepareModuleInput: _prepare_input,
    torch_style.PrepareModuleOutput: _prepare_output,
}
