"""PyTorch/XLA's runtime (xr) and xla_model (xm) functions under pjrt_plugins.spmd.runtime / .xla_model: the
answers of a single-host SPMD job, from the real CPU plugin's client."""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs
import pjrt_plugins.spmd.runtime as xr
import pjrt_plugins.spmd.xla_model as xm
from pjrt_plugins.errors import UnsupportedFunctionError, VirtualDeviceError

from _exec_support import engine  # noqa: F401


def test_runtime_reports_one_process_driving_every_device(engine):
    assert xr.is_spmd()
    assert xr.device_type() == "CPU"
    assert xr.global_runtime_device_count() == xr.addressable_runtime_device_count() == 8
    assert (xr.global_device_count(), xr.addressable_device_count(), xr.local_device_count()) == (1, 1, 1)
    assert (xr.world_size(), xr.global_ordinal(), xr.local_ordinal()) == (1, 0, 0)
    assert (xr.process_index(), xr.process_count(), xr.host_index(), xr.local_process_count()) == (0, 1, 0, 1)
    attributes = xr.global_runtime_device_attributes()
    assert [a["name"] for a in attributes] == [f"CPU:{i}" for i in range(8)]
    assert xr.runtime_device_attributes("CPU:3")["ordinal"] == 3
    with pytest.raises(ValueError, match="unknown device 'TPU:0'"):
        xr.runtime_device_attributes("TPU:0")
    assert xr.is_bf16_supported()
    with pytest.raises(RuntimeError, match="already runs on 'cpu'"):
        xr.set_device_type("TPU")
    with pytest.raises(NotImplementedError, match="automatic sharding"):
        xr.use_spmd(auto=True)


def test_a_mesh_over_the_runtime_device_count_as_ported_code_builds_it(engine):
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(range(n), (n // 2, 2), ("data", "model"))
    t = xs.mark_sharding(torch.zeros(8, 4).to(xm.xla_device()), mesh, ("data", "model"))
    assert t.sharding_spec == "{devices=[4,2]0,1,2,3,4,5,6,7}"


def test_xla_model_device_and_step_functions(engine):
    assert xm.xla_device() == torch.device("pjrt", 0) == xs.device()
    with pytest.raises(VirtualDeviceError, match="pjrt:1 is not the virtual device"):
        xm.xla_device(1)
    assert xm.get_xla_supported_devices() == ["pjrt:0"]
    assert xm.xla_device_hw(xm.xla_device()) == "CPU" and xm.xla_device_kind() == "cpu"
    assert xm.is_master_ordinal() and xm.is_master_ordinal(local=False) and xm.get_ordinal() == 0
    assert xm.xrt_world_size() == 1 and xm.rendezvous("init", b"x") == [b"x"]
    x = torch.arange(8.0).to(xm.xla_device())
    assert xm.is_xla_tensor(x) and not xm.is_xla_tensor(torch.zeros(1))
    y = x * 3
    assert xs.metrics().executions == 0
    xm.mark_step()
    xm.wait_device_ops()
    assert xs.metrics().executions == 1
    z = y + 1
    xm.unlazy([z])
    assert xs.metrics().executions == 2 and torch.equal(z.cpu(), torch.arange(8.0) * 3 + 1)


def test_optimizer_step_and_save(engine, tmp_path, capsys):
    model = torch.nn.Linear(4, 2).to(xm.xla_device())
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    before = model.weight.cpu()
    model(torch.ones(3, 4).to("pjrt")).sum().backward()
    xm.optimizer_step(opt, barrier=True)
    assert torch.allclose(model.weight.cpu(), before - 3.0)
    xm.save({"w": model.weight, "step": 1}, tmp_path / "ckpt.pt")
    loaded = torch.load(tmp_path / "ckpt.pt")
    assert loaded["step"] == 1 and loaded["w"].device.type == "cpu" and torch.equal(loaded["w"], model.weight.cpu())
    xm.master_print("hello from the master")
    assert capsys.readouterr().out == "hello from the master\n"


def test_rng_state_round_trips_through_an_int(engine):
    xm.set_rng_state(1234)
    assert xm.get_rng_state() == 1234
    first = torch.rand(4, device="pjrt").cpu()
    state = xm.get_rng_state()
    assert state != 1234  # the stream moved on
    second = torch.rand(4, device="pjrt").cpu()
    xm.set_rng_state(state)
    assert torch.equal(torch.rand(4, device="pjrt").cpu(), second)
    xm.set_rng_state(1234)
    assert torch.equal(torch.rand(4, device="pjrt").cpu(), first)
    with xm.fork_rng():
        torch.rand(4, device="pjrt").cpu()
    assert torch.equal(torch.rand(4, device="pjrt").cpu(), second)


def test_send_cpu_data_to_device_uploads_each_devices_shard(engine):
    mesh = xs.Mesh(range(8), (4, 2), ("x", "y"))
    spec = xs.ShardingSpec(mesh, ("x", None))
    xs.reset_transfer_counters()
    out = xm.send_cpu_data_to_device(torch.ones(8, 4), xs.device(), spec)  # a tensor comes back as a list
    assert isinstance(out, list) and out[0].sharding_spec == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert xs.transfer_counters().uploaded == {d: 2 * 4 * 4 for d in range(8)}
    nested = xm.send_cpu_data_to_device({"a": [torch.zeros(8, 2), "text"], "b": torch.arange(3)}, "pjrt:0", spec)
    assert nested["a"][1] == "text" and nested["a"][0].sharding_spec == out[0].sharding_spec
    assert nested["b"].sharding_spec == "" and torch.equal(nested["b"].cpu(), torch.arange(3))


def test_get_memory_info_asks_one_device_of_the_mesh_and_says_what_the_plugin_lacks(engine):
    # The CPU plugin reports no memory statistics: a clear error naming the C API function, for any ordinal.
    for device in (None, "pjrt:0", 7):
        with pytest.raises(UnsupportedFunctionError, match="PJRT_Device_MemoryStats"):
            xm.get_memory_info(device)
    with pytest.raises(ValueError, match="ordinal 8 is out of range"):
        xm.get_memory_info(8)
    with pytest.raises(VirtualDeviceError):
        xm.get_memory_info("pjrt:1")
