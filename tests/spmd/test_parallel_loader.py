"""MpDeviceLoader / ParallelLoader with input shardings: real DataLoaders feed training loops, each device
receives only its shard (the transfer counters show it), and a batch that does not fit its specs fails with
a clear error before anything of it is uploaded."""

from __future__ import annotations

import copy
import threading
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, TensorDataset

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import InputShardingError, ShardingError, VirtualDeviceError
from pjrt_plugins.spmd.parallel_loader import MpDeviceLoader, ParallelLoader

from _exec_support import assert_close, engine  # noqa: F401

BATCH, FEATURES = 16, 12


class DictDataset(Dataset):
    """Samples as dicts, as tokenized text datasets give them."""

    def __init__(self, n: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, FEATURES, generator=g)
        self.y = torch.randn(n, 3, generator=g)
        self.w = torch.rand(n, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i], "weight": self.w[i]}


def _mesh() -> xs.Mesh:
    return xs.Mesh(range(8), (8,), ("data",))


def _specs(mesh: xs.Mesh) -> dict[str, xs.ShardingSpec]:
    return {"x": xs.ShardingSpec(mesh, ("data", None)), "y": xs.ShardingSpec(mesh, ("data", None)),
            "weight": xs.ShardingSpec(mesh, ("data",))}


def test_a_dict_of_input_shardings_feeds_a_training_loop_like_cpu(engine):
    torch.manual_seed(0)
    mesh = _mesh()
    dataset = DictDataset(4 * BATCH)
    ref = nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 3))
    model = copy.deepcopy(ref).to("pjrt")
    xs.mark_sharding(model[0].weight, mesh, ("data", None))
    opt_ref, opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model))
    loader = MpDeviceLoader(DataLoader(dataset, batch_size=BATCH), xs.device(), input_sharding=_specs(mesh))
    assert len(loader) == 4
    losses = []
    for batch, cpu_batch in zip(loader, DataLoader(dataset, batch_size=BATCH)):
        assert batch["x"].sharding_spec == "{devices=[8,1]0,1,2,3,4,5,6,7}"
        assert batch["weight"].sharding_spec == "{devices=[8]0,1,2,3,4,5,6,7}"
        loss = (F.mse_loss(model(batch["x"]), batch["y"], reduction="none").mean(1) * batch["weight"]).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()  # no sync(): taking the next batch runs the step, as in PyTorch/XLA
        ref_loss = (F.mse_loss(ref(cpu_batch["x"]), cpu_batch["y"], reduction="none").mean(1)
                    * cpu_batch["weight"]).mean()
        ref_loss.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        losses.append((loss, ref_loss.detach()))
    assert len(losses) == 4
    assert xs.metrics().executions >= 3  # the steps ran while iterating
    for i, (loss, ref_loss) in enumerate(losses):
        assert_close(f"loss {i}", loss.cpu(), ref_loss, rtol=1e-5, atol=1e-6)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        assert_close(name, p.cpu(), r, rtol=1e-5, atol=1e-6)


def test_each_device_receives_only_its_shard(engine):
    mesh = _mesh()
    loader = MpDeviceLoader(DataLoader(DictDataset(2 * BATCH), batch_size=BATCH), xs.device(),
                            input_sharding=_specs(mesh))
    xs.reset_transfer_counters()
    batches = list(loader)
    per_device = (BATCH // 8) * (FEATURES + 3 + 1) * 4  # two rows of x, y and weight, float32
    counters = xs.transfer_counters()
    assert counters.uploaded == {d: 2 * per_device for d in range(8)}
    assert counters.total_uploaded == 2 * BATCH * (FEATURES + 3 + 1) * 4  # the batches' bytes, once
    assert counters.uploads == 2 * 3 * 8  # one buffer per tensor per device
    for batch in batches:
        shards = batch["x"].local_shards
        assert [s.indices for s in shards][1] == [slice(2, 4, 1), slice(0, FEATURES, 1)]


def test_one_spec_shards_the_tensors_it_fits_and_replicates_the_others(engine):
    mesh = _mesh()
    dataset = TensorDataset(torch.randn(BATCH, FEATURES), torch.arange(BATCH))
    loader = MpDeviceLoader(DataLoader(dataset, batch_size=BATCH), xs.device(),
                            input_sharding=xs.ShardingSpec(mesh, ("data", None)))
    xs.reset_transfer_counters()
    (x, labels), = list(loader)
    assert x.sharding_spec == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert labels.sharding_spec == ""  # rank 1: the rank-2 spec does not apply (PyTorch/XLA's rule): unmarked,
    # uploaded whole to every device (replicated) ahead of the loop
    assert xs.transfer_counters().uploaded == {d: 2 * FEATURES * 4 + BATCH * 8 for d in range(8)}
    assert torch.equal(labels.cpu(), torch.arange(BATCH)) and torch.equal(x.cpu(), dataset.tensors[0])


def test_a_batch_that_does_not_fit_its_specs_fails_before_any_upload(engine):
    mesh = _mesh()
    data = DataLoader(DictDataset(BATCH), batch_size=BATCH)
    missing_key = MpDeviceLoader(data, xs.device(), input_sharding={"x": xs.ShardingSpec(mesh, ("data", None))})
    xs.reset_transfer_counters()
    with pytest.raises(InputShardingError, match=r"keys \['weight', 'y'\] that input_sharding does not name") as info:
        next(iter(missing_key))
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ShardingError)
    wrong_rank = MpDeviceLoader(data, xs.device(), input_sharding={**_specs(mesh),
                                                                   "weight": xs.ShardingSpec(mesh, ("data", None))})
    with pytest.raises(InputShardingError, match=r"input_sharding\['weight'\] has 2 partition-spec entries but "
                                                 r"batch\['weight'\] has shape \(16,\)"):
        next(iter(wrong_rank))
    not_a_dict = MpDeviceLoader(DataLoader(TensorDataset(torch.randn(BATCH, 2)), batch_size=BATCH), xs.device(),
                                input_sharding=_specs(mesh))
    with pytest.raises(InputShardingError, match="each batch must be a dict too; got list"):
        next(iter(not_a_dict))
    uneven = MpDeviceLoader(DataLoader(DictDataset(12), batch_size=12), xs.device(),
                            input_sharding={k: xs.ShardingSpec(s.mesh, s.partition_spec, minibatch=True)
                                            for k, s in _specs(mesh).items()})
    with pytest.raises(InputShardingError, match="minibatch=True .* divide by the process's 8 devices"):
        next(iter(uneven))
    assert xs.transfer_counters().uploads == 0  # nothing of any of these batches moved


