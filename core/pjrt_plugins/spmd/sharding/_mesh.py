"""Logical device meshes (PyTorch/XLA's ``Mesh``): device ids arranged row-major, with optional axis names.

A mesh only arranges device ids: it never opens a plugin or keeps process state.
"""

from __future__ import annotations

import ast
import math
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import ShardingError
from ._hlo_sharding import OpSharding
from ._partition_spec import PartitionSpec, as_int, normalize_partition_spec

__all__ = ["Mesh", "hybrid_device_ids"]


class Mesh:
    """A logical arrangement of the virtual device's devices, in row-major order.

    ``device_ids`` are the ordinals of the devices (``0..n-1``, one each);
    ``mesh_shape`` arranges them row-major, and ``axis_names`` optionally names
    each axis so partition specs can say ``("data", None)``.

    >>> mesh = Mesh(range(8), (2, 4), ("data", "model"))
    >>> mesh.get_logical_mesh().tolist()
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> dict(mesh.shape())
    {'data': 2, 'model': 4}
    >>> str(mesh.get_op_sharding(("data", None)))
    '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}'

    Raises :class:`pjrt_plugins.errors.ShardingError` when the ids do not fill
    the shape, repeat, fall outside ``0..n-1``, or when the axis names are not
    one unique string per axis.
    """

    def __init__(
        self,
        device_ids: Sequence[int] | np.ndarray,
        mesh_shape: Sequence[int],
        axis_names: Sequence[str] | None = None,
    ) -> None:
        ids_array = np.asarray(device_ids)
        if ids_array.dtype == object or not (ids_array.size == 0 or np.issubdtype(ids_array.dtype, np.integer)):
            raise ShardingError(f"mesh device ids must be integers, got {device_ids!r}")
        ids = tuple(int(d) for d in ids_array.reshape(-1))
        try:
            shape = tuple(as_int(s) for s in mesh_shape)
        except TypeError:
            raise ShardingError(f"mesh_shape must be a tuple of ints, got {mesh_shape!r}") from None
        if not shape or any(s < 1 for s in shape):
            raise ShardingError(f"mesh_shape {shape} must have at least one axis, each of size 1 or more")
        if len(ids) != math.prod(shape):
            raise ShardingError(
                f"mesh_shape {shape} holds {math.prod(shape)} devices but {len(ids)} device ids were given; "
                "give one id per mesh position"
            )
        if len(set(ids)) != len(ids):
            dupes = sorted({d for d in ids if ids.count(d) > 1})
            raise ShardingError(f"mesh device ids must be unique; {dupes} appear more than once")
        outside = [d for d in ids if not 0 <= d < len(ids)]
        if outside:
            raise ShardingError(
                f"mesh device ids {outside} are out of range: a mesh of {len(ids)} devices uses ids 0..{len(ids) - 1}"
            )
        names: tuple[str, ...] | None = None
        if axis_names is not None:
            if isinstance(axis_names, str):
                raise ShardingError(f"axis_names must be a tuple of names, one per axis, got the string {axis_names!r}")
            names = tuple(axis_names)
            if len(names) != len(shape):
                raise ShardingError(f"axis_names {names} must name each of the {len(shape)} mesh axes once")
            if not all(isinstance(n, str) and n for n in names):
                raise ShardingError(f"axis_names {names} must be non-empty strings")
            if len(set(names)) != len(names):
                raise ShardingError(f"axis_names {names} must be unique")
        self.device_ids = np.array(ids, dtype=np.int64)
        self.mesh_shape = shape
        self.axis_names = names

    # -- PyTorch/XLA's Mesh API ----------------------------------------------------------

    def size(self) -> int:
        """Number of devices in the mesh."""
        return len(self.device_ids)

    def shape(self) -> OrderedDict:
        """Axis name (or index, if unnamed) to axis size, in axis order."""
        keys = self.axis_names if self.axis_names is not None else range(len(self.mesh_shape))
        return OrderedDict(zip(keys, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        """The device ids as an array of shape ``mesh_shape`` (row-major)."""
        return self.device_ids.reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str) -> int:
        """The index of the axis called ``name``."""
        if self.axis_names is None or name not in self.axis_names:
            raise ShardingError(f"unknown mesh axis name {name!r}; the mesh axes are {self.axis_names}")
        return self.axis_names.index(name)

    def get_op_sharding(self, partition_spec: PartitionSpec, *, rank: int | None = None) -> OpSharding:
        """The :class:`OpSharding` a partition spec gives on this mesh (``str()`` of it is the HLO string).

        PyTorch/XLA returns its C++ ``torch_xla._XLAC.OpSharding`` here; ours is the
        Python :class:`OpSharding` of the same name, which prints as the same HLO
        sharding string and also answers shard geometry questions. ``rank``, if
        given, must equal ``len(partition_spec)``.

        >>> str(Mesh(range(4), (2, 2)).get_op_sharding((1, 0)))
        '{devices=[2,2]0,2,1,3}'
        """
        return OpSharding.from_partition_spec(
            self.mesh_shape, tuple(self.device_ids.tolist()), partition_spec, self.axis_names, rank=rank
        )

    def normalize_partition_spec(self, partition_spec: PartitionSpec, *, rank: int | None = None) -> tuple:
        """The spec as one tuple of axis indices per dimension; raises :class:`ShardingError` if invalid."""
        return normalize_partition_spec(partition_spec, self.mesh_shape, self.axis_names, rank=rank)

    # -- text form (PyTorch/XLA's) -------------------------------------------------------

    def __str__(self) -> str:
        """PyTorch/XLA's text form, a dict literal that :meth:`from_str` reads back.

        >>> str(Mesh(range(4), (2, 2), ("x", "y")))
        "{'device_ids': [0, 1, 2, 3], 'mesh_shape': (2, 2), 'axis_names': ('x', 'y')}"
        """
        return (f"{{'device_ids': {self.device_ids.tolist()}, 'mesh_shape': {self.mesh_shape}, "
                f"'axis_names': {self.axis_names}}}")

    @classmethod
    def from_str(cls, mesh_str: str) -> Mesh | None:
        """The mesh ``str(mesh)`` describes, or ``None`` if the text is not such a description (PyTorch/XLA's rule).

        Text that parses but describes an invalid mesh raises :class:`ShardingError`
        naming the problem (PyTorch/XLA asserts there).

        >>> Mesh.from_str(str(Mesh(range(4), (2, 2), ("x", "y")))) == Mesh(range(4), (2, 2), ("x", "y"))
        True
        >>> Mesh.from_str("not a mesh") is None
        True
        """
        if not isinstance(mesh_str, str):
            return None
        try:
            fields = ast.literal_eval(mesh_str.replace("Mesh", "", 1).strip())
            device_ids, mesh_shape, axis_names = fields["device_ids"], fields["mesh_shape"], fields["axis_names"]
        except (ValueError, SyntaxError, KeyError, TypeError, MemoryError, RecursionError):
            return None
        return cls(device_ids, mesh_shape, axis_names)

    # -- value semantics -----------------------------------------------------------------

    def _key(self) -> tuple[Any, ...]:
        return (tuple(self.device_ids.tolist()), self.mesh_shape, self.axis_names)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        names = f", axis_names={self.axis_names}" if self.axis_names is not None else ""
        return f"Mesh(device_ids={self.device_ids.tolist()}, mesh_shape={self.mesh_shape}{names})"


def hybrid_device_ids(ici_mesh_shape: Sequence[int], dcn_mesh_shape: Sequence[int] | None = None) -> np.ndarray:
    """Device ordinals laid out for a hybrid mesh: ``dcn_mesh_shape`` blocks of ``ici_mesh_shape`` devices each.

    The devices form ``prod(dcn_mesh_shape)`` granules (slices, hosts) of consecutive
    ordinals; each granule is laid out row-major as ``ici_mesh_shape`` and the granules
    are placed as blocks of a ``dcn_mesh_shape`` grid (JAX's ``create_hybrid_device_mesh``),
    so axis ``i`` has ``dcn[i] * ici[i]`` devices with the slow (DCN) index outermost.
    Returns the ids as an array of that shape.

    >>> hybrid_device_ids((1, 4), (2, 1)).tolist()
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> hybrid_device_ids((2, 2), (1, 2)).tolist()
    [[0, 1, 4, 5], [2, 3, 6, 7]]
    """
    try:
        ici = tuple(as_int(s) for s in ici_mesh_shape)
        dcn = tuple(as_int(s) for s in dcn_mesh_shape) if dcn_mesh_shape is not None else (1,) * len(ici)
    except TypeError:
        raise ShardingError(
            f"ici_mesh_shape and dcn_mesh_shape must be tuples of ints, got {ici_mesh_shape!r} and {dcn_mesh_shape!r}"
        ) from None
    if not ici or len(ici) != len(dcn):
        raise ShardingError(
            f"ici_mesh_shape {ici} and dcn_mesh_shape {dcn} must have the same number of axes (at least one)"
        )
    if any(s < 1 for s in ici + dcn):
        raise ShardingError(f"mesh shapes {ici} and {dcn} must have axes of size 1 or more")
    per_granule = math.prod(ici)
    granules = np.arange(math.prod(dcn) * per_granule).reshape(math.prod(dcn), per_granule)
    # grid[g_0..g_k, i_0..i_k]: granule (g) laid out by dcn, device (i) within it by ici; interleave the
    # axes as (g_0, i_0, g_1, i_1, ...) and merge each pair.
    grid = granules.reshape(dcn + ici)
    rank = len(ici)
    order = [axis for pair in zip(range(rank), range(rank, 2 * rank)) for axis in pair]
    return grid.transpose(order).reshape(tuple(d * i for d, i in zip(dcn, ici)))
