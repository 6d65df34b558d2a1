"""The DTensor bridge with PyTorch/XLA 2.9's names, checked against torch's own DTensor semantics: the per-device
pieces torch's DTensor computes, DTensor itself on a one-process gloo group, and the arithmetic otherwise."""

from __future__ import annotations

import copy
import itertools
import subprocess
import sys

import numpy as np
import pytest
import torch
from _dtensor_support import gloo, mesh2x4, mesh8  # noqa: F401
from _exec_support import ensure_cpu8
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import PlacementError, ShardingConflictError, ShardingError, UnsupportedPlacementError
from pjrt_plugins.spmd.dtensor import (
    auto_policy,
    convert_to_dtensor_placements,
    convert_to_xla_mesh,
    convert_to_xla_partition_spec,
    xla_distribute_module,
    xla_distribute_tensor,
)
from pjrt_plugins.spmd.transport import TensorState

NO_PLACEMENTS = ("Placements not available: XLAShardedTensor requires mesh_shape and partition_spec to be set. "
                 "Use mark_sharding() to properly initialize sharding information.")


# -- meshes ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,names", [((8,), None), ((8,), ("data_parallel",)), ((2, 4), ("dp", "tp")),
                                         ((1, 8), None), ((2, 2, 2), ("a", "b", "c"))])
def test_convert_to_xla_mesh_keeps_ids_shape_and_names(shape, names):
    ensure_cpu8()
    dt_mesh = xs.init_device_mesh("pjrt", shape, mesh_dim_names=names)
    mesh = convert_to_xla_mesh(dt_mesh)
    assert isinstance(mesh, xs.Mesh)
    assert mesh.mesh_shape == tuple(dt_mesh.mesh.shape) == shape
    assert mesh.device_ids.tolist() == dt_mesh.mesh.flatten().tolist()
    assert mesh.axis_names == dt_mesh.mesh_dim_names
    assert dt_mesh.device_type == "pjrt" and dt_mesh.size() == mesh.size() == 8


def test_convert_to_xla_mesh_keeps_a_permuted_device_order():
    ensure_cpu8()
    ids = torch.tensor([[3, 1, 0, 2], [7, 6, 5, 4]])
    mesh = convert_to_xla_mesh(DeviceMesh("pjrt", ids, _init_backend=False, _rank=0))
    assert mesh.device_ids.tolist() == ids.flatten().tolist()
    assert mesh.get_logical_mesh().tolist() == ids.tolist()


def test_meshes_of_the_wrong_size_or_device_type_are_refused():
    ensure_cpu8()
    with pytest.raises(PlacementError, match=r"covers 4 devices but the virtual device stands for 8"):
        convert_to_xla_mesh(DeviceMesh("pjrt", list(range(4)), _init_backend=False, _rank=0))
    with pytest.raises(PlacementError, match="'xla' is PyTorch/XLA's device"):
        convert_to_xla_mesh(DeviceMesh("xla", list(range(8))))
    with pytest.raises(PlacementError, match=r"mesh_shape \(2, 2\) holds 4 devices .* stands for 8"):
        xs.init_device_mesh("pjrt", (2, 2))
    with pytest.raises(PlacementError, match="not 'cuda'"):
        xs.init_device_mesh("cuda", (8,))
    with pytest.raises(ShardingError, match="must be unique"):
        xs.init_device_mesh("pjrt", (2, 4), mesh_dim_names=("a", "a"))
    with pytest.raises(TypeError, match="expects a torch DeviceMesh"):
        convert_to_xla_mesh(xs.Mesh(range(8), (8,)))


# -- distributing: each device's piece is the one DTensor gives that rank -------------------------------------------

LAYOUTS = [
    ((8,), (16, 3), [Shard(0)]),
    ((8,), (3, 10), [Shard(1)]),  # uneven: five pieces of 2, then three empty ones (torch.chunk's and XLA's)
    ((8,), (5, 4), [Shard(-2)]),
    ((8,), (4, 4), [Replicate()]),
    ((2, 4), (8, 12), [Shard(0), Shard(1)]),
    ((2, 4), (8, 12), [Shard(1), Shard(0)]),
    ((2, 4), (7, 6), [Replicate(), Shard(0)]),
    ((2, 4), (6, 9), [Shard(1), Replicate()]),
    ((2, 4), (16, 2), [Shard(0), Shard(0)]),  # two mesh dimensions on one tensor dimension
    ((2, 2, 2), (4, 6, 8), [Shard(2), Replicate(), Shard(0)]),
    ((2, 4), (), [Replicate(), Replicate()]),
]


