"""Lazy tracing and its materialization points: what runs when, where results stay, and in-place semantics."""

from __future__ import annotations

import io
import contextlib

import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import execution
from pjrt_plugins.spmd import trace
from pjrt_plugins.spmd.transport import TensorState

from _exec_support import assert_close, engine  # noqa: F401


def _mesh() -> xs.Mesh:
    return xs.Mesh(range(8), (2, 4))


def test_ops_are_recorded_until_a_materialization_point(engine):
    x = torch.randn(8, 8)
    xd = xs.mark_sharding(x.to("pjrt"), _mesh(), (0, 1))
    y = (xd * 2 + 1).relu()
    assert y._pjrt_data.state is TensorState.LAZY
    assert trace.pending_ops() >= 3
    assert xs.metrics().executions == 0
    xs.sync()
    assert trace.pending_ops() == 0
    assert y._pjrt_data.state is TensorState.DEVICE
    assert xs.metrics().executions == 1
    assert xs.metrics().bytes_downloaded == 0  # sync leaves the results on the devices
    # Propagation: the elementwise result keeps the input's tiling, visible in sharding_spec.
    assert y.sharding_spec == "{devices=[2,4]0,1,2,3,4,5,6,7}"
    assert_close("y", y.cpu(), (x * 2 + 1).relu())


def test_every_materialization_point_runs_the_pending_graph(engine):
    x = torch.arange(12.0).reshape(3, 4)
    base = x.to("pjrt")
    checks = {
        "cpu": lambda t: t.cpu(),
        "item": lambda t: t.sum().item(),
        "tolist": lambda t: t.tolist(),
        "repr": lambda t: repr(t),
        "print": lambda t: print(t, file=io.StringIO()),
        "local_shards": lambda t: t.local_shards,
        "sync": lambda t: xs.sync(),
    }
    for name, point in checks.items():
        before = xs.metrics().executions
        t = base * 3
        assert t._pjrt_data.state is TensorState.LAZY, name
        with contextlib.redirect_stdout(io.StringIO()):
            point(t)
        assert t._pjrt_data.state is TensorState.DEVICE, name
        assert xs.metrics().executions == before + 1, name
    assert (base * 3).sum().item() == (x * 3).sum().item()
    assert (base * 3).tolist() == (x * 3).tolist()
    assert "XLAShardedTensor" in repr(base * 3)


def test_local_shards_follow_the_partitioners_choice(engine):
    x = torch.randn(8, 16)
    xd = xs.mark_sharding(x.to("pjrt"), _mesh(), (0, None))
    y = xd.exp()
    shards = y.local_shards
    assert y.sharding_spec == "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert len(shards) == 8
    for shard in shards:
        assert_close(f"shard {shard.shard_device}", shard.unpadded_data, x.exp()[tuple(shard.indices)])


def test_marking_an_intermediate_constrains_the_result(engine):
    x = torch.randn(8, 16)
    xd = xs.mark_sharding(x.to("pjrt"), _mesh(), (0, None))
    y = xd * 2
    xs.mark_sharding(y, _mesh(), (None, 1))
    z = y + 1
    xs.sync()
    assert y.sharding_spec == _mesh().get_op_sharding((None, 1)).to_hlo()
    lowered = execution.last_program().lowered  # a constraint in the plugin's partitioner's form
    assert ("sdy.sharding_constraint" if lowered.partitioner == "shardy" else "@Sharding") in lowered.text
    assert_close("z", z.cpu(), x * 2 + 1)


def test_inplace_ops_and_writes_through_views(engine):
    x = torch.randn(6, 8)
    ref = x.clone()
    t = x.to("pjrt")
    t.add_(1)
    t.mul_(torch.full((8,), 2.0).to("pjrt"))
    t[0] = 5.0
    t[:, 2:4] += 1
    t[1].zero_()
    row = t.view(48)
    row[3] = -1.0
    ref.add_(1)
    ref.mul_(2.0)
    ref[0] = 5.0
    ref[:, 2:4] += 1
    ref[1].zero_()
    ref.view(48)[3] = -1.0
    assert_close("in place", t.cpu(), ref)


def test_cpu_tensors_mix_with_pjrt_tensors_as_inputs(engine):
    x = torch.randn(4, 5)
    t = x.to("pjrt")
    idx = torch.tensor([3, 0, 1])
    assert_close("index with a CPU tensor", t[idx].cpu(), x[idx])
    assert_close("scalar tensor", (t * torch.tensor(0.5)).cpu(), x * 0.5)


def test_dtype_conversions_and_mixed_types(engine):
    x = torch.randn(4, 5)
    t = x.to("pjrt")
    assert_close("to half", t.half().cpu(), x.half())
    assert_close("to int", (t * 10).long().cpu(), (x * 10).long())
    assert_close("int + float", (t.long() + 0.5).cpu(), x.long() + 0.5)
    assert t.half().dtype == torch.float16
    assert torch.equal(t, t)


def test_a_write_through_a_view_after_materializing_still_reaches_the_base(engine):
    x = torch.arange(6.0).reshape(2, 3)
    y = x.to("pjrt") * 1
    row, col = y[1], y[:, 2]
    xs.sync()  # the views' values are on the devices now
    row.add_(10)
    col.copy_(torch.tensor([-1.0, -2.0]))
    expected = x * 1
    expected[1] += 10
    expected[:, 2] = torch.tensor([-1.0, -2.0])
    assert_close("base after writes through views", y.cpu(), expected)
