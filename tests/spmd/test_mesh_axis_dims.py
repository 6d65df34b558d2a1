"""Per-mesh-axis layouts (DTensor's view) to partition specs (PyTorch/XLA's view) and back, exhaustively on small
meshes and tensors, without torch: the arithmetic under DTensor placements."""

from __future__ import annotations

import itertools

import pytest

from pjrt_plugins.errors import ShardingError
from pjrt_plugins.spmd.sharding import Mesh, axis_dims_from_spec, spec_from_axis_dims


def _layouts(num_axes: int, rank: int):
    """Every assignment of a tensor dimension (or none) to each mesh axis."""
    return itertools.product([None, *range(rank)], repeat=num_axes)


@pytest.mark.parametrize("num_axes", [1, 2, 3])
@pytest.mark.parametrize("rank", [0, 1, 2, 3])
def test_every_layout_survives_the_round_trip_through_a_partition_spec(num_axes, rank):
    mesh = Mesh(range(2**num_axes), (2,) * num_axes)
    for layout in _layouts(num_axes, rank):
        spec = spec_from_axis_dims({a: d for a, d in enumerate(layout) if d is not None}, rank)
        assert len(spec) == rank
        normalized = mesh.normalize_partition_spec(spec, rank=rank)  # a valid spec for the mesh
        assert axis_dims_from_spec(normalized, num_axes) == list(layout)


def test_several_axes_on_one_dimension_become_a_tuple_lower_axis_first():
    # DTensor splits along mesh dimension 0 first: it is the major part of the merged tile dimension.
    assert spec_from_axis_dims({2: 1, 0: 1}, 2) == (None, (0, 2))
    mesh = Mesh(range(8), (2, 4))
    # [Shard(0), Shard(0)] on (2, 4): device (i, j) holds chunk 4*i + j of 8, XLA's tiles of ((0, 1),).
    assert str(mesh.get_op_sharding(spec_from_axis_dims({0: 0, 1: 0}, 1))) == "{devices=[8]0,1,2,3,4,5,6,7}"


def test_negative_dimensions_count_from_the_end():
    assert spec_from_axis_dims({0: -1, 1: -2}, 2) == (1, 0)


@pytest.mark.parametrize("dim", [2, -3, 7])
def test_a_dimension_the_tensor_lacks_is_a_sharding_error(dim):
    with pytest.raises(ShardingError, match=f"shards tensor dimension {dim}, but the tensor has 2 dimensions"):
        spec_from_axis_dims({0: dim}, 2)


def test_a_scalar_has_no_dimension_to_shard():
    with pytest.raises(ShardingError, match="the tensor has 0 dimensions"):
        spec_from_axis_dims({0: 0}, 0)


def test_the_later_axis_major_has_no_placements():
    with pytest.raises(ShardingError, match=r"split by mesh axes \(1, 0\) with the later axis major"):
        axis_dims_from_spec(((1, 0), ()), 2)


def test_docstring_examples_hold():
    import doctest

    from pjrt_plugins.spmd.sharding import _mesh_axis_dims

    result = doctest.testmod(_mesh_axis_dims)
    assert result.attempted > 0 and result.failed == 0
