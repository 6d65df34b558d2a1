"""The DTensor bridge with PyTorch/XLA 2.9's names (``torch_xla.distributed.spmd.api``): torch's ``DeviceMesh`` and
``Shard``/``Replicate`` placements on the virtual device, turned into XLA shardings.

A pjrt tensor is always the whole tensor (one controller drives every device), so placements only say how
XLA lays it out; the partitioner inserts the collectives. Importing this module also routes torch's own
``distribute_tensor``, ``distribute_module``, ``DTensor.from_local`` and tensor-parallel styles to it for
``pjrt`` meshes (``_dtensor_routes``). It imports ``torch.distributed.tensor`` (seconds): ``pjrt_plugins.spmd``
serves its names on first use.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, _mesh_resources
from torch.distributed.tensor.placement_types import Placement

from ..errors import PlacementError
from .devices import Mesh, virtual_device
from .sharding import Mesh as PureMesh
from .frontend import XLAShardedTensor
from .frontend._device_mesh import MeshAxes, check_device_type, mesh_axes, new_device_mesh
from .frontend._placements import distribute, distribute_module, partition_spec, placements_for
from .frontend._torch_device import DEVICE_TYPE
from . import _dtensor_routes

logger = logging.getLogger(__name__)

__all__ = [
    "auto_policy",
    "convert_to_dtensor_placements",
    "convert_to_xla_mesh",
    "convert_to_xla_partition_spec",
    "init_device_mesh",
    "xla_distribute_module",
    "xla_distribute_tensor",
]

_dtensor_routes.install()


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *,
                     mesh_dim_names: Sequence[str] | None = None) -> DeviceMesh:
    """A torch ``DeviceMesh`` of device type ``pjrt`` over the virtual device's devices (torch's ``init_device_mesh``).

    Ranks are device ordinals, laid out row-major like :class:`Mesh`. No process group is created: one
    process drives every device, and XLA inserts the collectives. Slicing it (``mesh["tp"]``) needs
    ``torch.distributed`` initialized, e.g. gloo with world size 1 (torch reads the process's rank).

    Example (8 devices)::

        from torch.distributed.tensor import Shard, distribute_tensor
        mesh = xs.init_device_mesh("pjrt", (2, 4), mesh_dim_names=("dp", "tp"))
        w = distribute_tensor(torch.randn(64, 32), mesh, [Replicate(), Shard(0)])
        w.sharding_spec   # '{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}'
    """
    if device_type != DEVICE_TYPE:
        hint = " ('xla' is PyTorch/XLA's device; ours is 'pjrt')" if device_type == "xla" else ""
        raise PlacementError(f"init_device_mesh builds meshes of the virtual device, device type "
                             f"{DEVICE_TYPE!r}, not {device_type!r}{hint}")
    shape = tuple(mesh_shape)
    count = virtual_device().num_devices
    if math.prod(shape) != count:
        raise PlacementError(f"mesh_shape {shape} holds {math.prod(shape)} devices but the virtual device stands for "
                             f"{count}; give a shape whose product is {count}")
    names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
    return new_device_mesh(Mesh(range(count), shape, names))


def convert_to_xla_mesh(dt_mesh: DeviceMesh) -> Mesh:
    """The :class:`Mesh` with ``dt_mesh``'s device ids, shape and dimension names (PyTorch/XLA's function).

    ``dt_mesh`` must be a ``pjrt`` mesh over every device of the virtual device (not a sub-mesh: distribute
    on a sub-mesh directly); raises :class:`~pjrt_plugins.errors.PlacementError` otherwise.

    Example (8 devices)::

        mesh = convert_to_xla_mesh(xs.init_device_mesh("pjrt", (2, 4), mesh_dim_names=("dp", "tp")))
        mesh.mesh_shape, mesh.axis_names   # ((2, 4), ('dp', 'tp'))
    """
    if not isinstance(dt_mesh, DeviceMesh):
        raise TypeError(f"convert_to_xla_mesh expects a torch DeviceMesh, got {type(dt_mesh).__name__}")
    check_device_type(dt_mesh, "dt_mesh")
    if dt_mesh._get_root_mesh() is not dt_mesh:
        raise PlacementError(f"{dt_mesh} is a sub-mesh: it spans {dt_mesh.size()} of the "
                             f"{virtual_device().num_devices} devices; convert its root mesh, or pass the sub-mesh "
                             "to xla_distribute_tensor, which maps it onto the root mesh's axes")
    return cast(Mesh, mesh_axes(dt_mesh, "dt_mesh").mesh)  # a DeviceMesh's root converts to a device-checked xs.Mesh


def convert_to_xla_partition_spec(tensor: torch.Tensor, placements: Sequence[Placement]) -> tuple:
    """The partition spec (mesh dimension indices, one entry per tensor dimension) ``placements`` describe.

    PyTorch/XLA's function: placement ``i`` is for mesh dimension ``i``. ``Shard(d)`` puts ``i`` at
    entry ``d`` (several mesh dimensions on one tensor dimension give a tuple, lower dimension first),
    ``Replicate()`` adds nothing. ``Partial`` raises :class:`~pjrt_plugins.errors.UnsupportedPlacementError`
    (a ``ValueError``, as in PyTorch/XLA).

    Example::

        convert_to_xla_partition_spec(torch.zeros(4, 8, 8), [Replicate(), Shard(0)])   # (1, None, None)
    """
    placements = tuple(placements)
    # Only the mesh's dimension count matters here (PyTorch/XLA's function takes no mesh).
    # Only the placements matter here: a one-device stand-in mesh of the pure data model (no device check).
    axes = MeshAxes(PureMesh(range(1), (1,) * max(len(placements), 1)), tuple((i,) for i in range(len(placements))))
    return partition_spec(placements, axes, tensor.dim())


def convert_to_dtensor_placements(partition_spec: Sequence[Any], device_mesh: DeviceMesh | Mesh) -> tuple[Placement, ...]:
    """The DTensor placements (one per dimension of ``device_mesh``) of a partition spec: the other way round.

    Entries may be mesh axis indices, axis names, tuples of those (lower axis first) or ``None``.
    Raises :class:`~pjrt_plugins.errors.PlacementError` for a spec no ``Shard``/``Replicate`` placements
    describe (a dimension split with the later mesh axis major).

    Example::

        mesh = xs.Mesh(range(8), (2, 4), ("dp", "tp"))
        convert_to_dtensor_placements(("tp", None), mesh)   # (Replicate(), Shard(dim=0))
    """
    axes = mesh_axes(device_mesh)
    return placements_for(axes, partition_spec, len(tuple(partition_spec)))


def xla_distribute_tensor(tensor: torch.Tensor, device_mesh: DeviceMesh,
                          placements: Sequence[Placement] | None = None) -> XLAShardedTensor:
    """Lay ``tensor`` out on ``device_mesh`` by ``placements`` (default: replicated), as an :class:`XLAShardedTensor`.

    PyTorch/XLA's function, also what torch's ``distribute_tensor`` does on a ``pjrt`` mesh. A pjrt tensor
    (a parameter, say) is marked in place and returned; a CPU tensor is moved first (a new leaf that keeps
    ``requires_grad``). ``device_mesh`` may be a sub-mesh (``mesh["tp"]``): the tensor is then replicated
    along the other mesh dimensions. Only this tensor's shards are uploaded.

    Raises :class:`~pjrt_plugins.errors.PlacementError` for placements that do not fit the mesh or the
    tensor, :class:`~pjrt_plugins.errors.UnsupportedPlacementError` for ``Partial`` and
    :class:`~pjrt_plugins.errors.ShardingConflictError` for a tensor already sharded another way.

    Example (8 devices)::

        mesh = xs.init_device_mesh("pjrt", (8,))
        t = xla_distribute_tensor(torch.randn(16, 4), mesh, [Shard(0)])
        t.placements, t.local_shards[0].data.shape   # ((Shard(dim=0),), torch.Size([2, 4]))
    """
    return distribute(tensor, device_mesh, placements)


def xla_distribute_module(module: nn.Module, device_mesh: DeviceMesh | None = None,
                          partition_fn: Callable[[str, nn.Module, DeviceMesh], None] | None = None,
                          input_fn: Callable[..., Any] | None = None,
                          output_fn: Callable[..., Any] | None = None) -> nn.Module:
    """Shard a module's parameters with ``partition_fn`` and install input/output hooks (PyTorch/XLA's function).

    ``module`` moves to ``pjrt``; ``partition_fn(name, submodule, device_mesh)`` runs on every submodule
    (it typically calls ``xla_distribute_tensor`` on parameters); parameters and buffers it leaves
    unmarked are laid out replicated. ``input_fn(module, inputs, device_mesh)`` and
    ``output_fn(module, outputs, device_mesh)`` become forward (pre-)hooks (two-argument forms warn, as
    in torch). ``device_mesh`` defaults to the mesh of an enclosing ``with device_mesh:`` block.
    ``partition_fn=auto_policy`` (automatic sharding) raises ``NotImplementedError``.

    Example (8 devices)::

        def shard_linears(name, mod, mesh):
            if isinstance(mod, torch.nn.Linear):
                xla_distribute_tensor(mod.weight, mesh, [Shard(0)])
        model = xla_distribute_module(torch.nn.Sequential(torch.nn.Linear(8, 16)), mesh, shard_linears)
        model[0].weight.placements   # (Shard(dim=0),)
    """
    if device_mesh is None:
        device_mesh = _mesh_resources.get_current_mesh()
    return distribute_module(module, device_mesh, partition_fn, input_fn, output_fn)


def auto_policy(mod_name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
    """PyTorch/XLA's marker for automatic sharding in ``xla_distribute_module``; not supported here (it raises)."""
    return None