@pytest.mark.parametrize("mesh_shape,shape,placements", LAYOUTS, ids=lambda v: str(v))
def test_each_device_holds_the_piece_dtensor_gives_its_rank(mesh_shape, shape, placements):
    ensure_cpu8()
    dt_mesh = xs.init_device_mesh("pjrt", mesh_shape)
    full = torch.arange(float(np.prod(shape))).reshape(shape) if shape else torch.tensor(3.0)
    t = xla_distribute_tensor(full, dt_mesh, placements)
    coords = dt_mesh.mesh
    for shard in t.local_shards:
        device = int(shard.shard_device.split(":")[-1])
        coordinate = [int(c) for c in (coords == device).nonzero()[0]]
        local_shape, offset = _compute_local_shape_and_global_offset(shape, mesh_shape, coordinate, placements)
        want = full[tuple(slice(o, o + n) for o, n in zip(offset, local_shape))] if shape else full
        assert torch.equal(shard.unpadded_data, want), (device, coordinate, shard.indices)
    assert torch.equal(t.cpu(), full)


def test_placements_survive_the_round_trip_through_the_sharding(mesh2x4):
    for placements in itertools.product([Replicate(), Shard(0), Shard(1), Shard(2)], repeat=2):
        t = xla_distribute_tensor(torch.zeros(4, 8, 4), mesh2x4, list(placements))
        assert t.placements == placements
        spec = convert_to_xla_partition_spec(t, placements)
        assert t.partition_spec == spec
        assert str(t.sharding) == str(xs.Mesh(range(8), (2, 4)).get_op_sharding(spec))
        assert convert_to_dtensor_placements(spec, mesh2x4) == placements


def test_convert_to_xla_partition_spec_follows_pytorch_xla():
    # PyTorch/XLA's docstring example: [Replicate(), Shard(0)] on a 2x4 mesh is partition spec (1, None, None).
    assert convert_to_xla_partition_spec(torch.randn(4, 8, 8), [Replicate(), Shard(0)]) == (1, None, None)
    assert convert_to_xla_partition_spec(torch.randn(4, 8), [Shard(1), Shard(0)]) == (1, 0)
    assert convert_to_xla_partition_spec(torch.randn(4, 8), [Shard(0), Shard(0)]) == ((0, 1), None)
    assert convert_to_xla_partition_spec(torch.randn(4, 8), [Shard(-1)]) == (None, 0)
    with pytest.raises(ValueError, match="pending-reduction"):  # PyTorch/XLA: ValueError
        convert_to_xla_partition_spec(torch.randn(4, 8), [Partial()])


def test_convert_to_dtensor_placements_reads_axis_names_and_refuses_what_placements_cannot_say():
    ensure_cpu8()
    mesh = xs.Mesh(range(8), (2, 4), ("dp", "tp"))
    assert convert_to_dtensor_placements(("tp", None), mesh) == (Replicate(), Shard(0))
    assert convert_to_dtensor_placements((None, ("dp", "tp")), mesh) == (Shard(1), Shard(1))
    with pytest.raises(PlacementError, match="later axis major"):
        convert_to_dtensor_placements((("tp", "dp"), None), mesh)


def test_placements_of_a_marked_tensor_follow_its_mesh():
    ensure_cpu8()
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    t = xs.mark_sharding(torch.zeros(8, 4).to("pjrt"), mesh, (None, "data"))
    assert t.placements == (Shard(1), Replicate())
    u = xs.mark_sharding(torch.zeros(8, 4).to("pjrt"), mesh, (("data", "model"), None))
    assert u.placements == (Shard(0), Shard(0))


def test_a_tensor_without_a_mesh_has_no_placements():
    ensure_cpu8()
    with pytest.raises(ValueError) as info:  # PyTorch/XLA's error and message, word for word
        _ = xs.XLAShardedTensor(torch.randn(4, 4)).placements
    assert str(info.value) == NO_PLACEMENTS
    mesh = xs.Mesh(range(8), (8,))
    x = xs.mark_sharding(torch.randn(8, 8).to("pjrt"), mesh, (0, None))
    y = x @ x  # the partitioner chooses y's sharding, over no mesh a user gave
    xs.sync()
    assert y.sharding_spec
    with pytest.raises(PlacementError, match="Placements not available"):
        _ = y.placements


