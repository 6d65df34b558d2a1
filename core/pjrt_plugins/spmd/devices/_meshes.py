"""Meshes of the virtual device: ``Mesh`` checked against its device count, ``HybridMesh``, the 1-D mesh over all
its devices, and the process-wide global mesh."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from ...errors import ShardingError
from ..sharding import Mesh as _PureMesh
from ..sharding import hybrid_device_ids
from ._virtual_device import VirtualDevice, peek_virtual_device, virtual_device

__all__ = ["HybridMesh", "Mesh", "check_mesh_fits", "get_1d_mesh", "get_global_mesh", "set_global_mesh"]


def check_mesh_fits(mesh: _PureMesh, vd: VirtualDevice) -> None:
    """Raise :class:`ShardingError` unless ``mesh`` covers every device of ``vd`` (XLA shards over all of them).

    With SPMD off ``vd`` is one device, but a mesh still counts the plugin's devices (as
    PyTorch/XLA's counts the runtime's): using it then raises ``SpmdDisabledError`` instead.
    """
    count = vd.num_devices if vd.spmd else len(vd.client.addressable_devices)
    if mesh.size() != count:
        name = getattr(vd.plugin, "name", None) or type(vd.plugin).__name__
        raise ShardingError(
            f"mesh shape {mesh.mesh_shape} covers {mesh.size()} devices but the virtual device stands for "
            f"{count} (plugin {name!r}); build the mesh over all {count} devices, e.g. xs.Mesh(range({count}), ...)"
        )


class Mesh(_PureMesh):
    """A logical mesh of the virtual device's devices: ids ``0..n-1`` laid out row-major, with optional axis names.

    As in PyTorch/XLA, a mesh must use every device: when the virtual device already
    exists, a mesh with another number of ids raises :class:`ShardingError` here; before
    that (building a mesh never opens a plugin) the same check runs at its first use with
    the device (``mark_sharding``, a loader's input sharding, FSDPv2).

    >>> mesh = Mesh(range(8), (2, 4), ("data", "model"))
    >>> mesh.get_logical_mesh().tolist()
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> dict(mesh.shape())
    {'data': 2, 'model': 4}
    >>> str(mesh.get_op_sharding(("data", None)))
    '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}'

    Raises :class:`pjrt_plugins.errors.ShardingError` when the ids do not fill
    the shape, repeat, fall outside ``0..n-1``, when the axis names are not one
    unique string per axis, or when the ids do not cover the virtual device.
    """

    def __init__(
        self,
        device_ids: Sequence[int] | np.ndarray,
        mesh_shape: Sequence[int],
        axis_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__(device_ids, mesh_shape, axis_names)
        vd = peek_virtual_device()
        if vd is not None:
            check_mesh_fits(self, vd)


class HybridMesh(Mesh):
    """A mesh over devices in groups joined by a slower network (PyTorch/XLA's ``HybridMesh``).

    ``ici_mesh_shape`` lays out the devices of one group (a slice or host, joined by the
    fast inter-chip interconnect), ``dcn_mesh_shape`` the groups (joined by the data-center
    network); axis ``i`` has ``ici[i] * dcn[i]`` devices. Order axes by increasing
    traffic, e.g. ``(data, fsdp, tensor)``. A group is a run of consecutive device
    ordinals, each laid out row-major: unlike PyTorch/XLA we read no TPU topology, so
    ``dcn_mesh_shape`` may also split one host's devices (to try a multi-slice layout).

    >>> mesh = HybridMesh(ici_mesh_shape=(1, 4, 1), dcn_mesh_shape=(2, 1, 1), axis_names=("data", "fsdp", "tensor"))
    >>> dict(mesh.shape())
    {'data': 2, 'fsdp': 4, 'tensor': 1}
    >>> mesh.get_logical_mesh()[:, :, 0].tolist()
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    """

    ici_mesh_shape: tuple[int, ...]
    dcn_mesh_shape: tuple[int, ...]

    def __init__(
        self,
        *,
        ici_mesh_shape: Sequence[int],
        dcn_mesh_shape: Sequence[int] | None = None,
        axis_names: Sequence[str] | None = None,
    ) -> None:
        ids = hybrid_device_ids(ici_mesh_shape, dcn_mesh_shape)
        self.ici_mesh_shape = tuple(int(s) for s in ici_mesh_shape)
        self.dcn_mesh_shape = (tuple(int(s) for s in dcn_mesh_shape) if dcn_mesh_shape is not None
                               else (1,) * len(self.ici_mesh_shape))
        super().__init__(ids.reshape(-1), ids.shape, axis_names)


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """A 1-D mesh over every device of the virtual device (opens the active plugin's client).

    Example (on a plugin with 8 devices)::

        mesh = xs.get_1d_mesh("data")
        mesh.mesh_shape   # (8,)
    """
    count = virtual_device().num_devices
    return Mesh(range(count), (count,), None if axis_name is None else (axis_name,))


_global_mesh: _PureMesh | None = None
_global_lock = threading.Lock()


def set_global_mesh(mesh: _PureMesh | None) -> None:
    """Remember ``mesh`` for code that asks :func:`get_global_mesh` (``None`` forgets it)."""
    global _global_mesh
    if mesh is not None and not isinstance(mesh, _PureMesh):
        raise TypeError(f"set_global_mesh expects a Mesh, got {type(mesh).__name__}")
    with _global_lock:
        _global_mesh = mesh


def get_global_mesh() -> _PureMesh | None:
    """The mesh given to :func:`set_global_mesh`, or ``None``."""
    return _global_mesh
