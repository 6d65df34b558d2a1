"""Behaviour ported code relies on, as PyTorch/XLA 2.9 shows it: a clone's sharding, shard indices, the
error types, is_spmd() and XLA_USE_SPMD, the sharded-tensor helpers (wrap_if_sharded,
wrap_as_sharded_tensor, unwrap_sharded_tensor, load_local_shards_) and the einsum nn.Linear patch."""

from __future__ import annotations

import copy
import os

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import ShardingConflictError, ShardingError
from pjrt_plugins.spmd import devices

from _exec_support import engine  # noqa: F401

ROWS = "{devices=[8,1]0,1,2,3,4,5,6,7}"


def _mesh() -> xs.Mesh:
    return xs.Mesh(range(8), (8,), ("data",))


def test_a_clone_of_a_sharded_tensor_reports_its_sharding_at_once(engine):
    t = torch.arange(32.0).reshape(16, 2)
    on_device = xs.mark_sharding(t.to("pjrt"), _mesh(), ("data", None))
    pending = xs.mark_sharding(on_device * 2, _mesh(), ("data", None))  # a marked value not yet computed
    host = t.to("pjrt")
    for source, expected in ((on_device, t), (pending, t * 2)):
        copy = source.clone()
        assert copy.sharding_spec == ROWS  # before any sync
        assert copy.mesh_shape == (8,) and copy.partition_spec == ("data", None)
        xs.sync()
        assert copy.sharding_spec == ROWS
        assert torch.equal(copy.cpu(), expected)
        assert [s.indices for s in copy.local_shards][3] == [slice(6, 8, 1), slice(0, 2, 1)]
    assert host.clone().sharding_spec == ""  # nothing declared, nothing to report
    assert (on_device + 1).clone().sharding_spec == ""  # a pending result's layout is the partitioner's, known at sync


def test_shard_indices_are_lists_of_unit_step_slices_and_replicas_are_ellipsis(engine):
    t = torch.randn(5, 3)
    tiled = xs.mark_sharding(t.to("pjrt"), xs.Mesh(range(8), (4, 2)), (0, 1))
    shards = tiled.local_shards  # rows in 4 tiles of 2 (2, 2, 1, 0 left), columns in 2 tiles of 2 (2, 1)
    assert isinstance(shards[5].indices, list) and shards[5].indices == [slice(4, 5, 1), slice(2, 3, 1)]
    assert torch.equal(shards[5].unpadded_data, t[tuple(shards[5].indices)])
    assert shards[6].indices == [slice(5, 5, 1), slice(0, 2, 1)]  # an empty tail shard, clamped
    assert shards[6].unpadded_data.shape == (0, 2)
    replicated = xs.mark_sharding(t.to("pjrt"), _mesh(), (None, None))
    assert [(s.indices, s.replica_id) for s in replicated.local_shards] == [(..., d) for d in range(8)]


def test_error_types_are_also_what_pytorch_xla_raises(engine):
    t = xs.mark_sharding(torch.zeros(8, 8).to("pjrt"), _mesh(), ("data", None))
    with pytest.raises(RuntimeError, match="clear_sharding") as conflict:  # PyTorch/XLA: RuntimeError
        xs.mark_sharding(t, _mesh(), (None, "data"))
    assert isinstance(conflict.value, ShardingConflictError) and isinstance(conflict.value, ShardingError)
    with pytest.raises(AssertionError, match="has 1 entry but the tensor has rank 2"):  # PyTorch/XLA asserts
        xs.mark_sharding(torch.zeros(8, 8).to("pjrt"), _mesh(), ("data",))
    with pytest.raises(AssertionError, match="used twice"):
        xs.mark_sharding(torch.zeros(8, 8).to("pjrt"), xs.Mesh(range(8), (2, 4)), (0, 0))
    with pytest.raises(ValueError, match="unknown mesh axis name 'zz'"):  # PyTorch/XLA: ValueError
        xs.mark_sharding(torch.zeros(8, 8).to("pjrt"), _mesh(), ("zz", None))
    with pytest.raises(AssertionError, match="covers 4 devices"):
        xs.Mesh(range(4), (4,))


def test_is_spmd_follows_xla_use_spmd_at_each_call(fresh_device_state, monkeypatch):
    assert xs.is_spmd()  # unset: on, our default
    monkeypatch.setenv("XLA_USE_SPMD", "0")
    assert not xs.is_spmd()
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    assert xs.virtual_device().num_devices == 1
    monkeypatch.setenv("XLA_USE_SPMD", "1")  # changed by hand after the device exists
    with pytest.warns(UserWarning, match="keeps that mode"):
        assert xs.is_spmd()  # PyTorch/XLA reads the variable; we do too, and say the device did not switch
    assert xs.is_spmd()  # warned once
    assert xs.virtual_device().num_devices == 1
    monkeypatch.setenv("XLA_USE_SPMD", "0")
    with pytest.warns(UserWarning, match="SPMD mode switched"):
        xs.use_spmd()  # switches the device and, as PyTorch/XLA's, sets the variable
    assert os.environ["XLA_USE_SPMD"] == "1"
    assert xs.is_spmd() and xs.virtual_device().num_devices == 8
    with pytest.warns(UserWarning, match="SPMD mode switched"):
        devices.set_spmd(False)  # an explicit choice updates a set variable, so both agree
    assert os.environ["XLA_USE_SPMD"] == "0" and not xs.is_spmd()


