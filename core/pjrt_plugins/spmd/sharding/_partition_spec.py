"""Partition specs: one entry per tensor dimension naming the mesh axes that split it.

Pure: checks and normalizes specs against a mesh's shape and axis names; never imports torch or keeps state.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Union

from ...errors import ShardingError

__all__ = ["AxisRef", "PartitionEntry", "PartitionSpec", "as_int", "normalize_partition_spec"]

#: One entry of a partition spec: a mesh axis index, an axis name, a tuple of those (merged), or None.
AxisRef = Union[int, str]
PartitionEntry = Union[AxisRef, Sequence[AxisRef], None]
PartitionSpec = Sequence[PartitionEntry]


def as_int(value: object) -> int:
    """``operator.index`` that rejects bools (``True`` is not a mesh axis)."""
    if isinstance(value, bool):
        raise TypeError("bool is not an integer here")
    return operator.index(value)  # type: ignore[arg-type]


def normalize_partition_spec(
    partition_spec: PartitionSpec,
    mesh_shape: Sequence[int],
    axis_names: Sequence[str] | None = None,
    *,
    rank: int | None = None,
) -> tuple[tuple[int, ...], ...]:
    """The spec as one tuple of mesh axis indices per tensor dimension (``()`` = not split).

    Raises :class:`ShardingError` naming the problem: wrong length, an axis out
    of range or used twice, an unknown axis name, an entry of the wrong type.

    >>> normalize_partition_spec(("data", None, ("x", 2)), (2, 2, 2), ("data", "x", "y"))
    ((0,), (), (1, 2))
    """
    if isinstance(partition_spec, (str, bytes)) or not isinstance(partition_spec, Sequence):
        raise ShardingError(
            f"a partition spec is a tuple with one entry per tensor dimension, got {partition_spec!r}"
        )
    spec = tuple(partition_spec)
    if rank is not None and len(spec) != rank:
        raise ShardingError(
            f"partition spec {spec!r} has {len(spec)} entr{'y' if len(spec) == 1 else 'ies'} but the tensor "
            f"has rank {rank}; give one entry per tensor dimension (None for a dimension that is not split)"
        )
    names = tuple(axis_names) if axis_names is not None else None
    num_axes = len(mesh_shape)
    seen: dict[int, int] = {}
    groups: list[tuple[int, ...]] = []
    for dim, entry in enumerate(spec):
        refs: Sequence[object]
        if entry is None:
            refs = ()
        elif isinstance(entry, (tuple, list)):
            refs = entry
        else:
            refs = (entry,)
        group = []
        for ref in refs:
            axis = _resolve_axis(ref, num_axes, names, spec)
            if axis in seen:
                label = f"{axis} ({names[axis]!r})" if names else str(axis)
                raise ShardingError(
                    f"mesh axis {label} is used twice in partition spec {spec!r} "
                    f"(dimensions {seen[axis]} and {dim}); each mesh axis may split at most one dimension"
                )
            seen[axis] = dim
            group.append(axis)
        groups.append(tuple(group))
    return tuple(groups)


def _resolve_axis(ref: object, num_axes: int, names: tuple[str, ...] | None, spec: tuple) -> int:
    if isinstance(ref, str):
        if names is None:
            raise ShardingError(
                f"partition spec {spec!r} names axis {ref!r} but the mesh has no axis names; "
                "build the mesh with axis_names=... or use axis indices"
            )
        if ref not in names:
            raise ShardingError(f"unknown mesh axis name {ref!r} in partition spec {spec!r}; the mesh axes are {names}")
        return names.index(ref)
    try:
        axis = as_int(ref)
    except TypeError:
        raise ShardingError(
            f"partition spec {spec!r}: entry {ref!r} is not a mesh axis; use an int axis, an axis name, "
            "a tuple of those, or None"
        ) from None
    if not 0 <= axis < num_axes:
        raise ShardingError(
            f"mesh axis {axis} in partition spec {spec!r} is out of range: the mesh has {num_axes} "
            f"ax{'is' if num_axes == 1 else 'es'} (0..{num_axes - 1})"
        )
    return axis
