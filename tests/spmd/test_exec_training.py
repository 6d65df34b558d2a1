"""Training on sharded tensors: an MLP step (data x model parallel on mesh (2, 4)) against plain torch.

The model runs lazily on pjrt:0 (8 CPU devices); the reference is the same model on the CPU.
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

import pjrt_plugins.spmd as xs

from pjrt_plugins.spmd.transport import TensorState

from _exec_support import assert_close, engine  # noqa: F401


def _mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 8))


def _shard_mlp(model: nn.Sequential, mesh: xs.Mesh) -> None:
    """Megatron-style: first layer split by rows (model axis), second by columns; the last one replicated."""
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    xs.mark_sharding(model[0].bias, mesh, ("model",))
    xs.mark_sharding(model[2].weight, mesh, (None, "model"))


def _batches(n: int):
    g = torch.Generator().manual_seed(42)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)) for _ in range(n)]


def _train(model, batches, *, device=None, mesh=None, sync=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for x, y in batches:
        if device is not None:
            x, y = x.to(device), y.to(device)
            xs.mark_sharding(x, mesh, ("data", None))
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sync:
            xs.sync()
        losses.append(loss)
    return losses


def test_mlp_forward_backward_sgd_matches_torch_on_a_2d_mesh(engine):
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    ref = _mlp()
    model = copy.deepcopy(ref).to("pjrt")
    _shard_mlp(model, mesh)
    batches = _batches(3)
    ref_losses = _train(ref, batches)
    losses = _train(model, batches, device="pjrt", mesh=mesh, sync=True)
    for i, (loss, ref_loss) in enumerate(zip(losses, ref_losses)):
        assert_close(f"loss {i}", loss.cpu(), ref_loss)
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert isinstance(p, xs.XLAShardedTensor)
        assert_close(name, p.cpu(), r, rtol=1e-5, atol=1e-6)
    # Parameters keep the layout they were marked with; the results live on the devices.
    assert model[0].weight.sharding_spec == "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    assert model[2].weight.sharding_spec == "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    assert model[0].weight._pjrt_data.state is TensorState.DEVICE
    shard = model[0].weight.local_shards[1]
    assert tuple(shard.data.shape) == (16, 32)


def test_ten_repeated_steps_compile_exactly_once(engine):
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    model = _mlp(1).to("pjrt")
    _shard_mlp(model, mesh)
    xs.clear_compile_cache()
    xs.reset_metrics()
    losses = _train(model, _batches(10), device="pjrt", mesh=mesh, sync=True)
    m = xs.metrics()
    assert m.compiles == 1, m.report()
    assert m.cache_hits == 9
    assert m.executions == 10
    assert m.fallbacks == 0
    assert m.bytes_downloaded == 0  # nothing was read back during training
    assert m.bytes_uploaded > 0  # the batches
    values = [loss.item() for loss in losses]
    assert values[-1] < values[0]
    assert "compiles:              1" in xs.metrics_report()


def test_gradients_accumulate_over_two_backward_passes(engine):
    ref = _mlp(2)
    model = copy.deepcopy(ref).to("pjrt")
    (x1, y1), (x2, y2) = _batches(2)
    for m, dev in ((ref, None), (model, "pjrt")):
        for x, y in ((x1, y1), (x2, y2)):
            if dev:
                x, y = x.to(dev), y.to(dev)
            F.mse_loss(m(x), y).backward()
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert_close(f"{name}.grad", p.grad.cpu(), r.grad)


def test_inplace_update_of_unmarked_parameters_keeps_their_layout(engine):
    w = torch.randn(8, 8).to("pjrt")
    g = torch.randn(8, 8)
    x = torch.randn(8, 8)
    w_ref = w.cpu().clone()
    for _ in range(3):
        with torch.no_grad():
            w.sub_(0.1 * (w @ g.to("pjrt")))
        w_ref -= 0.1 * (w_ref @ g)
        xs.sync()
    assert_close("w", w.cpu(), w_ref)
    assert w.sharding_spec == "{replicated}"
    assert_close("w @ x", (w @ x.to("pjrt")).cpu(), w_ref @ x)


def test_adam_with_a_learning_rate_schedule_matches_torch_and_stops_compiling(engine):
    """Adam's bias corrections and the scheduled learning rate change every step: they are run-time
    scalars, not constants, so after the first step (which creates the optimizer state) nothing compiles."""
    ref = _mlp(3)
    model = copy.deepcopy(ref).to("pjrt")
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    _shard_mlp(model, mesh)
    opts = [torch.optim.Adam(m.parameters(), lr=0.01) for m in (ref, model)]
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in opts]
    xs.clear_compile_cache()
    xs.reset_metrics()
    compiles = []
    for x, y in _batches(6):
        for m, opt, sched, dev in zip((ref, model), opts, scheds, (None, "pjrt")):
            if dev:
                x, y = x.to(dev), y.to(dev)
            F.mse_loss(m(x), y).backward()
            opt.step()
            opt.zero_grad()
            sched.step()
        xs.sync()
        compiles.append(xs.metrics().compiles)
    assert compiles == [1, 2, 2, 2, 2, 2]
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert_close(name, p.cpu(), r, rtol=1e-5, atol=1e-6)


def test_unchanged_run_time_scalars_are_not_uploaded_again(engine):
    """A constant learning rate is a run-time scalar whose replicated buffers the next step reuses:
    a steady step moves no bytes; a changed rate is uploaded once, and the results follow torch."""
    ref = _mlp(4)
    model = copy.deepcopy(ref).to("pjrt")
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    _shard_mlp(model, mesh)
    [(x, y)] = _batches(1)
    xp = xs.mark_sharding(x.to("pjrt"), mesh, ("data", None))
    yp = xs.mark_sharding(y.to("pjrt"), mesh, ("data", None))
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ref, model)]

    def step() -> None:
        for m, opt, (a, b) in zip((ref, model), opts, ((x, y), (xp, yp))):
            F.mse_loss(m(a), b).backward()
            opt.step()
            opt.zero_grad()
        xs.sync()

    step()
    step()
    uploaded = []
    for lr in (0.05, 0.05, 0.02, 0.02):
        for opt in opts:
            opt.param_groups[0]["lr"] = lr
        xs.reset_transfer_counters()
        step()
        uploaded.append(xs.transfer_counters().uploaded)
    assert uploaded[0] == uploaded[1] == uploaded[3] == {}  # nothing moved: same scalars, same buffers
    assert set(uploaded[2]) == set(range(8)) and len(set(uploaded[2].values())) == 1  # the new rate, replicated
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert_close(name, p.cpu(), r, rtol=1e-5, atol=1e-6)