def test_wrap_if_sharded_and_wrap_as_sharded_tensor(engine):
    t = xs.mark_sharding(torch.ones(8, 2).to("pjrt"), _mesh(), ("data", None))
    assert xs.wrap_if_sharded(t) is t
    assert xs.unwrap_sharded_tensor(xs.wrap_if_sharded(t)) is t and xs.unwrap_sharded_tensor(3) == 3
    assert xs.wrap_if_sharded(3) == 3
    plain = torch.zeros(4)
    assert xs.wrap_if_sharded(plain) is plain
    assert xs.wrap_as_sharded_tensor(t) is t
    described = xs.wrap_as_sharded_tensor(t, mesh_shape=(2, 4), partition_spec=(0, None))
    assert described is t and t.mesh_shape == (2, 4) and t.partition_spec == (0, None)
    assert t.sharding_spec == ROWS  # a description only: the sharding is unchanged
    moved = xs.wrap_as_sharded_tensor(torch.arange(3.0), mesh_shape=(8,), partition_spec=(None,))
    assert isinstance(moved, xs.XLAShardedTensor) and moved.device == xs.device()
    assert moved.mesh_shape == (8,) and moved.sharding_spec == "" and torch.equal(moved.cpu(), torch.arange(3.0))
    assert xs.transfer_counters().uploaded  # t's upload; `moved` is still deferred


def test_load_local_shards_replaces_each_devices_shard_in_place(engine):
    t = torch.arange(40.0).reshape(10, 4)  # uneven: 8 shards of 2 rows, the last ones padded or empty
    p = xs.mark_sharding(t.to("pjrt"), _mesh(), ("data", None))
    shards = p.local_shards
    for shard in shards:
        shard.unpadded_data = shard.unpadded_data * -1  # PyTorch/XLA's setter
    xs.reset_transfer_counters()
    p.load_local_shards_(shards)
    assert xs.transfer_counters().uploaded == {d: 2 * 4 * 4 for d in range(8)}  # each device: its padded shard
    assert p.sharding_spec == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert torch.equal(p.cpu(), -t)
    assert torch.equal((p + 1).cpu(), 1 - t)  # the engine computes with the loaded data

    with pytest.raises(ShardingError, match=r"shard 0 has shape \(3, 4\) .* padded shard of shape \(2, 4\)"):
        p.load_local_shards_([xs.XLAShard(torch.zeros(3, 4), s.indices, s.shard_device, 0) for s in shards])
    with pytest.raises(ShardingError, match="missing"):
        p.load_local_shards_(shards[:7])
    with pytest.raises(ShardingError, match="not a device of pjrt:0"):
        p.load_local_shards_([xs.XLAShard(s.data, s.indices, "tpu:9", 0) for s in shards])
    replicated = xs.mark_sharding(torch.zeros(4).to("pjrt"), _mesh(), (None,))
    with pytest.raises(ShardingError, match="copy_"):
        replicated.load_local_shards_(replicated.local_shards)
    with pytest.raises(ShardingError, match="mark_sharding it first"):
        torch.zeros(4).to("pjrt").load_local_shards_([])
    assert torch.equal(p.cpu(), -t)  # the failed loads changed nothing


def test_the_einsum_linear_patch_keeps_the_parameters_and_trains_like_nn_linear(engine):
    xs.set_cpu_fallback(False)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(16, 3)))
    model = copy.deepcopy(ref).to("pjrt")
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    weight, bias, spec = model[0].weight, model[2][0].bias, model[0].weight.sharding_spec
    assert xs.apply_xla_patch_to_nn_linear(model) is model
    assert type(model[0]) is xs.EinsumLinear and type(model[2][0]) is xs.EinsumLinear
    assert model[0].weight is weight and model[2][0].bias is bias  # the same Parameters: optimizers keep them
    assert spec.startswith("{devices=[4,1,2]") and model[0].weight.sharding_spec == spec
    x = torch.randn(8, 5, 6)
    for side, net, data in (("cpu", ref, x), ("pjrt", model, xs.mark_sharding(x.to("pjrt"), mesh, ("data", None, None)))):
        net(data).square().mean().backward()
    for (name, got), want in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-5, atol=1e-6, msg=name)
    y = xs.xla_patched_nn_linear_forward(model[0], x[0].to("pjrt"))
    torch.testing.assert_close(y.cpu(), ref[0](x[0]), rtol=1e-5, atol=1e-6)
