"""Meshes of the virtual device: the 1-D mesh over all its devices, and the process-wide global mesh."""

from __future__ import annotations

import threading

from ..sharding import Mesh
from ._virtual_device import virtual_device

__all__ = ["get_1d_mesh", "get_global_mesh", "set_global_mesh"]


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """A 1-D mesh over every device of the virtual device (opens the active plugin's client).

    Example (on a plugin with 8 devices)::

        mesh = xs.get_1d_mesh("data")
        mesh.mesh_shape   # (8,)
    """
    count = virtual_device().num_devices
    return Mesh(range(count), (count,), None if axis_name is None else (axis_name,))


_global_mesh: Mesh | None = None
_global_lock = threading.Lock()


def set_global_mesh(mesh: Mesh | None) -> None:
    """Remember ``mesh`` for code that asks :func:`get_global_mesh` (``None`` forgets it)."""
    global _global_mesh
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"set_global_mesh expects a Mesh, got {type(mesh).__name__}")
    with _global_lock:
        _global_mesh = mesh


def get_global_mesh() -> Mesh | None:
    """The mesh given to :func:`set_global_mesh`, or ``None``."""
    return _global_mesh
