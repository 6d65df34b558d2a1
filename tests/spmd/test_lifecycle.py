"""Re-marking rules: same sharding is a no-op, over replicated re-shards, anything else waits for clear_sharding."""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import ShardingConflictError


@pytest.fixture
def mesh(cpu8) -> xs.Mesh:
    return xs.Mesh(range(8), (2, 4), ("data", "model"))


def test_mark_sharding_annotates_in_place_and_returns_the_tensor(mesh):
    p = torch.randn(4, 8).to("pjrt")
    result = xs.mark_sharding(p, mesh, ("data", "model"))
    assert result is p and isinstance(result, xs.XLAShardedTensor)
    assert p.sharding_spec == "{devices=[2,4]0,1,2,3,4,5,6,7}"
    assert p.sharding_type is xs.ShardingType.TILED
    assert p.sharding == mesh.get_op_sharding(("data", "model"))
    assert (p.mesh_shape, p.partition_spec) == ((2, 4), ("data", "model"))


def test_remarking_with_the_same_sharding_is_a_no_op(mesh):
    t = torch.randn(4, 8)
    p = t.to("pjrt")
    xs.mark_sharding(p, mesh, (0, 1))
    xs.reset_transfer_counters()
    assert xs.mark_sharding(p, mesh, ("data", "model")) is p  # the same sharding, spelled by name
    assert xs.mark_sharding(p, xs.Mesh(range(8), (2, 4)), (0, 1)) is p
    assert xs.transfer_counters().uploads == 0
    assert torch.equal(p.cpu(), t)


def test_marking_over_replicated_reshards(mesh):
    t = torch.randn(4, 8)
    p = t.to("pjrt")
    xs.mark_sharding(p, mesh, (None, None))
    assert p.sharding_type is xs.ShardingType.REPLICATED
    xs.reset_transfer_counters()
    xs.mark_sharding(p, mesh, ("data", None))
    assert p.sharding_type is xs.ShardingType.PARTIAL
    counters = xs.transfer_counters()
    assert counters.total_downloaded == t.nbytes  # one replica read back
    assert counters.uploaded == {d: t.nbytes // 2 for d in range(8)}
    assert torch.equal(p.cpu(), t)
    assert [s.replica_id for s in p.local_shards] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_marking_over_another_sharding_raises_until_cleared(mesh):
    t = torch.randn(4, 8)
    p = t.to("pjrt")
    xs.mark_sharding(p, mesh, ("data", "model"))
    with pytest.raises(ShardingConflictError, match=r"already has sharding \{devices=\[2,4\].*clear_sharding"):
        xs.mark_sharding(p, mesh, ("model", "data"))
    with pytest.raises(ShardingConflictError):
        xs.mark_sharding(p, mesh, (None, None))  # not even to replicated
    assert p.sharding_spec == "{devices=[2,4]0,1,2,3,4,5,6,7}"
    xs.reset_transfer_counters()
    assert xs.clear_sharding(p) is p
    assert p.sharding_spec == "" and p.sharding_type is None and p.mesh_shape is None
    assert xs.transfer_counters().uploads == xs.transfer_counters().downloads == 0  # clearing moves nothing
    assert torch.equal(p.cpu(), t)  # the shards are still where they were
    xs.mark_sharding(p, mesh, ("model", "data"))
    assert p.sharding_spec == "{devices=[4,2]0,4,1,5,2,6,3,7}"
    assert torch.equal(p.cpu(), t)


def test_a_partial_sharding_also_blocks_remarking(mesh):
    p = torch.randn(4, 8).to("pjrt")
    xs.mark_sharding(p, mesh, ("data", None))
    with pytest.raises(ShardingConflictError):
        xs.mark_sharding(p, mesh, (None, "model"))


def test_clearing_an_unmarked_tensor_is_harmless(mesh):
    p = torch.ones(3).to("pjrt")
    xs.clear_sharding(p)
    assert p.sharding_spec == "" and torch.equal(p.cpu(), torch.ones(3))


def test_parameters_are_marked_in_place(mesh):
    model = torch.nn.Linear(8, 4).to("pjrt")
    weight = model.weight
    xs.mark_sharding(model.weight, mesh, ("data", "model"))
    assert model.weight is weight and isinstance(model.weight, torch.nn.Parameter)
    assert model.weight.sharding_type is xs.ShardingType.TILED
    assert model.weight.detach().sharding_spec == model.weight.sharding_spec
