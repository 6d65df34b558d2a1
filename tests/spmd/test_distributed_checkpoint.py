"""The SPMD planners with the real torch.distributed.checkpoint on the CPU plugin's 8 devices: each tile
written once and read from one device, loads into other meshes and shardings, uneven shards, optimizers,
clear errors for checkpoints that do not fit (PyTorch/XLA's test_xla_distributed_checkpoint.py, and more)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.planner import WriteItemType

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import CheckpointMismatchError
from pjrt_plugins.spmd.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner, prime_optimizer

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


class SimpleLinear(torch.nn.Module):
    """PyTorch/XLA's test model (test_xla_sharding_base.SimpleLinear)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(128, 128)
        self.relu = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.relu(self.fc1(x)))


def sharded_model(mesh_shape: tuple[int, ...] = (1, 8), spec: tuple = (0, 1), seed: int = 0) -> SimpleLinear:
    """fc1.weight sharded by ``spec``, fc2.weight explicitly replicated (PyTorch/XLA's _get_sharded_model)."""
    torch.manual_seed(seed)
    model = SimpleLinear().to("pjrt")
    mesh = xs.Mesh(range(8), mesh_shape)
    xs.mark_sharding(model.fc1.weight, mesh, spec)
    xs.mark_sharding(model.fc2.weight, mesh, (None, None))
    return model


def save(state_dict: dict, path: Path, planner: object = None) -> dcp.Metadata:
    return dcp.save(state_dict, checkpoint_id=str(path), planner=planner or SPMDSavePlanner(), no_dist=True)


def load(state_dict: dict, path: Path, planner: object = None) -> None:
    dcp.load(state_dict, checkpoint_id=str(path), planner=planner or SPMDLoadPlanner(), no_dist=True)


def stored_tensors(path: Path) -> dict[str, list[torch.Tensor]]:
    """Every tensor record in the checkpoint's files, read back as written, by key."""
    metadata = dcp.FileSystemReader(str(path)).read_metadata()
    found: dict[str, list[torch.Tensor]] = {}
    for index, info in metadata.storage_data.items():
        if not isinstance(metadata.state_dict_metadata[index.fqn], dcp.TensorStorageMetadata):
            continue
        with open(path / info.relative_path, "rb") as f:
            f.seek(info.offset)
            record = torch.load(io.BytesIO(f.read(info.length)), weights_only=True)
        found.setdefault(index.fqn, []).append(record)
    return found


# -- saving -----------------------------------------------------------------------------------


def test_each_tile_is_written_once_and_read_from_one_device(cpu8, tmp_path):
    torch.manual_seed(0)
    mesh = xs.Mesh(range(8), (2, 4))
    tiled = xs.mark_sharding(torch.randn(30, 50).to("pjrt"), mesh, (0, 1))        # 8 tiles, the last ones short
    partial = xs.mark_sharding(torch.randn(16, 8).to("pjrt"), mesh, (0, None))     # 2 tiles, each on 4 devices
    replicated = xs.mark_sharding(torch.randn(6, 5).to("pjrt"), mesh, (None, None))  # 1 copy on every device
    values = {k: v.cpu() for k, v in {"tiled": tiled, "partial": partial, "replicated": replicated}.items()}
    xs.reset_transfer_counters()
    metadata = save({"tiled": tiled, "partial": partial, "replicated": replicated}, tmp_path)
    moved = xs.transfer_counters()

    # One download per distinct tile, padding included (that is what a device holds), and nothing more.
    padded = 15 * 13 * 4 * 8 + 8 * 8 * 4 * 2 + 6 * 5 * 4
    assert moved.downloads == 8 + 2 + 1 and moved.total_downloaded == padded
    assert moved.total_uploaded == 0
    # The checkpoint holds the distinct tiles, none twice, without the padding, and they tile each tensor.
    chunks = {k: metadata.state_dict_metadata[k].chunks for k in values}
    assert [len(chunks[k]) for k in ("tiled", "partial", "replicated")] == [8, 2, 1]
    stored = stored_tensors(tmp_path)
    for key, value in values.items():
        assert sum(math.prod(c.sizes) for c in chunks[key]) == value.numel()
        assert sum(t.untyped_storage().nbytes() for t in stored[key]) == value.numel() * 4
        for chunk, piece in zip(chunks[key], stored[key]):
            region = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))
            assert torch.equal(piece, value[region])


