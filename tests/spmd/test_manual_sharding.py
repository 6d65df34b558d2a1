"""Manual-sharding regions on the real CPU plugin (8 devices): entering and leaving one, each collective with
replica groups checked against numpy, {manual} values as program outputs and inputs, and the errors raised
before XLA sees a program (wrong replica groups, a collective outside a region, shards that do not divide, a
sharding mark inside a region)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import pjrt_plugins.spmd as xs
import pjrt_plugins.spmd.xla_model as xm
from pjrt_plugins.errors import LoweringError, ManualShardingError, ShardingError, VirtualDeviceError
from pjrt_plugins.spmd import devices
from pjrt_plugins.spmd.execution import last_program
from pjrt_plugins.spmd.sharding import OpSharding, ShardingType
from pjrt_plugins.spmd.transport import upload_host_tensor

from _exec_support import engine, ensure_cpu8  # noqa: F401

N = 8
HALVES = [[0, 1, 2, 3], [4, 5, 6, 7]]
PAIRS = [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.fixture
def mesh(engine):  # noqa: F811
    return xs.Mesh(range(N), (N,), ("x",))


def _values(rows: int = 2, cols: int = 4, seed: int = 0) -> np.ndarray:
    """The global (8 * rows, cols) input; device d's shard is rows [d * rows, (d + 1) * rows)."""
    return np.random.default_rng(seed).standard_normal((N * rows, cols)).astype(np.float32)


def _region(values: np.ndarray, mesh: xs.Mesh) -> torch.Tensor:
    return xs.enable_manual_sharding(torch.from_numpy(values).to("pjrt"), ("x", None), mesh=mesh)


def _leave(t: torch.Tensor, mesh: xs.Mesh) -> np.ndarray:
    """Each device's value, stacked in device order (the region left with a row split)."""
    full = (t.shape[0] * N, *t.shape[1:])
    return xs.disable_manual_sharding(t, ("x", None), full, mesh=mesh).cpu().numpy()


def _per_device(values: np.ndarray) -> list[np.ndarray]:
    return np.split(values, N)


def _group_of(d: int, groups: list[list[int]]) -> list[int]:
    return next(g for g in groups if d in g)


# -- entering and leaving ------------------------------------------------------------------------


def test_manual_sharding_api_e2e(engine):  # noqa: F811
    """PyTorch/XLA's test: each device adds one to its (8, 1) shard; the global result is x + 1."""
    xs.set_global_mesh(xs.Mesh(range(N), (1, N)))
    try:
        x = torch.zeros(8, 8).to("pjrt")
        xx = xs.enable_manual_sharding(x, (0, 1))
        assert xx.shape == (8, 1) and xx.sharding_spec == "{manual}" and xx.sharding_type is ShardingType.MANUAL
        assert x.sharding_spec == "{devices=[1,8]0,1,2,3,4,5,6,7}"  # marked in place, as PyTorch/XLA does
        xxx = xs.disable_manual_sharding(xx + 1, (0, 1), x.shape)
        assert xxx.shape == (8, 8) and xxx.sharding_spec == "{devices=[1,8]0,1,2,3,4,5,6,7}"
        assert torch.equal(xxx.cpu(), torch.ones(8, 8))
    finally:
        xs.set_global_mesh(None)


