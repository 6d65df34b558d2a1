"""Per-mesh-axis layouts (DTensor's view: which tensor dimension each mesh axis splits) and partition specs
(PyTorch/XLA's view: which mesh axes split each tensor dimension), converted both ways.

Pure arithmetic on ints: the torch-facing side (``Shard(d)`` / ``Replicate()`` placements, DeviceMeshes) lives
in the frontend. Never imports torch or keeps state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...errors import ShardingError

__all__ = ["axis_dims_from_spec", "spec_from_axis_dims"]


def spec_from_axis_dims(axis_dims: Mapping[int, int], rank: int) -> tuple[int | tuple[int, ...] | None, ...]:
    """The partition spec in which mesh axis ``a`` splits tensor dimension ``axis_dims[a]`` (others replicate).

    Dimensions are normalized (``-1`` is the last one). Several mesh axes splitting one dimension become a
    tuple in ascending axis order: DTensor's default shard order splits along the lower mesh dimension
    first, which is the major part of XLA's merged tile dimension.

    >>> spec_from_axis_dims({0: 1, 1: 0}, 2)
    (1, 0)
    >>> spec_from_axis_dims({0: 0, 2: 0}, 3)
    ((0, 2), None, None)
    >>> spec_from_axis_dims({}, 0)
    ()
    """
    groups: list[list[int]] = [[] for _ in range(rank)]
    for axis in sorted(axis_dims):
        dim = axis_dims[axis]
        if not -rank <= dim < rank:
            raise ShardingError(
                f"mesh axis {axis} shards tensor dimension {dim}, but the tensor has {rank} "
                f"dimension{'' if rank == 1 else 's'}" + (f" (valid: {-rank}..{rank - 1})" if rank else ""))
        groups[dim % rank].append(axis)
    return tuple(None if not g else g[0] if len(g) == 1 else tuple(g) for g in groups)


def axis_dims_from_spec(normalized_spec: Sequence[Sequence[int]], num_axes: int) -> list[int | None]:
    """For each mesh axis, the tensor dimension it splits, or ``None`` (the inverse of :func:`spec_from_axis_dims`).

    ``normalized_spec`` holds one tuple of mesh axes per tensor dimension (``Mesh.normalize_partition_spec``).
    A dimension split by several axes must list them in ascending order: the other orders are layouts that
    plain ``Shard(dim)`` placements cannot describe (DTensor needs ``_StridedShard`` for them).

    >>> axis_dims_from_spec(((1,), (), (0,)), 3)
    [2, 0, None]
    >>> axis_dims_from_spec(((0, 2), ()), 3)
    [0, None, 0]
    """
    dims: list[int | None] = [None] * num_axes
    for dim, axes in enumerate(normalized_spec):
        if list(axes) != sorted(axes):
            raise ShardingError(
                f"tensor dimension {dim} is split by mesh axes {tuple(axes)} with the later axis major; DTensor "
                f"placements (Shard(dim) per mesh dimension) split along the lower mesh dimension first, so they "
                f"can only describe the order {tuple(sorted(axes))}")
        for axis in axes:
            dims[axis] = dim
    return dims
