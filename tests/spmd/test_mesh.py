"""Mesh: validation, logical mesh, op shardings, text form, HybridMesh, the device-count check, the global mesh
and the 1-D mesh over all devices.

``xs.Mesh`` checks its size against the virtual device when one exists; the pure geometry is
``pjrt_plugins.spmd.sharding.Mesh`` (no device), used where a test needs meshes of other sizes.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import ShardingError
from pjrt_plugins.spmd import devices
from pjrt_plugins.spmd.sharding import Mesh as PureMesh


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
    assert PureMesh(range(4), (2, 2)) == PureMesh(np.arange(4), [2, 2])
    assert PureMesh(range(4), (2, 2)) != PureMesh(range(4), (4, 1))
    assert len({PureMesh(range(4), (2, 2), ("a", "b")), PureMesh(range(4), (2, 2), ("a", "b"))}) == 1
    assert "mesh_shape=(2, 2)" in repr(PureMesh(range(4), (2, 2)))
    assert xs.Mesh(range(8), (2, 4)) == PureMesh(range(8), (2, 4))  # the checked mesh is the same value


def test_str_is_pytorch_xlas_text_and_from_str_reads_it_back():
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    text = str(mesh)
    assert text == "{'device_ids': [0, 1, 2, 3, 4, 5, 6, 7], 'mesh_shape': (2, 4), 'axis_names': ('data', 'model')}"
    again = xs.Mesh.from_str(text)
    assert again == mesh and type(again) is xs.Mesh
    assert xs.Mesh.from_str("Mesh" + str(PureMesh(range(8), (8,)))) == PureMesh(range(8), (8,))
    for garbage in ("", "mesh", "{'device_ids': [0]}", "[1, 2]", "{'device_ids': [0], 'mesh_shape': (1,),"):
        assert xs.Mesh.from_str(garbage) is None, garbage
    with pytest.raises(ShardingError, match="holds 4 devices but 3 device ids"):  # parses, but is no mesh
        PureMesh.from_str("{'device_ids': [0, 1, 2], 'mesh_shape': (2, 2), 'axis_names': None}")


def test_a_mesh_must_cover_the_virtual_devices_devices_once_the_device_exists(fresh_device_state):
    early = xs.Mesh(range(4), (4,))  # no device yet: building a mesh opens no plugin
    assert devices.peek_virtual_device() is None
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    xs.virtual_device()
    with pytest.raises(ShardingError, match=r"mesh shape \(4,\) covers 4 devices but the virtual device stands "
                                            r"for 8 \(plugin 'cpu'\)") as info:
        xs.Mesh(range(4), (4,))
    assert isinstance(info.value, AssertionError)  # what PyTorch/XLA raises there
    with pytest.raises(ShardingError, match="covers 4 devices"):  # the early mesh fails at its first use
        xs.mark_sharding(torch.zeros(8).to("pjrt"), early, (0,))
    assert xs.transfer_counters().uploads == 0
    assert xs.Mesh(range(8), (4, 2)).size() == 8


def test_hybrid_mesh_lays_granules_out_as_blocks(fresh_device_state):
    mesh = xs.HybridMesh(ici_mesh_shape=(1, 4, 1), dcn_mesh_shape=(2, 1, 1), axis_names=("data", "fsdp", "tensor"))
    assert isinstance(mesh, xs.Mesh)
    assert mesh.shape() == OrderedDict([("data", 2), ("fsdp", 4), ("tensor", 1)])
    assert mesh.ici_mesh_shape == (1, 4, 1) and mesh.dcn_mesh_shape == (2, 1, 1)
    assert mesh.get_logical_mesh()[:, :, 0].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    two_d = xs.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(1, 2))
    assert two_d.get_logical_mesh().tolist() == [[0, 1, 4, 5], [2, 3, 6, 7]]  # granule 1 is the right block
    assert xs.HybridMesh(ici_mesh_shape=(2, 4)).get_logical_mesh().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ShardingError, match="same number of axes"):
        xs.HybridMesh(ici_mesh_shape=(2, 4), dcn_mesh_shape=(2,))
    with pytest.raises(TypeError):
        xs.HybridMesh((2, 4))  # keyword-only, as in PyTorch/XLA
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    xs.virtual_device()
    with pytest.raises(ShardingError, match="covers 16 devices"):
        xs.HybridMesh(ici_mesh_shape=(1, 8), dcn_mesh_shape=(2, 1))


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
    mesh = PureMesh(range(4), (4,), ("data",))
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