def test_save_planner_separates_sharded_tensors_like_pytorch_xla(cpu8):
    model = sharded_model()
    planner = SPMDSavePlanner()
    planner.set_up_planner(model.state_dict(), True)  # PyTorch/XLA's older call: (state_dict, is_coordinator)
    assert planner.is_coordinator is True
    assert list(planner.sharded_state_dict) == ["fc1.weight"]
    # fc2.weight has an explicit replicated sharding: it is written whole, as the others
    assert sorted(planner.unsharded_state_dict) == ["fc1.bias", "fc2.bias", "fc2.weight"]
    plan = planner.create_local_plan()
    shard_items = [i for i in plan.items if i.index.fqn == "fc1.weight"]
    assert len(shard_items) == 8 and {i.type for i in shard_items} == {WriteItemType.SHARD}
    assert len(plan.items) - len(shard_items) == 3
    shards = model.fc1.weight.local_shards
    for item in shard_items:
        shard = next(s for s in shards if tuple(s.indices[d].start for d in range(2)) == tuple(item.index.offset))
        assert torch.equal(planner.resolve_data(item), shard.unpadded_data)


def test_the_plans_of_processes_holding_the_same_tiles_are_written_once(cpu8):
    model = sharded_model()
    plans = []
    for rank in range(2):  # two processes with the same model (e.g. data-parallel replicas)
        planner = SPMDSavePlanner()
        planner.set_up_planner(model.state_dict(), is_coordinator=rank == 0)
        plans.append(planner.create_local_plan())
    global_plan, metadata = planner.create_global_plan(plans)
    assert len(global_plan[0].items) == len(plans[0].items) and global_plan[1].items == []
    assert len(metadata.state_dict_metadata["fc1.weight"].chunks) == 8
    assert metadata.planner_data["fc1.weight"] == ("fc1.weight",)


def test_the_default_file_writer_and_torch_default_planner_work_on_pjrt_tensors(cpu8, tmp_path):
    # dcp.FileSystemWriter's defaults copy through the device's stream (torch.pjrt.current_stream())
    model = sharded_model()
    dcp.save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "spmd")),
             planner=SPMDSavePlanner(), no_dist=True)
    dcp.save({"model": model.state_dict()}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "default")),
             no_dist=True)
    for name in ("spmd", "default"):
        restored = {"model": SimpleLinear().state_dict()}
        load(restored, tmp_path / name, dcp.DefaultLoadPlanner())
        for key, value in model.state_dict().items():
            assert torch.equal(restored["model"][key], value.cpu()), (name, key)


# -- loading ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("mesh_shape", "spec"), [((2, 4), (0, 1)), ((8,), (0, None)), ((8,), (None, 0)),
                                                   ((4, 2), (0, 1)), ((4, 2), (1, 0))])
def test_a_checkpoint_saved_on_mesh_2x4_loads_on_other_meshes_and_shardings(cpu8, tmp_path, mesh_shape, spec):
    source = sharded_model((2, 4), (0, 1), seed=1)
    save({"model": source.state_dict()}, tmp_path)
    target = sharded_model(mesh_shape, spec, seed=2)
    wanted = target.fc1.weight.sharding_spec
    assert not torch.equal(target.fc1.weight.cpu(), source.fc1.weight.cpu())
    state = {"model": target.state_dict()}
    xs.reset_transfer_counters()
    load(state, tmp_path)
    moved = xs.transfer_counters()
    assert moved.total_downloaded == 0
    # each device received its own tile of fc1.weight (plus nothing: the other tensors stay on the host)
    tile = math.prod(xs.parse_sharding(wanted).shard_shape((128, 128))) * 4
    assert moved.uploaded == {d: tile for d in range(8)}
    target.load_state_dict(state["model"])
    assert target.fc1.weight.sharding_spec == wanted
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key].cpu(), value.cpu()), key


def test_resharding_between_sharded_and_unsharded(cpu8, tmp_path):
    sharded, plain = sharded_model(seed=1), SimpleLinear().to("pjrt")
    save({"model": sharded.state_dict()}, tmp_path / "a")
    load(state := {"model": plain.state_dict()}, tmp_path / "a")  # into replicated / host-held pjrt tensors
    plain.load_state_dict(state["model"])
    cpu_model = SimpleLinear()
    dcp.save({"model": cpu_model.state_dict()}, checkpoint_id=str(tmp_path / "b"), no_dist=True)  # torch's own
    target = sharded_model(seed=3)
    load(state := {"model": target.state_dict()}, tmp_path / "b")
    target.load_state_dict(state["model"])
    for key in cpu_model.state_dict():
        assert torch.equal(plain.state_dict()[key].cpu(), sharded.state_dict()[key].cpu()), key
        assert torch.equal(target.state_dict()[key].cpu(), cpu_model.state_dict()[key]), key
    assert target.fc1.weight.sharding_spec == "{devices=[1,8]0,1,2,3,4,5,6,7}"


