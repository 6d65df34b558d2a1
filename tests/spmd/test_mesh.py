"""Mesh: validation, logical mesh, op shardings, the global mesh and the 1-D mesh over all devices."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import ShardingError


def test_logical_mesh_is_the_ids_reshaped_row_major():
    mesh = xs.Mesh([7, 6, 5, 4, 3, 2, 1, 0], (2, 4), ("data", "model"))
    assert mesh.get_logical_mesh().tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    assert mesh.size() == 8
    assert mesh.shape() == OrderedDict([("data", 2), ("model", 4)])
    assert mesh.get_axis_name_idx("model") == 1
    assert xs.Mesh(np.arange(8), (2, 2, 2)).shape() == OrderedDict([(0, 2), (1, 2), (2, 2)])


def test_get_op_sharding_returns_our_sharding_spec():
    mesh = xs.Mesh(range(8), (2, 4), ("x", "y"))
    spec = mesh.get_op_sharding(("x", None))
    assert isinstance(spec, xs.OpSharding)
    assert str(spec) == "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert spec.type is xs.ShardingType.PARTIAL
    with pytest.raises(ShardingError, match="rank 3"):
        mesh.get_op_sharding(("x", None), rank=3)


def test_meshes_compare_by_value():
    assert xs.Mesh(range(4), (2, 2)) == xs.Mesh(np.arange(4), [2, 2])
    assert xs.Mesh(range(4), (2, 2)) != xs.Mesh(range(4), (4, 1))
    assert len({xs.Mesh(range(4), (2, 2), ("a", "b")), xs.Mesh(range(4), (2, 2), ("a", "b"))}) == 1
    assert "mesh_shape=(2, 2)" in repr(xs.Mesh(range(4), (2, 2)))


@pytest.mark.parametrize(
    "ids, shape, names, message",
    [
        (range(6), (2, 4), None, "holds 8 devices but 6 device ids were given"),
        ([0, 1, 1, 2], (4,), None, r"unique; \[1\] appear more than once"),
        ([0, 1, 2, 9], (4,), None, r"device ids \[9\] are out of range"),
        ([0, 1, 2, -1], (4,), None, r"device ids \[-1\] are out of range"),
        (range(4), (2, 2), ("x",), "must name each of the 2 mesh axes once"),
        (range(4), (2, 2), ("x", "x"), "must be unique"),
        (range(4), (2, 2), ("x", 3), "non-empty strings"),
        (range(4), (2, 2), "xy", "got the string"),
        (range(4), (4, 0), None, "size 1 or more"),
        (range(4), (), None, "at least one axis"),
        ([0.0, 1.0], (2,), None, "must be integers"),
        ([True, False], (2,), None, "must be integers"),
        (range(4), (2, "2"), None, "tuple of ints"),
    ],
)
def test_mesh_validation_names_the_problem(ids, shape, names, message):
    with pytest.raises(ShardingError, match=message):
        xs.Mesh(ids, shape, names)


def test_global_mesh_round_trip():
    mesh = xs.Mesh(range(4), (4,), ("data",))
    try:
        xs.set_global_mesh(mesh)
        assert xs.get_global_mesh() is mesh
        with pytest.raises(TypeError):
            xs.set_global_mesh((2, 2))
    finally:
        xs.set_global_mesh(None)
    assert xs.get_global_mesh() is None


def test_1d_mesh_spans_every_device(any_device):
    mesh = xs.get_1d_mesh("data")
    n = any_device.num_devices
    assert mesh.mesh_shape == (n,) and mesh.axis_names == ("data",)
    assert mesh.device_ids.tolist() == list(range(n))
    assert xs.get_1d_mesh().axis_names is None
