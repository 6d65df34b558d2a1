"""Deferred and sharded transfers on real plugins: byte counts per device, shards, padding, gathers."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import transport
from pjrt_plugins.spmd.transport import _transfer
from pjrt_plugins.spmd.frontend import unwrap


def _padded_bytes(t: torch.Tensor, spec: xs.OpSharding) -> int:
    return math.prod(spec.shard_shape(tuple(t.shape))) * t.element_size()


def test_moving_to_pjrt_uploads_nothing(any_device):
    t = torch.randn(64, 32)
    p = t.to("pjrt")
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.BatchNorm1d(16)).to("pjrt")
    counters = xs.transfer_counters()
    assert counters.total_uploaded == 0 and counters.uploads == 0
    assert isinstance(p, xs.XLAShardedTensor) and p.device == torch.device("pjrt:0")
    assert all(isinstance(x, xs.XLAShardedTensor) for x in itertools.chain(model.parameters(), model.buffers()))


def test_tiled_upload_moves_exactly_each_devices_shard(any_device):
    n = any_device.num_devices
    t = torch.randn(4 * n, 6)
    p = t.to("pjrt")
    xs.mark_sharding(p, xs.Mesh(range(n), (n,)), (0, None))
    counters = xs.transfer_counters()
    assert counters.uploaded == {d: t.nbytes // n for d in range(n)}
    assert counters.total_uploaded == t.nbytes  # the global bytes, nothing more
    assert max(counters.uploaded.values()) < t.nbytes  # no device received the whole tensor
    assert counters.uploads == n and counters.total_downloaded == 0


def test_uneven_tiled_upload_moves_global_bytes_plus_padding(any_device):
    n = any_device.num_devices
    t = torch.arange(5, dtype=torch.float32)  # 5 elements over n devices: ceil(5/n) each, zero-padded
    p = t.to("pjrt")
    xs.mark_sharding(p, xs.Mesh(range(n), (n,)), (0,))
    per_device = math.ceil(5 / n) * 4
    counters = xs.transfer_counters()
    assert counters.uploaded == {d: per_device for d in range(n)}
    assert counters.total_uploaded == t.nbytes + (n * math.ceil(5 / n) - 5) * 4
    shards = p.local_shards
    assert [s.indices for s in shards] == [[slice(min(d * math.ceil(5 / n), 5), min((d + 1) * math.ceil(5 / n), 5), 1)]
                                           for d in range(n)]  # PyTorch/XLA's form: a list, step 1
    for shard in shards:
        assert shard.data.shape == (math.ceil(5 / n),)
        assert torch.equal(shard.unpadded_data, t[tuple(shard.indices)])
        assert not shard.data[shard.unpadded_data.numel() :].any()  # padding is zeros
    assert torch.equal(p.cpu(), t)


def test_eight_by_seven_over_a_two_by_two_tile(stub4):
    t = torch.arange(56, dtype=torch.float32).reshape(8, 7)
    p = t.to("pjrt")
    xs.mark_sharding(p, xs.Mesh(range(4), (2, 2)), (0, 1))
    assert xs.transfer_counters().uploaded == {d: 4 * 4 * 4 for d in range(4)}  # every device holds a padded 4x4
    shards = p.local_shards
    assert [s.indices for s in shards] == [
        [slice(0, 4, 1), slice(0, 4, 1)],
        [slice(0, 4, 1), slice(4, 7, 1)],
        [slice(4, 8, 1), slice(0, 4, 1)],
        [slice(4, 8, 1), slice(4, 7, 1)],
    ]
    assert [tuple(s.unpadded_data.shape) for s in shards] == [(4, 4), (4, 3), (4, 4), (4, 3)]
    assert not shards[1].data[:, 3:].any()
    assert torch.equal(p.cpu(), t)


def test_partial_replication_uploads_each_tile_to_its_group(cpu8):
    t = torch.randn(6, 10)
    p = t.to("pjrt")
    xs.mark_sharding(p, xs.Mesh(range(8), (2, 4)), (0, None))
    assert p.sharding_type is xs.ShardingType.PARTIAL
    assert xs.transfer_counters().uploaded == {d: 3 * 10 * 4 for d in range(8)}
    shards = p.local_shards
    assert [s.replica_id for s in shards] == [0, 1, 2, 3, 0, 1, 2, 3]
    for shard in shards:
        assert torch.equal(shard.data, t[tuple(shard.indices)])
    xs.reset_transfer_counters()
    assert torch.equal(p.cpu(), t)
    # the gather reads one copy of each tile: devices 0 and 4
    assert xs.transfer_counters().downloaded == {0: 120, 4: 120}


def test_replicated_upload_sends_everything_everywhere(any_device):
    n = any_device.num_devices
    t = torch.randn(3, 5)
    p = t.to("pjrt")
    xs.mark_sharding(p, xs.Mesh(range(n), (n,)), (None, None))
    assert p.sharding_spec == "{replicated}" and p.sharding_type is xs.ShardingType.REPLICATED
    assert xs.transfer_counters().uploaded == {d: t.nbytes for d in range(n)}
    shards = p.local_shards
    assert [(s.indices, s.replica_id) for s in shards] == [(..., d) for d in range(n)]
    assert all(torch.equal(s.data, t) and torch.equal(s.unpadded_data, t) for s in shards)
    assert len({s.shard_device for s in shards}) == n


def test_unmarked_tensor_used_in_a_computation_is_uploaded_replicated(any_device):
    # The execution engine calls transport.upload(data, data.annotation) for each graph input.
    n = any_device.num_devices
    t = torch.randn(4, 4)
    p = t.to("pjrt")
    data = unwrap(p)
    assert data.state is xs_state("HOST")
    transport.upload(data, data.annotation)
    assert data.state is xs_state("DEVICE") and data.sharding == xs.OpSharding.replicated()
    assert xs.transfer_counters().uploaded == {d: t.nbytes for d in range(n)}
    assert p.sharding_spec == ""  # nothing was declared
    transport.upload(data, None)  # already there: no second transfer
    assert xs.transfer_counters().uploads == n
    assert torch.equal(p.cpu(), t)


def xs_state(name: str):
    from pjrt_plugins.spmd.transport import TensorState

    return TensorState[name]


def test_marked_factory_tensor_uploads_its_shards(cpu8):
    p = torch.ones(16, 4, device="pjrt", dtype=torch.int32)
    assert xs.transfer_counters().uploads == 0
    xs.mark_sharding(p, (8,), (0, None))  # the RFC's mesh-shape form
    assert xs.transfer_counters().uploaded == {d: 2 * 4 * 4 for d in range(8)}
    assert torch.equal(p.cpu(), torch.ones(16, 4, dtype=torch.int32))


def test_scalar_and_empty_tensors(any_device):
    n = any_device.num_devices
    scalar = torch.tensor(3.5).to("pjrt")
    xs.mark_sharding(scalar, xs.Mesh(range(n), (n,)), ())
    assert scalar.sharding_spec == "{replicated}" and scalar.item() == 3.5
    empty = torch.zeros(0, 3).to("pjrt")
    xs.mark_sharding(empty, xs.Mesh(range(n), (n,)), (0, None))
    assert empty.cpu().shape == (0, 3)
    assert all(s.data.shape == (0, 3) for s in empty.local_shards)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int8, torch.bool])
def test_dtypes_round_trip(any_device, dtype):
    n = any_device.num_devices
    t = (torch.randn(n + 1, 3) * 10).to(dtype)
    p = t.to("pjrt")
    xs.mark_sharding(p, xs.Mesh(range(n), (n,)), (0, None))
    assert p.dtype == dtype
    assert torch.equal(p.cpu(), t)
    assert xs.transfer_counters().uploaded[0] == math.ceil((n + 1) / n) * 3 * t.element_size()


def _factorizations(n: int) -> list[tuple[int, ...]]:
    out = []
    for k in range(1, 4):
        out += [c for c in itertools.product(range(1, n + 1), repeat=k) if math.prod(c) == n]
    return out


@st.composite
def shard_cases(draw, n: int):
    mesh_shape = draw(st.sampled_from(_factorizations(n)))
    ids = draw(st.permutations(list(range(n))))
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.integers(0, 7)) for _ in range(rank))
    axes = list(draw(st.permutations(list(range(len(mesh_shape))))))
    spec = []
    for _ in range(rank):
        take = draw(st.integers(0, len(axes)))
        group, axes = axes[:take], axes[take:]
        spec.append(None if not group else tuple(group))
    dtype = draw(st.sampled_from([torch.float32, torch.int32, torch.bfloat16, torch.bool]))
    return mesh_shape, tuple(ids), tuple(spec), shape, dtype


def _check_round_trip(vd, case):
    mesh_shape, ids, spec, shape, dtype = case
    xs.reset_transfer_counters()
    t = (torch.randn(shape) * 8).to(dtype)
    p = t.to("pjrt")
    mesh = xs.Mesh(list(ids), mesh_shape)
    xs.mark_sharding(p, mesh, spec)
    sharding = mesh.get_op_sharding(spec)
    assert p.sharding_spec == str(sharding)
    up = xs.transfer_counters().uploaded
    assert up == {d: _padded_bytes(t, sharding) for d in range(vd.num_devices)}
    assert torch.equal(p.cpu(), t)
    for ordinal, shard in enumerate(p.local_shards):  # in device order
        expected = t if shard.indices is ... else t[tuple(shard.indices)]
        assert torch.equal(shard.unpadded_data, expected)
        assert shard.replica_id == sharding.replica_id(ordinal)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=shard_cases(8))
def test_gather_round_trip_cpu8(cpu8, case):
    _check_round_trip(cpu8, case)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=shard_cases(4))
def test_gather_round_trip_stub4(stub4, case):
    _check_round_trip(stub4, case)


def test_counters_report_and_reset(cpu8):
    p = torch.zeros(8, 2).to("pjrt")
    xs.mark_sharding(p, xs.Mesh(range(8), (8,)), (0, None))
    p.cpu()
    report = xs.transfer_counters().report()
    assert "uploaded" in report and "total" in report and "8 uploaded, 8 downloaded" in report
    xs.reset_transfer_counters()
    assert xs.transfer_counters() == xs.TransferCounters()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("spec", "columns"), [((0, None), 1280), ((None, 0), 1280), ((None, 0), 1283)],
                         ids=["rows", "columns", "uneven-columns"])
def test_large_gathers_copy_each_tile_into_place(any_device, dtype, spec, columns):
    # Over the two-thread threshold. Column tiles are strided in the output: on the CPU plugin
    # they are copied once, from each buffer's memory (Buffer.host_view); the stub's buffers are
    # device memory and go through a staging tensor, as do padded tiles.
    n = any_device.num_devices
    t = torch.randn(8192 // dtype.itemsize, columns).to(dtype)
    assert t.numel() * t.element_size() > _transfer._PARALLEL_GATHER_BYTES
    p = t.to("pjrt")
    xs.mark_sharding(p, xs.Mesh(range(n), (n,)), spec)
    buffers = unwrap(p).buffers
    on_host = any_device.plugin.name == "cpu"
    assert all(b.host_readable() == on_host for b in buffers)
    xs.reset_transfer_counters()
    assert torch.equal(p.cpu(), t)
    assert xs.transfer_counters().downloaded == {d: _padded_bytes(t, p.sharding) for d in range(n)}
    for buffer in buffers:
        buffer.delete()  # no host view outlived the gather (a pinned buffer refuses to be freed)