@pytest.mark.parametrize(("shape", "mesh_shape", "saved", "loaded"), [
    ((127, 63), (8,), (0, None), (None, 0)),  # PyTorch/XLA's test_padded_tensor
    ((5, 3), (8,), (0, None), (0, None)),     # three devices hold nothing but padding
    ((9, 11), (2, 4), (0, 1), (1, 0)),
])
def test_uneven_shards_round_trip(cpu8, tmp_path, shape, mesh_shape, saved, loaded):
    mesh = xs.Mesh(range(8), mesh_shape)
    torch.manual_seed(0)
    value = torch.randn(shape)
    source = xs.mark_sharding(value.to("pjrt"), mesh, saved)
    metadata = save({"w": source}, tmp_path)
    assert sum(math.prod(c.sizes) for c in metadata.state_dict_metadata["w"].chunks) == value.numel()
    assert sum(t.untyped_storage().nbytes() for t in stored_tensors(tmp_path)["w"]) == value.numel() * 4
    target = xs.mark_sharding(torch.full(shape, 7.0).to("pjrt"), mesh, loaded)
    load({"w": target}, tmp_path)
    assert torch.equal(target.cpu(), value)
    for shard in target.local_shards:  # each device's padded shard: the tile, then zeros, as mark_sharding makes
        expected = torch.zeros_like(shard.data)
        expected[tuple(slice(0, s.stop - s.start) for s in shard.indices)] = value[tuple(shard.indices)]
        assert torch.equal(shard.data, expected), shard.shard_device


def test_a_marked_tensor_overwritten_on_the_host_is_saved_whole_and_loads_back_marked(cpu8, tmp_path):
    mesh = xs.Mesh(range(8), (2, 4))
    t = xs.mark_sharding(torch.zeros(8, 8).to("pjrt"), mesh, (0, 1))
    value = torch.randn(8, 8)
    t.copy_(value)  # back on the host until its next use, its declared sharding kept
    metadata = save({"t": t}, tmp_path)
    assert len(metadata.state_dict_metadata["t"].chunks) == 1
    target = xs.mark_sharding(torch.zeros(8, 8).to("pjrt"), mesh, (1, 0))
    load({"t": target}, tmp_path)
    assert torch.equal(target.cpu(), value) and target.sharding_spec == "{devices=[4,2]0,4,1,5,2,6,3,7}"


def test_load_planner_separates_tensors_and_fills_shards_only_when_complete(cpu8, tmp_path):
    model = sharded_model(seed=1)
    save(model.state_dict(), tmp_path)
    target = sharded_model(seed=2)
    old = [s.data.clone() for s in target.fc1.weight.local_shards]
    planner = SPMDLoadPlanner()
    planner.set_up_planner(target.state_dict(), dcp.FileSystemReader(str(tmp_path)).read_metadata(), True)
    assert list(planner.sharded_state_dict) == ["fc1.weight"]
    assert sorted(planner.unsharded_state_dict) == ["fc1.bias", "fc2.bias", "fc2.weight"]
    plan = planner.create_local_plan()
    items = [i for i in plan.items if i.dest_index.fqn == "fc1.weight"]
    assert len(items) == 8
    for item in items:
        assert all(torch.equal(a.data, b) for a, b in zip(target.fc1.weight.local_shards, old))
        tensor = planner.resolve_tensor(item)
        tensor.fill_(-1.0)
        planner.commit_tensor(item, tensor)
    assert torch.equal(target.fc1.weight.cpu(), torch.full((128, 128), -1.0))


def test_optimizer_state_round_trips_through_prime_optimizer(cpu8, tmp_path):
    for optim_cls in (torch.optim.SGD, torch.optim.AdamW):
        model = sharded_model(seed=1)
        optim = optim_cls(model.parameters(), lr=0.1, **({"momentum": 0.9} if optim_cls is torch.optim.SGD else {}))
        model(torch.ones(10, 128).to("pjrt")).square().sum().backward()
        optim.step()
        xs.sync()
        saved = {"model": model.state_dict(), "optim": optim.state_dict()}
        save(saved, tmp_path / optim_cls.__name__)

        new_model = sharded_model(seed=2)
        new_optim = optim_cls(new_model.parameters(), lr=0.1, **({"momentum": 0.9} if optim_cls is torch.optim.SGD
                                                                   else {}))
        assert new_optim.state_dict()["state"] == {}
        prime_optimizer(new_optim)
        assert all(p.grad is None for p in new_model.parameters())
        state = {"model": new_model.state_dict(), "optim": new_optim.state_dict()}
        load(state, tmp_path / optim_cls.__name__)
        new_model.load_state_dict(state["model"])
        new_optim.load_state_dict(state["optim"])
        _assert_same(new_optim.state_dict(), optim.state_dict())
        _assert_same(new_model.state_dict(), model.state_dict())