def test_distributing_a_cpu_tensor_makes_a_leaf_that_keeps_requires_grad(mesh8):
    for requires_grad in (True, False):
        t = xla_distribute_tensor(torch.randn(24, 3, requires_grad=requires_grad), mesh8, [Shard(0)])
        assert isinstance(t, xs.XLAShardedTensor) and t.device.type == "pjrt"
        assert t.is_leaf and t.requires_grad is requires_grad
        assert t.shape == (24, 3) and t.local_shards[0].data.shape == (3, 3)


def test_distributing_a_pjrt_parameter_marks_it_in_place_and_survives_training(mesh8):
    # PyTorch/XLA's test_optimizer_step_with_sharding: the return value is dropped, the parameter is sharded.
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = copy.deepcopy(ref).to("pjrt")
    weight = model[0].weight
    xla_distribute_tensor(model[0].weight, mesh8, [Shard(0)])
    assert model[0].weight is weight
    spec = weight.sharding_spec
    assert spec == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    data, target = torch.randn(8, 16), torch.randint(0, 4, (8,))
    for net, inputs in ((model, (data.to("pjrt"), target.to("pjrt"))), (ref, (data, target))):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for _ in range(3):
            loss = torch.nn.functional.cross_entropy(net(inputs[0]), inputs[1])
            loss.backward()
            opt.step()
            opt.zero_grad()
            xs.sync()
            if net is model:
                assert model[0].weight.sharding_spec == spec and model[0].weight.placements == (Shard(0),)
    torch.testing.assert_close(model[0].weight.cpu(), ref[0].weight.detach(), rtol=1e-5, atol=1e-6)