def test_each_device_computes_on_its_own_shard(mesh):
    values = _values()
    local = _region(values, mesh)
    assert local.partition_spec == ("x", None) and local.mesh_shape == (N,)
    # Device-dependent work with no communication: each shard is scaled by its own first element.
    out = _leave(local * local[:1, :1], mesh)
    expected = np.concatenate([v * v[0, 0] for v in _per_device(values)])
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_a_replicated_region_gives_every_device_the_whole_tensor(engine):  # noqa: F811
    mesh = xs.Mesh(range(N), (2, 4), ("data", "model"))
    x = torch.arange(32.0).reshape(8, 4).to("pjrt")
    local = xs.enable_manual_sharding(x, ("data", None), mesh=mesh)  # 2-way split, copies over "model"
    assert local.shape == (4, 4)
    shards = local.local_shards
    for d, shard in enumerate(shards):
        assert shard.indices is ... and shard.replica_id == d
        assert torch.equal(shard.data, torch.arange(32.0).reshape(8, 4)[(d // 4) * 4:(d // 4 + 1) * 4])
    out = xs.disable_manual_sharding(local.sum(0, keepdim=True), ("data", None), (2, 4), mesh=mesh)
    assert torch.equal(out.cpu(), torch.arange(32.0).reshape(2, 4, 4).sum(1))


def test_manual_values_are_program_outputs_and_inputs(mesh):
    """A region value that lives across a sync is kept on the devices as {manual}: one value per device, no
    global value, and it goes on into the next program."""
    values = _values()
    local = _region(values, mesh)
    doubled = local * 2
    xs.sync()
    assert doubled.sharding_spec == "{manual}"
    for shard, v in zip(doubled.local_shards, _per_device(values)):
        np.testing.assert_allclose(shard.data.numpy(), v * 2)
    with pytest.raises(ShardingError, match="no single global value .* disable_manual_sharding"):
        doubled.cpu()
    assert "one value per device" in repr(doubled)
    total = xm.all_reduce(xm.REDUCE_SUM, doubled)  # a {manual} program input
    np.testing.assert_allclose(_leave(total, mesh), np.tile(sum(_per_device(values)) * 2, (N, 1)), rtol=1e-5)


def test_load_local_shards_gives_each_device_its_own_value(mesh):
    local = _region(np.zeros((16, 4), np.float32), mesh)
    shards = local.local_shards
    for d, shard in enumerate(shards):
        shard.data.fill_(d)
    local.load_local_shards_(shards)
    assert local.sharding_spec == "{manual}"
    np.testing.assert_array_equal(_leave(local, mesh), np.repeat(np.arange(N, dtype=np.float32), 2)[:, None]
                                  * np.ones((1, 4), np.float32))


def test_a_host_tensor_marked_manual_is_uploaded_to_every_device(engine):  # noqa: F811
    host = torch.arange(6.0).reshape(2, 3)
    buffers = upload_host_tensor(host, OpSharding.manual(), engine)
    assert len(buffers) == N and all(torch.equal(b.to_torch(), host) for b in buffers)


# -- the collectives against numpy ------------------------------------------------------------------


@pytest.mark.parametrize("reduce_type, groups, scale", [
    (xm.REDUCE_SUM, None, 1.0), (xm.REDUCE_SUM, HALVES, 0.25), (xm.REDUCE_MAX, PAIRS, 1.0),
    (xm.REDUCE_MIN, HALVES, 1.0), (xm.REDUCE_MUL, PAIRS, 1.0)])
def test_all_reduce(mesh, reduce_type, groups, scale):
    values = _values()
    combine = {"sum": np.sum, "max": np.max, "min": np.min, "mul": np.prod}[reduce_type]
    shards = _per_device(values)
    out = _leave(xm.all_reduce(reduce_type, _region(values, mesh), scale=scale, groups=groups), mesh)
    expected = [combine([shards[k] for k in _group_of(d, groups or [list(range(N))])], axis=0) * scale
                for d in range(N)]
    np.testing.assert_allclose(out, np.concatenate(expected), rtol=1e-5, atol=1e-6)


def test_all_reduce_of_integers_and_bools_and_of_a_list_in_place(mesh):
    ints = np.arange(16 * 4, dtype=np.int32).reshape(16, 4)
    local = xs.enable_manual_sharding(torch.from_numpy(ints).to("pjrt"), ("x", None), mesh=mesh)
    bits = xm.all_reduce(xm.REDUCE_OR, local, groups=PAIRS)
    flags = xm.all_reduce(xm.REDUCE_AND, local > 20, groups=HALVES)
    a, b = local * 1, local * 2
    assert xm.all_reduce(xm.REDUCE_SUM, [a, b]) == [a, b]  # reduced in place, as xm does
    shards = _per_device(ints)
    np.testing.assert_array_equal(_leave(bits, mesh),
                                  np.concatenate([shards[d] | shards[d ^ 1] for d in range(N)]))
    np.testing.assert_array_equal(_leave(flags, mesh), np.concatenate(
        [np.logical_and.reduce([shards[k] > 20 for k in _group_of(d, HALVES)]) for d in range(N)]))
    np.testing.assert_array_equal(_leave(b, mesh), np.tile(2 * sum(shards), (N, 1)))


@pytest.mark.parametrize("dim, groups", [(0, None), (1, PAIRS), (-1, HALVES)])
def test_all_gather(mesh, dim, groups):
    values = _values()
    shards = _per_device(values)
    local = _region(values, mesh)
    out = xm.all_gather(local, dim=dim, groups=groups)
    size = len(groups[0]) if groups else N
    assert out.shape == tuple(s * size if i == dim % 2 else s for i, s in enumerate(local.shape))
    expected = [np.concatenate([shards[k] for k in _group_of(d, groups or [list(range(N))])], axis=dim)
                for d in range(N)]
    np.testing.assert_allclose(_leave(out, mesh), np.concatenate(expected))


def test_all_gather_into_an_output(mesh):
    values = _values()
    local = _region(values, mesh)
    target = local.new_zeros((2, 8))
    assert xm.all_gather(local, dim=1, groups=PAIRS, output=target) is target
    shards = _per_device(values)
    np.testing.assert_allclose(_leave(target, mesh),
                               np.concatenate([np.concatenate([shards[d & ~1], shards[d | 1]], 1) for d in range(N)]))


@pytest.mark.parametrize("scatter_dim, groups, scale", [(0, None, 1.0), (1, HALVES, 0.5), (-2, PAIRS, 2.0)])
def test_reduce_scatter(mesh, scatter_dim, groups, scale):
    values = _values(rows=8, cols=8)
    shards = _per_device(values)
    groups_ = groups or [list(range(N))]
    size = len(groups_[0])
    out = xm.reduce_scatter(xm.REDUCE_SUM, _region(values, mesh), scale, scatter_dim, size, groups=groups)
    expected = []
    for d in range(N):
        group = _group_of(d, groups_)
        total = np.sum([shards[k] for k in group], axis=0) * scale
        expected.append(np.split(total, size, axis=scatter_dim)[group.index(d)])
    np.testing.assert_allclose(_leave(out, mesh), np.concatenate(expected), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("split, concat, groups", [(1, 0, None), (0, 1, HALVES), (1, 1, PAIRS)])
def test_all_to_all(mesh, split, concat, groups):
    values = _values(rows=8, cols=8)
    shards = _per_device(values)
    groups_ = groups or [list(range(N))]
    size = len(groups_[0])
    out = xm.all_to_all(_region(values, mesh), split, concat, size, groups=groups)
    expected = []
    for d in range(N):
        group = _group_of(d, groups_)
        pieces = [np.split(shards[k], size, axis=split)[group.index(d)] for k in group]
        expected.append(np.concatenate(pieces, axis=concat))
    np.testing.assert_allclose(_leave(out, mesh), np.concatenate(expected))


@pytest.mark.parametrize("pairs", [[[i, (i + 1) % N] for i in range(N)], [[0, 5], [5, 0], [3, 3]], []])
def test_collective_permute(mesh, pairs):
    values = _values()
    shards = _per_device(values)
    out = xm.collective_permute(_region(values, mesh), pairs)
    source = {t: s for s, t in pairs}
    expected = [shards[source[d]] if d in source else np.zeros_like(shards[d]) for d in range(N)]
    np.testing.assert_allclose(_leave(out, mesh), np.concatenate(expected))


def test_the_program_holds_stablehlo_collectives_with_global_device_ids(mesh):
    local = _region(_values(), mesh)
    _leave(xm.all_reduce(xm.REDUCE_SUM, local, groups=HALVES), mesh)
    text = last_program().lowered.text
    assert "@SPMDFullToShardShape" in text and "@SPMDShardToFullShape" in text
    assert "stablehlo.all_reduce" in text and "use_global_device_ids" in text and "channel_handle" in text
    assert "dense<[[0, 1, 2, 3], [4, 5, 6, 7]]>" in text


# -- errors, before XLA sees a program --------------------------------------------------------------


@pytest.mark.parametrize("groups, message", [
    ([[0, 1, 2], [4, 5, 6]], "devices \\[3, 7\\] are in none"),
    ([[0, 1, 2, 3], [4, 5], [6, 7]], "same size"),
    ([[0, 1, 2, 3], [3, 4, 5, 6]], "device ids \\[3\\] appear in more than one place"),
    ([[0, 1, 2, 3], [4, 5, 6, 8]], "\\[8\\] in groups are out of range"),
    ([[0, 1], [2, 3], [4, 5], [6, 7.0]], "must be ints"),
    ([0, 1, 2, 3], "list of lists"),
])
def test_wrong_replica_groups_are_refused(mesh, groups, message):
    local = _region(_values(), mesh)
    with pytest.raises(ShardingError, match=message):
        xm.all_reduce(xm.REDUCE_SUM, local, groups=groups)
    with pytest.raises(ShardingError, match=message):
        xm.all_gather(local, groups=groups)
    np.testing.assert_allclose(_leave(local, mesh), _values())  # the pending work is unharmed


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                        "collective_permute"])
def test_a_collective_outside_a_region_is_refused(mesh, collective):
    calls = {
        "all_reduce": lambda t: xm.all_reduce(xm.REDUCE_SUM, t),
        "all_gather": lambda t: xm.all_gather(t),
        "reduce_scatter": lambda t: xm.reduce_scatter(xm.REDUCE_SUM, t, 1.0, 0, N),
        "all_to_all": lambda t: xm.all_to_all(t, 0, 0, N),
        "collective_permute": lambda t: xm.collective_permute(t, [[0, 1]]),
    }
    plain = torch.ones(16, 4).to("pjrt")
    left = xs.disable_manual_sharding(_region(_values(), mesh) + 1, ("x", None), (16, 4), mesh=mesh)
    pending = plain * 2
    for t in (plain, left, pending, xs.mark_sharding(torch.ones(16, 4).to("pjrt"), mesh, ("x", None))):
        with pytest.raises(ManualShardingError, match=f"{collective} is a collective of a manual-sharding region"):
            calls[collective](t)
    with pytest.raises(VirtualDeviceError):
        calls[collective](torch.ones(16, 4))
    assert torch.equal(pending.cpu(), torch.full((16, 4), 2.0))


def test_the_lowering_refuses_a_collective_that_bypasses_the_checks(engine):  # noqa: F811
    x = torch.ones(16, 4).to("pjrt")
    y = torch.ops.pjrt.all_reduce(x + 1, "sum", 1.0, list(range(N)), N)  # the raw op, outside any region
    with pytest.raises(LoweringError, match="all_reduce is a collective of a manual-sharding region"):
        y.cpu()


def test_shards_that_do_not_divide_are_refused(mesh):
    with pytest.raises(ShardingError, match="splits dimension 0 \\(size 12\\) into 8 shards"):
        xs.enable_manual_sharding(torch.ones(12, 4).to("pjrt"), ("x", None), mesh=mesh)
    local = _region(_values(), mesh)
    with pytest.raises(ShardingError, match="dimension 1 \\(size 4\\) into 8 shards"):
        xs.disable_manual_sharding(local, (None, "x"), (2, 4), mesh=mesh)
    with pytest.raises(ShardingError, match="leaves each device a shard of shape \\[4, 4\\]"):
        xs.disable_manual_sharding(local, ("x", None), (32, 4), mesh=mesh)
    with pytest.raises(ShardingError, match="does not split into 8 equal pieces"):
        xm.reduce_scatter(xm.REDUCE_SUM, local, 1.0, 1, N)
    with pytest.raises(ShardingError, match="does not split into 8 equal pieces"):
        xm.all_to_all(local, 0, 1, N)


def test_region_misuse_is_refused(mesh):
    local = _region(_values(), mesh)
    with pytest.raises(ManualShardingError, match="regions do not nest"):
        xs.enable_manual_sharding(local, ("x", None), mesh=mesh)
    with pytest.raises(ManualShardingError, match="not a value of a manual-sharding region"):
        xs.disable_manual_sharding(torch.ones(2, 4).to("pjrt"), ("x", None), (16, 4), mesh=mesh)
    with pytest.raises(ShardingError, match="needs a mesh"):
        xs.enable_manual_sharding(torch.ones(16, 4).to("pjrt"), ("x", None))
    with pytest.raises(ShardingError, match="shard_count 4 must equal the size of the replica groups \\(8\\)"):
        xm.reduce_scatter(xm.REDUCE_SUM, local, 1.0, 0, 4)
    with pytest.raises(ShardingError, match="split_count 2 must equal the size of the replica groups \\(4\\)"):
        xm.all_to_all(local, 1, 0, 2, groups=HALVES)
    with pytest.raises(ValueError, match="reduce_type must be one of"):
        xm.all_reduce("average", local)
    with pytest.raises(TypeError, match="takes bool or integer tensors"):
        xm.all_reduce(xm.REDUCE_OR, local)
    with pytest.raises(TypeError, match="scale 0.5 applies to floating-point tensors"):
        xm.all_reduce(xm.REDUCE_SUM, (local > 0).int(), scale=0.5)
    with pytest.raises(ShardingError, match="devices \\[1\\] are the target of more than one pair"):
        xm.collective_permute(local, [[0, 1], [2, 1]])
    with pytest.raises(ShardingError, match="out of range"):
        xm.collective_permute(local, [[0, 9]])
    with pytest.raises(ValueError, match="use_global_device_ids=False"):
        xm.all_gather(local, use_global_device_ids=False)
    with pytest.raises(IndexError, match="dim 2 is out of range"):
        xm.all_gather(local, dim=2)


@pytest.fixture
def one_device():
    """pjrt:0 over a single CPU device (SPMD on), the 8-device setup again afterwards."""
    ensure_cpu8()
    xs.sync()  # nothing pending of the 8-device setup is left for the new device
    devices.set_spmd(True)
    xs.set_plugin("cpu", options={"cpu_device_count": 1})
    yield xs.virtual_device()
    xs.sync()
    ensure_cpu8()


def test_a_region_on_a_one_device_mesh_runs_across_a_sync(one_device):
    """With one partition XLA reports every output replicated; a region's values stay {manual} all the same."""
    mesh = xs.Mesh([0], (1,), ("x",))
    x = torch.arange(8.0).reshape(2, 4).to("pjrt").requires_grad_()
    local = xs.enable_manual_sharding(x, ("x", None), mesh=mesh)
    gathered = xm.all_gather(xm.all_reduce(xm.REDUCE_SUM, local, scale=2.0), 0)
    xs.sync()
    assert gathered.sharding_spec == "{manual}"
    moved = xm.all_to_all(xm.collective_permute(gathered, [[0, 0]]), 0, 1, 1)
    out = xs.disable_manual_sharding(moved, ("x", None), (2, 4), mesh=mesh)
    out.sum().backward()
    assert torch.equal(out.detach().cpu(), 2 * torch.arange(8.0).reshape(2, 4))
    assert torch.equal(x.grad.cpu(), torch.full((2, 4), 2.0))


MARK_IN_REGION_CHILD = textwrap.dedent('''
    import torch, pjrt_plugins.spmd as xs
    from pjrt_plugins.errors import ShardingError
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    mesh = xs.Mesh(range(8), (8,), ("x",))
    x = torch.randn(16, 8)
    local = xs.enable_manual_sharding(xs.mark_sharding(x.to("pjrt"), mesh, ("x", None)), ("x", None), mesh=mesh)
    try:
        marked = xs.mark_sharding(local * 2, mesh, (None, "x"))
        xs.disable_manual_sharding(marked, ("x", None), (16, 8), mesh=mesh).cpu()
        print("no error")
    except ShardingError as exc:
        print("refused:", exc)
    print("after:", torch.equal((torch.ones(4).to("pjrt") + 1).cpu(), torch.full((4,), 2.0)))
''')


def test_a_sharding_mark_inside_a_region_is_refused_in_a_surviving_process():
    # XLA aborted the process on it (hlo_sharding.cc Check failed: !IsManual()); now the lowering refuses it.
    proc = subprocess.run([sys.executable, "-c", MARK_IN_REGION_CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the process died ({proc.returncode}): {proc.stderr[-1500:]}"
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("refused: mark_sharding on a value of a manual-sharding region"), proc.stdout
    assert lines[1] == "after: True", proc.stdout