def test_a_bad_spec_or_mesh_fails_where_it_is_made(fresh_device_state):
    with pytest.raises(ShardingError, match="unknown mesh axis name 'batch'"):
        xs.ShardingSpec(xs.Mesh(range(4), (4,), ("data",)), ("batch", None))
    eight = xs.Mesh(range(8), (8,), ("data",))  # built before the device exists: checked at first use
    xs.set_plugin("stub_neuron", options={"num_devices": 4})
    xs.virtual_device()
    with pytest.raises(ShardingError, match="covers 8 devices but the virtual device stands for 4"):
        ParallelLoader([], [xs.device()], input_sharding=xs.ShardingSpec(eight, ("data", None)))
    with pytest.raises(TypeError, match="input_sharding must be an xs.ShardingSpec or a dict of them"):
        ParallelLoader([], [xs.device()], input_sharding=("data", None))
    with pytest.raises(VirtualDeviceError, match="is not the virtual device"):
        ParallelLoader([], ["cpu"])
    with pytest.raises(ValueError, match="give the one virtual device"):
        ParallelLoader([], ["pjrt:0", "pjrt:0"])
    assert xs.transfer_counters().uploads == 0


def test_the_shardingspec_of_pytorch_xla(stub4):
    mesh = xs.Mesh(range(4), (2, 2), ("x", "y"))
    spec = xs.ShardingSpec(mesh, ("x", None))
    assert spec.minibatch is False and spec.can_apply(torch.zeros(2, 2)) and not spec.can_apply(torch.zeros(2))
    assert str(spec.xla_spec(torch.zeros(2, 2))) == "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"
    assert spec.xla_spec(torch.zeros(3)) is None
    t = spec.apply(torch.zeros(4, 4).to("pjrt"))
    assert t.sharding_spec == "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"


def test_batches_keep_their_order_with_several_upload_threads_and_prefetch_ahead(stub4):
    mesh = xs.Mesh(range(4), (4,), ("data",))
    batches = [torch.full((8, 2), float(i)) for i in range(12)]
    seen = []

    class Slow:
        def __iter__(self):
            for b in batches:
                seen.append(float(b[0, 0]))
                yield b

        def __len__(self) -> int:
            return len(batches)

    loader = ParallelLoader(Slow(), [xs.device()], device_prefetch_size=3, host_to_device_transfer_threads=3,
                            input_sharding=xs.ShardingSpec(mesh, ("data", None)))
    deadline = time.monotonic() + 30
    while len(seen) < 4 and time.monotonic() < deadline:  # the background thread reads ahead of the loop
        time.sleep(0.01)
    assert 4 <= len(seen) <= 5  # three uploaded batches queued, one more waiting to be queued
    out = [b.cpu()[0, 0].item() for b in loader.per_device_loader(xs.device())]
    assert out == [float(i) for i in range(12)]


def test_an_error_in_the_dataloader_reaches_the_loop_and_a_break_stops_the_threads(stub4):
    class Broken(Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> torch.Tensor:
            if i == 5:
                raise IndexError("sample 5 is corrupt")
            return torch.full((4,), float(i))

    it = iter(MpDeviceLoader(DataLoader(Broken(), batch_size=1), xs.device()))
    got = [next(it).cpu()[0, 0].item() for _ in range(5)]
    assert got == [0.0, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises(IndexError, match="sample 5 is corrupt"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)

    threads = threading.active_count()
    for _ in MpDeviceLoader(DataLoader(TensorDataset(torch.zeros(100, 4)), batch_size=1), xs.device()):
        break  # leaves the loader with a full queue
    deadline = time.monotonic() + 30
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= threads