def test_what_cannot_be_distributed_is_refused_before_xla_sees_it(mesh8, mesh2x4, gloo):
    cases = [
        (lambda: xla_distribute_tensor(torch.randn(4, 4), mesh8, [Partial()]), UnsupportedPlacementError,
         "pending-reduction"),
        (lambda: xla_distribute_tensor(torch.randn(4, 4), mesh8, [Shard(2)]), PlacementError,
         r"Shard\(dim=2\) on mesh dimension 0 shards a dimension the tensor does not have"),
        (lambda: xla_distribute_tensor(torch.randn(4, 4), mesh8, [Shard(0), Replicate()]), PlacementError,
         "2 placements .* for a mesh of 1 dimension"),
        (lambda: xla_distribute_tensor(torch.randn(4, 4), mesh2x4, [Shard(0)]), PlacementError,
         r"for a mesh of 2 dimensions \(sizes \(2, 4\)\)"),
        (lambda: xla_distribute_tensor(torch.randn(4, 4, device="meta"), mesh8, [Shard(0)]), PlacementError,
         "meta tensor"),
        (lambda: xla_distribute_tensor(torch.randn(4, 4), init_device_mesh("cpu", (1,)), [Shard(0)]), PlacementError,
         "device type 'cpu'"),
        (lambda: xla_distribute_tensor(distribute_tensor(torch.randn(4, 4), init_device_mesh("cpu", (1,))), mesh8),
         PlacementError, "The input tensor must be global"),
        (lambda: xla_distribute_tensor(torch.randn(4, 4), mesh8, Shard(0)), PlacementError, "a list or tuple"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message):
            call()
    t = xla_distribute_tensor(torch.randn(8, 8), mesh8, [Shard(0)])
    assert xla_distribute_tensor(t, mesh8, [Shard(0)]) is t  # the same layout again: nothing to do
    with pytest.raises(ShardingConflictError, match="clear_sharding"):
        xla_distribute_tensor(t, mesh8, [Shard(1)])


def test_a_sub_mesh_shards_along_its_root_mesh_axis(mesh2x4, gloo):
    tp = mesh2x4["tp"]
    t = xla_distribute_tensor(torch.arange(32.0).reshape(8, 4), tp, [Shard(0)])
    assert str(t.sharding) == str(xs.Mesh(range(8), (2, 4), ("dp", "tp")).get_op_sharding(("tp", None)))
    assert t.placements == (Shard(0),)
    dp = mesh2x4["dp"]
    u = xla_distribute_tensor(torch.arange(32.0).reshape(8, 4), dp, [Shard(1)])
    assert u.partition_spec == (None, 0) and u.placements == (Shard(1),)
    assert torch.equal(t.cpu(), u.cpu())
    with pytest.raises(PlacementError, match="is a sub-mesh"):
        convert_to_xla_mesh(tp)


# -- against DTensor itself, on a one-process gloo group ------------------------------------------------------------


@pytest.mark.parametrize("placements", [[Shard(0)], [Shard(-1)], [Replicate()]], ids=str)
def test_distribute_and_redistribute_agree_with_dtensor_on_gloo(placements, gloo, mesh8):
    cpu_mesh = init_device_mesh("cpu", (1,))
    full = torch.randn(8, 16, requires_grad=True)
    theirs = distribute_tensor(full, cpu_mesh, placements)
    ours = xla_distribute_tensor(full, mesh8, placements)
    assert ours.placements == theirs.placements  # Shard(-1) normalized to Shard(1) in both
    assert ours.is_leaf == theirs.is_leaf and ours.requires_grad == theirs.requires_grad
    assert torch.equal(ours.detach().cpu(), theirs.full_tensor().detach())
    for target in ([Replicate()], [Shard(1)], [Shard(0)]):
        moved_theirs = theirs.redistribute(cpu_mesh, target)
        moved_ours = ours.redistribute(mesh8, target)
        assert moved_ours.placements == moved_theirs.placements
        assert torch.equal(moved_ours.detach().cpu(), moved_theirs.full_tensor().detach())
        assert ours.placements == theirs.placements  # out of place: the source keeps its layout
    with pytest.raises(RuntimeError, match="redistributing to Partial is for internal use only"):
        theirs.redistribute(cpu_mesh, [Partial()])  # torch refuses it too, in its own words
    with pytest.raises(NotImplementedError):
        ours.redistribute(mesh8, [Partial()])
    with pytest.raises(ValueError, match="same length"):
        distribute_tensor(full, cpu_mesh, [Shard(0), Shard(0)])
    with pytest.raises(ValueError, match="same length"):
        xla_distribute_tensor(full, mesh8, [Shard(0), Shard(0)])


# -- redistribute ----------------------------------------------------------------------------------------------------


def test_redistribute_with_pytorch_xla_meshes_and_partition_specs():
    # PyTorch/XLA's test_dtensor_redistribute, on its xs.Mesh arguments.
    ensure_cpu8()
    mesh = xs.Mesh(np.arange(8), (8,))
    t = xs.mark_sharding(torch.randn(8, 16).to("pjrt"), mesh, (0, None))
    for placement, spec, sharding in ((Replicate(), (None, None), "{replicated}"),
                                      (Shard(0), (0, None), "{devices=[8,1]"),
                                      (Shard(1), (None, 0), "{devices=[1,8]")):
        moved = t.redistribute(mesh, [placement])
        assert moved.partition_spec == spec and moved.sharding_spec.startswith(sharding)
    mesh_2d = xs.Mesh(np.arange(8), (2, 4))
    u = xs.mark_sharding(torch.randn(8, 16).to("pjrt"), mesh_2d, (0, None))
    assert u.redistribute(mesh_2d, [Replicate(), Shard(1)]).partition_spec == (None, 1)
    moved = u.redistribute(mesh_2d, [Replicate(), Shard(0)], async_op=True)
    assert moved.partition_spec == (1, None)
    xs.sync()
    assert moved.sharding_spec.startswith("{devices=[4,1,2]")
    assert torch.equal(moved.cpu(), u.cpu())


def test_sync_redistribute_returns_resharded_data_and_async_waits_for_the_graph(mesh2x4):
    full = torch.randn(8, 12)
    t = xla_distribute_tensor(full, mesh2x4, [Shard(0), Replicate()])
    now = t.redistribute(mesh2x4, [Replicate(), Shard(1)])
    assert now._pjrt_data.state is TensorState.DEVICE
    assert now.sharding_spec == "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    later = t.redistribute(placements=[Shard(1), Shard(0)], async_op=True)  # default mesh: t's own
    assert later._pjrt_data.state is TensorState.LAZY and later.placements == (Shard(1), Shard(0))
    assert t.placements == (Shard(0), Replicate()) and t.sharding_spec.startswith("{devices=[2,1,4]")
    xs.sync()
    assert later.sharding_spec == "{devices=[4,2]0,4,1,5,2,6,3,7}"
    for moved in (now, later):
        assert torch.equal(moved.cpu(), full)


def test_redistribute_is_differentiable_and_lays_the_gradient_out_like_its_input(mesh2x4):
    w = xla_distribute_tensor(torch.randn(8, 12, requires_grad=True), mesh2x4, [Shard(0), Replicate()])
    moved = w.redistribute(mesh2x4, [Replicate(), Shard(1)], async_op=True)
    (moved * moved).sum().backward()
    xs.sync()
    torch.testing.assert_close(w.grad.cpu(), 2 * w.detach().cpu())
    assert w.grad.sharding_spec == w.sharding_spec


def test_redistribute_refuses_what_it_cannot_do(mesh8):
    t = xla_distribute_tensor(torch.randn(8, 16), mesh8, [Shard(0)])
    with pytest.raises(NotImplementedError, match="pending-reduction"):  # PyTorch/XLA: NotImplementedError
        t.redistribute(mesh8, [Partial()])
    with pytest.raises(PlacementError, match="shards a dimension the tensor does not have"):
        t.redistribute(mesh8, [Shard(2)])
    with pytest.raises(ValueError, match="give one placement per mesh dimension"):  # PyTorch/XLA: ValueError
        t.redistribute(mesh8, [Shard(0), Shard(1)])
    with pytest.raises(PlacementError, match="placements is needed"):
        t.redistribute(mesh8)
    with pytest.raises(PlacementError, match="never marked"):
        xs.XLAShardedTensor(torch.randn(2, 2)).redistribute(placements=[Replicate()])


# -- distributing modules -------------------------------------------------------------------------------------------


def test_xla_distribute_module_shards_with_partition_fn_and_trains_like_torch(mesh8):
    # PyTorch/XLA's test_xla_distribute_module, compared with CPU eager.
    torch.manual_seed(1)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    model = copy.deepcopy(ref)  # on the CPU: xla_distribute_module moves it

    def shard_params(name, module, mesh):
        if isinstance(module, torch.nn.Linear):
            for param in module.parameters():
                xla_distribute_tensor(param, mesh, [Shard(0)])

    sharded = xla_distribute_module(model, mesh8, shard_params)
    assert sharded is model and all(p.device.type == "pjrt" for p in model.parameters())
    assert all(p.placements == (Shard(0),) for p in model.parameters())
    data, target = torch.randn(16, 16), torch.randint(0, 8, (16,))
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(data.to("pjrt")), target.to("pjrt"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        xs.sync()
        ref_loss = torch.nn.functional.cross_entropy(ref(data), target)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-5)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def test_xla_distribute_module_replicates_what_partition_fn_leaves_and_installs_hooks(mesh8):
    seen = []

    def input_fn(module, inputs, mesh):
        seen.append(("in", mesh))
        return (inputs[0] * 2,)

    def output_fn(module, outputs, mesh):
        seen.append(("out", mesh))
        return outputs + 1

    model = xla_distribute_module(torch.nn.Linear(4, 2), mesh8, None, input_fn, output_fn)
    assert model.weight.placements == (Replicate(),) and model.bias.placements == (Replicate(),)
    x = torch.randn(3, 4)
    out = model(x.to("pjrt"))
    assert seen == [("in", mesh8), ("out", mesh8)]
    torch.testing.assert_close(out.cpu(), torch.nn.functional.linear(2 * x, model.weight.cpu(), model.bias.cpu()) + 1)
    with pytest.warns(FutureWarning, match="two arguments"):
        xla_distribute_module(torch.nn.Linear(4, 2), mesh8, input_fn=lambda inputs, mesh: inputs)
    with pytest.raises(ValueError, match="should take in 3 arguments"):
        xla_distribute_module(torch.nn.Linear(4, 2), mesh8, output_fn=lambda a, b, c, d: a)
    with pytest.raises(NotImplementedError, match="automatic sharding"):
        xla_distribute_module(torch.nn.Linear(4, 2), mesh8, auto_policy)
    with mesh8:  # the mesh of an enclosing `with`, as torch's distribute_module takes it
        assert xla_distribute_module(torch.nn.Linear(4, 2)).weight.placements == (Replicate(),)


# -- the package's names ----------------------------------------------------------------------------------------------


def test_the_bridge_loads_on_first_use_and_routes_torch_then():
    code = (
        "import sys, pjrt_plugins.spmd as xs\n"
        "print('torch.distributed.tensor' in sys.modules)\n"
        "f = xs.xla_distribute_tensor\n"
        "import torch.distributed.tensor as t, pjrt_plugins.spmd.dtensor as d, pjrt_plugins.spmd._dtensor_routes as r\n"
        "print(f is d.xla_distribute_tensor, r.installed() and t.distribute_tensor is t._api.distribute_tensor)\n"
        "print(sorted(set(xs.__all__) & set(d.__all__)) == sorted(d.__all__))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True).stdout
    assert out.split() == ["False", "True", "True", "True"]