def _assert_same(a: object, b: object, path: str = "") -> None:
    assert type(a) is type(b), path
    if isinstance(a, torch.Tensor):
        assert a.device == b.device and torch.equal(a.cpu(), b.cpu()), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _assert_same(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


# -- checkpoints that do not fit ------------------------------------------------------------------


def _load_error(state: dict, path: Path) -> CheckpointMismatchError:
    with pytest.raises(dcp.CheckpointException) as caught:
        load(state, path)
    (error, _), = caught.value.failures.values()
    assert isinstance(error, CheckpointMismatchError), error
    assert str(error) in str(caught.value)
    return error


def test_a_checkpoint_that_does_not_fit_gets_a_clear_error_before_any_data_moves(cpu8, tmp_path):
    model = sharded_model(seed=1)
    save({"model": model.state_dict(), "epoch": 3}, tmp_path)

    other = {"model": torch.nn.Sequential(torch.nn.Linear(4, 4)).to("pjrt").state_dict()}
    message = str(_load_error(other, tmp_path))
    assert "none of the state dict's 2 keys" in message and "another model" in message

    missing = {"model": {**sharded_model(seed=2).state_dict(), "fc3.weight": torch.zeros(2).to("pjrt")}}
    before = missing["model"]["fc1.weight"].cpu()
    assert "'model.fc3.weight'" in str(_load_error(missing, tmp_path))
    assert torch.equal(missing["model"]["fc1.weight"].cpu(), before)  # nothing was loaded

    wider = torch.nn.Linear(128, 256).to("pjrt")
    shapes = {"model": {**sharded_model().state_dict(), "fc1.weight": wider.weight}}
    message = str(_load_error(shapes, tmp_path))
    assert "model.fc1.weight has shape (256, 128)" in message and "(128, 128) in the checkpoint" in message

    kinds = {"model": sharded_model().state_dict(), "epoch": torch.zeros(()).to("pjrt")}
    assert "epoch is a tensor in the state dict but an object in the checkpoint" in str(_load_error(kinds, tmp_path))
    kinds = {"model": {**sharded_model().state_dict(), "fc2.bias": 0.5}}
    assert "model.fc2.bias is a float in the state dict but a tensor of shape (1,)" in str(
        _load_error(kinds, tmp_path))


def test_objects_and_cpu_tensors_load_in_place_with_pjrt_tensors(cpu8, tmp_path):
    rng = {"cpu": torch.get_rng_state(), "pjrt": torch.pjrt.get_rng_state()}
    save({"rng": rng, "step": 7, "groups": [{"lr": 0.5, "params": [0, 1]}], "w": sharded_model().fc1.weight}, tmp_path)
    state = {"rng": {"cpu": torch.zeros_like(rng["cpu"]), "pjrt": torch.zeros(16, dtype=torch.uint8)}, "step": 0,
             "groups": [{"lr": 0.0, "params": []}], "w": sharded_model(seed=5).fc1.weight.detach()}
    load(state, tmp_path)
    assert torch.equal(state["rng"]["cpu"], rng["cpu"]) and torch.equal(state["rng"]["pjrt"], rng["pjrt"])
    assert state["step"] == 7 and state["groups"] == [{"lr": 0.5, "params": [0, 1]}]
    assert torch.equal(state["w"].cpu(), sharded_model().fc1.weight.cpu())


def test_dcp_async_save_of_pjrt_tensors_fails_clearly(cpu8, tmp_path):
    # Its stager copies each tensor's storage and attributes, which a pjrt tensor's device buffers are not:
    # CheckpointManager.save_async is the asynchronous save for them (docs/missing.md).
    with pytest.raises(TypeError, match="the data of a pjrt tensor .* cannot be copied or pickled on its own"):
        dcp.async_save({"model": sharded_model().state_dict()}, checkpoint_id=str(tmp_path), no_dist=True)
