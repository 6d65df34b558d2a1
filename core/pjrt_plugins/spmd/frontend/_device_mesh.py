"""torch's ``DeviceMesh`` over the virtual device: the single-controller mesh of device type ``pjrt``, and the
:class:`Mesh` (with the mesh axes) a DeviceMesh or one of its sub-meshes stands for.

Loaded lazily (through ``_seam``, or by the DTensor bridge): importing ``torch.distributed.tensor`` costs
seconds. A DeviceMesh here only names devices; no process group is created or used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.distributed.device_mesh import DeviceMesh

from ...errors import PlacementError
from ..devices import Mesh, virtual_device
from ..sharding import Mesh as PureMesh
from ._torch_device import DEVICE_TYPE

__all__ = ["MeshAxes", "mesh_axes", "new_device_mesh"]


@dataclass(frozen=True)
class MeshAxes:
    """What a DeviceMesh stands for on the virtual device: ``mesh``, the :class:`Mesh` over all its devices (the
    DeviceMesh's root mesh), and ``axes``, for each dimension of the DeviceMesh the axes of ``mesh`` it spans
    (one axis for a root mesh; a sub-mesh's dimension may span several, or none when its size is 1).
    ``device_mesh`` is the DeviceMesh itself, or ``None`` when a plain :class:`Mesh` was given."""

    mesh: PureMesh  # an xs.Mesh, or a stand-in of the pure data model where no devices matter
    axes: tuple[tuple[int, ...], ...]
    device_mesh: DeviceMesh | None = None

    @property
    def ndim(self) -> int:
        return len(self.axes)

    @classmethod
    def of_mesh(cls, mesh: Mesh) -> MeshAxes:
        """A :class:`Mesh` used directly: each of its axes is one dimension."""
        return cls(mesh, tuple((a,) for a in range(len(mesh.mesh_shape))))


def new_device_mesh(mesh: Mesh) -> DeviceMesh:
    """A DeviceMesh of device type ``pjrt`` with ``mesh``'s layout, ranks = device ordinals, and no process groups.

    Why no process groups: one process drives every device of the virtual device (a single controller),
    so there is nobody to communicate with; the XLA partitioner inserts the collectives between devices.
    torch builds PyTorch/XLA's ``xla`` meshes the same way (``_init_backend`` is its switch for it). The
    empty group list is torch's own state for a mesh whose groups this process holds none of; with it,
    ``mesh["tp"]`` slices (torch then reads the process's rank: it needs ``torch.distributed`` initialized,
    e.g. gloo with world size 1).
    """
    ids = torch.tensor(mesh.get_logical_mesh(), dtype=torch.int)
    device_mesh = DeviceMesh(DEVICE_TYPE, ids, mesh_dim_names=mesh.axis_names, _init_backend=False, _rank=0)
    device_mesh._dim_group_names = []
    return device_mesh


def mesh_axes(device_mesh: object, what: str = "device_mesh") -> MeshAxes:
    """The :class:`MeshAxes` of a ``pjrt`` DeviceMesh (or a plain :class:`Mesh`); raises :class:`PlacementError`
    for a mesh of another device type, or one that does not cover the virtual device's devices."""
    if isinstance(device_mesh, Mesh):
        _check_covers(device_mesh, what)
        return MeshAxes.of_mesh(device_mesh)
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"{what} must be a torch DeviceMesh (device type {DEVICE_TYPE!r}) or an xs.Mesh, "
                        f"got {type(device_mesh).__name__}")
    check_device_type(device_mesh, what)
    root = device_mesh._get_root_mesh()
    mesh = _as_mesh(root, what)
    if root is device_mesh:
        return MeshAxes(mesh, tuple((a,) for a in range(device_mesh.ndim)), device_mesh)
    return MeshAxes(mesh, _submesh_axes(device_mesh, root), device_mesh)


def check_device_type(device_mesh: DeviceMesh, what: str = "device_mesh") -> None:
    """Raise :class:`PlacementError` unless ``device_mesh`` is a ``pjrt`` mesh."""
    if device_mesh.device_type == DEVICE_TYPE:
        return
    hint = (" ('xla' is PyTorch/XLA's device; here the virtual device is 'pjrt')"
            if device_mesh.device_type == "xla" else "")
    raise PlacementError(
        f"{what} is a DeviceMesh of device type {device_mesh.device_type!r}{hint}; shard pjrt tensors on a "
        f"'{DEVICE_TYPE}' mesh: xs.init_device_mesh('{DEVICE_TYPE}', mesh_shape, mesh_dim_names=...)")


def _as_mesh(device_mesh: DeviceMesh, what: str) -> Mesh:
    ids = device_mesh.mesh
    try:
        mesh = Mesh(ids.flatten().tolist(), tuple(ids.shape), device_mesh.mesh_dim_names)
    except ValueError as exc:
        raise PlacementError(f"{what} {device_mesh} is not a mesh of the virtual device's devices: {exc}") from None
    _check_covers(mesh, what)
    return mesh


def _check_covers(mesh: Mesh, what: str) -> None:
    count = virtual_device().num_devices
    if mesh.size() != count:
        raise PlacementError(
            f"{what} has {mesh.size()} devices (shape {mesh.mesh_shape}) but the virtual device stands for "
            f"{count}; build the mesh over all {count} devices (a mesh's ranks are device ordinals 0..{count - 1})")


def _submesh_axes(sub: DeviceMesh, root: DeviceMesh) -> tuple[tuple[int, ...], ...]:
    """For each dimension of the sub-mesh ``sub``, the root mesh axes it spans (a contiguous run, row-major).

    Found from the ranks alone: the root coordinates of the ranks along each sub-mesh dimension.
    """
    root_ids = root.mesh.numpy()
    where = {int(r): np.unravel_index(i, root_ids.shape) for i, r in enumerate(root_ids.reshape(-1))}
    sub_ids = sub.mesh.numpy()
    origin = np.array(where[int(sub_ids.reshape(-1)[0])])
    spans: list[tuple[int, ...]] = []
    for dim, size in enumerate(sub_ids.shape):
        index = [0] * sub_ids.ndim
        coords = []
        for k in range(size):
            index[dim] = k
            coords.append(np.array(where[int(sub_ids[tuple(index)])]) - origin)
        moving = tuple(a for a in range(root_ids.ndim) if any(c[a] for c in coords))
        expected = [np.zeros(root_ids.ndim, dtype=np.int64) for _ in range(size)]
        for k in range(size):
            if moving:
                expected[k][list(moving)] = np.unravel_index(k, tuple(root_ids.shape[a] for a in moving))
        consistent = (math.prod(root_ids.shape[a] for a in moving) == size
                      and moving == tuple(range(moving[0], moving[0] + len(moving)) if moving else ())
                      and all((c == e).all() for c, e in zip(coords, expected)))
        if not consistent:
            raise PlacementError(
                f"sub-mesh dimension {dim} of {sub} does not follow axes of its root mesh {root} in order; "
                "shard on the root mesh (or on a sub-mesh sliced by names) instead")
        spans.append(moving)
    used = [a for span in spans for a in span]
    if len(used) != len(set(used)):
        raise PlacementError(f"the dimensions of sub-mesh {sub} overlap on the axes of its root mesh {root}")
    return tuple(spans)


def mesh_dim_sizes(axes: MeshAxes) -> Sequence[int]:
    """The size of each dimension of ``axes`` (the product of the root axes it spans)."""
    shape = axes.mesh.mesh_shape
    return [math.prod(shape[a] for a in span) for span in axes.axes]
