"""Every bad input to the sharding API raises an exception that names the problem (never a crash)."""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import ShardingError, VirtualDeviceError
from pjrt_plugins.spmd import transport


def _mesh(vd: xs.VirtualDevice) -> xs.Mesh:
    return xs.Mesh(range(vd.num_devices), (2, vd.num_devices // 2), ("x", "y"))


def test_spec_length_must_equal_the_rank(any_device):
    p = torch.zeros(4, 4).to("pjrt")
    with pytest.raises(ShardingError, match="has 3 entries but the tensor has rank 2"):
        xs.mark_sharding(p, _mesh(any_device), (0, 1, None))
    with pytest.raises(ShardingError, match="has 1 entry but the tensor has rank 2"):
        xs.mark_sharding(p, _mesh(any_device), (0,))
    assert p.sharding_spec == ""


def test_axis_out_of_range_or_used_twice(any_device):
    p = torch.zeros(4, 4).to("pjrt")
    with pytest.raises(ShardingError, match="mesh axis 2 .* out of range: the mesh has 2 axes"):
        xs.mark_sharding(p, _mesh(any_device), (2, None))
    with pytest.raises(ShardingError, match=r"mesh axis 1 \('y'\) is used twice"):
        xs.mark_sharding(p, _mesh(any_device), ("y", 1))


def test_unknown_axis_name(any_device):
    p = torch.zeros(4, 4).to("pjrt")
    with pytest.raises(ShardingError, match=r"unknown mesh axis name 'batch'.*\('x', 'y'\)"):
        xs.mark_sharding(p, _mesh(any_device), ("batch", None))


def test_mesh_must_cover_the_plugins_devices(any_device):
    n = any_device.num_devices
    p = torch.zeros(4, 4).to("pjrt")
    with pytest.raises(ShardingError, match=f"covers 2 devices but the virtual device stands for {n}"):
        xs.mark_sharding(p, xs.Mesh(range(2), (2,)), (0, None))
    with pytest.raises(ShardingError, match=f"mesh shape \\(2, 3\\) covers 6 devices .* {n}"):
        xs.mark_sharding(p, (2, 3), (0, None))
    assert xs.transfer_counters().uploads == 0


def test_device_id_out_of_range(stub4):
    p = torch.zeros(8).to("pjrt")
    with pytest.raises(ShardingError, match=r"device ids \[9\] are out of range"):
        xs.Mesh([0, 1, 2, 9], (4,))
    with pytest.raises(ShardingError, match="covers 8 devices but the virtual device stands for 4"):
        xs.mark_sharding(p, xs.Mesh(range(8), (8,)), (0,))  # ids 4..7 do not exist on this plugin
    with pytest.raises(ShardingError, match="device id 9 is out of range"):
        transport.upload_host_tensor(torch.zeros(2), xs.OpSharding.maximal(9))
    tiled = xs.OpSharding.from_partition_spec((8,), range(8), (0,))
    with pytest.raises(ShardingError, match=r"device id\(s\) \[4, 5, 6, 7\] are out of range"):
        transport.upload_host_tensor(torch.zeros(8), tiled)


def test_tensors_must_be_on_the_virtual_device(any_device):
    cpu = torch.zeros(4, 4)
    with pytest.raises(VirtualDeviceError, match=r"expected a tensor on the virtual device pjrt:0.*\.to\('pjrt'\)"):
        xs.mark_sharding(cpu, _mesh(any_device), (0, 1))
    with pytest.raises(VirtualDeviceError, match="virtual device"):
        xs.clear_sharding(cpu)
    with pytest.raises(TypeError, match="tensor or an nn.Module"):
        xs.to_device([1, 2])


def test_mark_sharding_argument_types(any_device):
    p = torch.zeros(4).to("pjrt")
    with pytest.raises(TypeError, match="a Mesh or a mesh shape"):
        xs.mark_sharding(p, "mesh", (0,))
    marked = xs.mark_sharding(p, xs.get_1d_mesh(), (0,), use_dynamo_custom_op=True)  # accepted, as in PyTorch/XLA
    assert marked.sharding_spec.startswith("{devices=[")


def test_a_replaced_virtual_device_is_detected(cpu8, fresh_device_state):
    p = torch.zeros(8).to("pjrt")
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    xs.mark_sharding(p, xs.Mesh(range(8), (8,)), (0,))
    xs.set_plugin("stub_neuron", options={"num_devices": 4})
    with pytest.raises(VirtualDeviceError, match="replaced"):
        p.cpu()
    q = torch.ones(4).to("pjrt")  # deferred host data is not tied to a device: it still works
    xs.mark_sharding(q, xs.Mesh(range(4), (4,)), (0,))
    assert torch.equal(q.cpu(), torch.ones(4))
