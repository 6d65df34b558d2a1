"""``xs.capture_step``: a training step traced until two calls in a row agree, then replayed without its Python.

Runs on the 8-device CPU plugin. The reference is the same loop traced every step (``xs.sync()`` per step), which the
replayed loop must match bit for bit (the same programs run on the same values), and CPU torch.
"""

from __future__ import annotations

import copy
import warnings
import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd.frontend._capture import MAX_TRACED_CALLS

from _exec_support import engine  # noqa: F401


def _model(dropout: float = 0.0) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 8))


def _batches(n: int, rows: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(rows, 16, generator=g), torch.randn(rows, 8, generator=g)) for _ in range(n)]


def _setup(model: nn.Module, capturable: bool = True, compiled: bool = False, lr: float | torch.Tensor = 0.01):
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    model = copy.deepcopy(model).to("pjrt")
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    xs.mark_sharding(model[3].weight, mesh, (None, "model"))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, capturable=capturable)
    forward = torch.compile(model, backend="pjrt") if compiled else model

    def step(x, y):
        loss = F.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    step.optimizer = opt  # type: ignore[attr-defined]  # for a scheduler
    return mesh, model, step


def _on_devices(batches, mesh):
    out = []
    for x, y in batches:
        x, y = x.to("pjrt"), y.to("pjrt")
        xs.mark_sharding(x, mesh, ("data", None))
        xs.mark_sharding(y, mesh, ("data", None))
        out.append((x, y))
    return out


def _traced_run(model, batches, **kw):
    """The reference: the same step traced every call."""
    mesh, model, step = _setup(model, **kw)
    losses = []
    for x, y in _on_devices(batches, mesh):
        losses.append(step(x, y))
        xs.sync()
    return [l.cpu() for l in losses], [p.detach().cpu() for p in model.parameters()]


def _captured_run(model, batches, **kw):
    mesh, model, step = _setup(model, **kw)
    captured = xs.capture_step(step)
    losses, ops, compiles = [], [], []
    for x, y in _on_devices(batches, mesh):
        before = xs.metrics()
        losses.append(captured(x, y))
        after = xs.metrics()
        ops.append(after.ops_recorded - before.ops_recorded)
        compiles.append(after.compiles - before.compiles)
    params = [p.detach().cpu() for p in model.parameters()]
    return [l.cpu() for l in losses], params, captured, ops, compiles


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_a_replayed_training_loop_equals_the_traced_one(engine, compiled):
    model, batches = _model(), _batches(6)
    ref_losses, ref_params = _traced_run(model, batches, compiled=compiled)
    losses, params, captured, ops, compiles = _captured_run(model, batches, compiled=compiled)
    # The first call makes AdamW's state, calls 2 and 3 agree: call 3 is recorded, 4 to 6 replay it.
    assert captured.traced_calls == 3 and captured.replays == 3
    assert ops[3:] == [0, 0, 0] and compiles[3:] == [0, 0, 0]
    for a, b in zip(losses + params, ref_losses + ref_params):
        assert torch.equal(a, b)
    # Each batch was read: the losses differ from step to step, and CPU torch agrees.
    cpu = _model()
    opt = torch.optim.AdamW(cpu.parameters(), lr=0.01)
    for (x, y), loss in zip(batches, losses):
        expected = F.mse_loss(cpu(x), y)
        expected.backward()
        opt.step()
        opt.zero_grad()
        torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-6)


def _replaying(calls: int, first: int):
    """A captured step on the devices, its first ``first`` of ``calls`` batches run: (model, step, captured, data)."""
    mesh, model, step = _setup(_model())
    captured = xs.capture_step(step)
    data = _on_devices(_batches(calls), mesh)
    for x, y in data[:first]:
        captured(x, y)
    return model, step, captured, data


def test_replays_donate_the_updated_state(engine):
    model, _, captured, data = _replaying(5, 3)
    before = xs.metrics().donated_buffers
    captured(*data[3])
    # 4 parameters with 2 AdamW moments and a step count each, on 8 devices.
    assert xs.metrics().donated_buffers - before >= 4 * 4 * 8
    # A name still holding a parameter's buffers keeps them from being donated: the replay runs undonated.
    held = list(model[0].weight._pjrt_data.buffers)
    before = xs.metrics().donated_buffers
    captured(*data[4])
    assert xs.metrics().donated_buffers == before
    assert not any(b.is_deleted for b in held)  # still readable
    assert captured.replays == 2


def _state_buffers(model: nn.Module, optimizer: torch.optim.Optimizer) -> list:
    tensors = [*model.parameters(), *(v for state in optimizer.state.values() for v in state.values())]
    return [b for t in tensors for b in t._pjrt_data.buffers]


def test_a_replay_reuses_the_donated_buffers_objects_for_its_outputs(engine):
    """What a replay donates comes back as its outputs' buffer objects, so a step makes almost no objects for
    Python's garbage collector (whose full passes took about 300 ms on a transformers model)."""
    model, step, captured, data = _replaying(6, 4)
    assert captured.replays == 1
    # Weak references: a strong one would keep the buffers from being donated.
    before = [weakref.ref(b) for b in _state_buffers(model, step.optimizer)]
    donated = xs.metrics().donated_buffers
    loss = captured(*data[4])
    assert xs.metrics().donated_buffers - donated == len(before) == 4 * 4 * 8  # every state buffer donated
    after = [*_state_buffers(model, step.optimizer), *loss._pjrt_data.buffers]
    assert all(ref() is not None for ref in before)  # not freed: each wraps a new value (the loss takes 8)
    assert {id(ref()) for ref in before} <= {id(b) for b in after}
    assert not any(b.is_deleted for b in after)
    _, ref_params = _traced_run(_model(), _batches(6)[:5])
    for p, ref in zip(model.parameters(), ref_params):
        assert torch.equal(p.detach().cpu(), ref)


def test_random_ops_draw_new_keys_on_every_replay(engine):
    model, batches = _model(dropout=0.5), _batches(6)
    torch.manual_seed(3)
    ref_losses, ref_params = _traced_run(model, batches)
    torch.manual_seed(3)
    losses, params, captured, _, _ = _captured_run(model, batches)
    assert captured.replays == 3
    for a, b in zip(losses + params, ref_losses + ref_params):
        assert torch.equal(a, b)


def test_python_numbers_that_change_every_call_keep_the_step_traced(engine):
    """AdamW without ``capturable`` computes its bias corrections in Python from a CPU step count: they change
    every call, so no two calls agree and the step is never replayed, with a warning saying why."""
    model, batches = _model(), _batches(MAX_TRACED_CALLS + 2)
    ref_losses, ref_params = _traced_run(model, batches, capturable=False)
    with pytest.warns(RuntimeWarning, match="no two calls in a row"):
        losses, params, captured, _, _ = _captured_run(model, batches, capturable=False)
    assert captured.replays == 0 and captured.traced_calls == len(batches)
    for a, b in zip(losses + params, ref_losses + ref_params):
        assert torch.equal(a, b)


def test_a_host_read_inside_the_step_keeps_it_traced(engine):
    mesh = xs.Mesh(range(8), (8,), ("data",))
    w = torch.ones(8, device="pjrt")

    def step(x):
        w.add_(x)
        if w.sum().item() > 100:  # a branch on a device value: its Python depends on the values
            w.zero_()
        return w * 2

    captured = xs.capture_step(step)
    x = torch.full((8,), 10.0).to("pjrt")
    xs.mark_sharding(x, mesh, ("data",))
    with pytest.warns(RuntimeWarning, match="host"):
        outs = [captured(x).cpu() for _ in range(4)]
    assert captured.replays == 0
    assert [o[0].item() for o in outs] == [22.0, 0.0, 20.0, 0.0]  # 8 x 11 <= 100 < 8 x 21


def test_a_new_shape_records_again_and_replays_stay_correct(engine):
    model = _model()
    small, large = _batches(4, rows=16), _batches(4, rows=32)
    mesh, pmodel, step = _setup(model)
    captured = xs.capture_step(step)
    ref_mesh, ref_model, ref_step = _setup(model)
    order = [small[0], small[1], small[2], large[0], large[1], large[2], small[3], large[3]]
    for (x, y), (rx, ry) in zip(_on_devices(order, mesh), _on_devices(order, ref_mesh)):
        a = captured(x, y)
        b = ref_step(rx, ry)
        xs.sync()
        assert torch.equal(a.cpu(), b.cpu())
    assert captured.replays == 3  # large[2] (large[0] and [1] agreed), small[3] and large[3]
    for p, q in zip(pmodel.parameters(), ref_model.parameters()):
        assert torch.equal(p.detach().cpu(), q.detach().cpu())


def test_results_keep_their_structure_and_constants(engine):
    state = torch.zeros(4, device="pjrt")

    def step(x):
        state.add_(x)
        return {"double": state * 2, "names": ("a", 1), "same": state.sum()}

    captured = xs.capture_step(step)
    x = torch.ones(4).to("pjrt")
    outs = [captured(x) for _ in range(5)]
    assert captured.replays >= 2
    assert [o["double"].cpu().tolist() for o in outs] == [[2.0 * k] * 4 for k in range(1, 6)]
    assert [o["same"].item() for o in outs] == [4.0 * k for k in range(1, 6)]
    assert all(o["names"] == ("a", 1) for o in outs)
    assert not outs[-1]["double"].requires_grad
    assert state.cpu().tolist() == [5.0] * 4


def test_bad_arguments_say_what_to_pass(engine):
    captured = xs.capture_step(lambda x: x * 2)
    with pytest.raises(TypeError, match=r"pjrt tensors or constants.*\.to\('pjrt'\)"):
        captured(torch.ones(2))
    with pytest.raises(ValueError, match="must not require grad"):
        captured(torch.ones(2, device="pjrt", requires_grad=True))
    with pytest.raises(TypeError, match="hashable constants"):
        captured(torch.ones(2, device="pjrt"), {1, 2})
    with pytest.raises(TypeError, match="needs a function"):
        xs.capture_step(3)


def test_returning_an_argument_is_never_replayed(engine):
    def step(x):
        x.mul_(2)
        return x

    captured = xs.capture_step(step)
    x = torch.ones(3).to("pjrt")
    with pytest.warns(RuntimeWarning, match="returned tensor 0 is an argument"):
        for _ in range(3):
            out = captured(x)
    assert out is x and x.cpu().tolist() == [8.0] * 3
    assert captured.replays == 0


def test_recapture_takes_a_changed_python_number(engine):
    scale = [2.0]
    acc = torch.zeros(2, device="pjrt")

    def step(x):
        acc.add_(x * scale[0])
        return acc.sum()

    captured = xs.capture_step(step)
    x = torch.ones(2).to("pjrt")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(5):  # call 1 reads the zeros' recipe, calls 2 and 3 read acc: 4 and 5 replay
            captured(x)
    assert captured.replays == 2 and acc.cpu().tolist() == [10.0, 10.0]
    scale[0] = 10.0
    captured.recapture()
    captured(x)
    assert acc.cpu().tolist() == [20.0, 20.0]


def test_weights_loaded_in_place_between_replays_are_read(engine):
    model, batches = _model(), _batches(4)
    mesh, pmodel, step = _setup(model)
    captured = xs.capture_step(step)
    data = _on_devices(batches, mesh)
    first = captured(*data[0])
    for x, y in data[1:]:
        captured(x, y)
    assert captured.replays == 1
    pmodel.load_state_dict(model.state_dict())  # copies the CPU weights into the same tensors
    again = captured(*data[0])
    assert captured.replays == 2  # replayed, on the loaded weights: the first call's loss again
    torch.testing.assert_close(again.cpu(), first.cpu(), rtol=1e-6, atol=1e-7)


def test_one_tensor_passed_twice_is_not_replayed_for_two(engine):
    acc = torch.zeros(3, device="pjrt")

    def step(a, b):
        acc.add_(a + 2 * b)
        return acc.sum()

    captured = xs.capture_step(step)
    x = torch.ones(3).to("pjrt")
    for _ in range(4):
        captured(x, x)  # records a step whose two arguments are one input
    assert captured.replays == 1
    y = torch.full((3,), 10.0).to("pjrt")
    acc.zero_()
    captured(x, y)
    assert acc.cpu().tolist() == [21.0] * 3


def _scheduled_run(model, batches, lr, captured: bool):
    """A loop whose learning rate halves every other step (set between calls, as a scheduler does)."""
    mesh, model, step = _setup(model, lr=lr)
    scheduler = torch.optim.lr_scheduler.StepLR(step.optimizer, step_size=2, gamma=0.5)
    run = xs.capture_step(step) if captured else step
    losses = []
    for x, y in _on_devices(batches, mesh):
        losses.append(run(x, y).cpu())
        xs.sync()
        scheduler.step()
    return losses, [p.detach().cpu() for p in model.parameters()], run


def test_a_learning_rate_changed_between_calls_is_not_replayed_stale(engine):
    """A Python learning rate is a number in the recorded program: once a scheduler changes it, the step records
    again instead of replaying the old rate."""
    model, batches = _model(), _batches(10)
    ref_losses, ref_params, _ = _scheduled_run(model, batches, 0.01, captured=False)
    with pytest.warns(RuntimeWarning, match="no two calls in a row"):
        losses, params, captured = _scheduled_run(model, batches, 0.01, captured=True)
    for a, b in zip(losses + params, ref_losses + ref_params):
        assert torch.equal(a, b)
    assert captured.replays == 0  # the rate changes every second call: two calls in a row never agree


def test_a_learning_rate_tensor_on_the_device_is_read_at_every_replay(engine):
    """With the rate in a pjrt tensor, the scheduler writes it in place and every replay reads it."""
    model, batches = _model(), _batches(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's note on tensor learning rates
        ref_losses, ref_params, _ = _scheduled_run(model, batches, torch.tensor(0.01, device="pjrt"), captured=False)
        losses, params, captured = _scheduled_run(model, batches, torch.tensor(0.01, device="pjrt"), captured=True)
    assert captured.replays == 5
    for a, b in zip(losses + params, ref_losses + ref_params):
        assert torch.equal(a, b)


def test_a_captured_method_records_one_step_per_instance(engine):
    class Counter:
        def __init__(self, start: float) -> None:
            self.total = torch.full((2,), start).to("pjrt")

        @xs.capture_step
        def add(self, x):
            self.total.add_(x)
            return self.total.sum()

    a, b = Counter(0.0), Counter(100.0)
    x = torch.ones(2).to("pjrt")
    sums = [(a.add(x).item(), b.add(x).item()) for _ in range(5)]
    assert sums == [(2.0 * k, 200.0 + 2.0 * k) for k in range(1, 6)]
    assert Counter.add.replays == 6  # calls 1 and 2 of each instance agree: 3 to 5 replay


def test_a_python_argument_that_changes_every_call_is_not_kept_forever(engine):
    acc = torch.zeros(2, device="pjrt")

    def step(x, number):
        acc.add_(x * number)
        return acc.sum()

    captured = xs.capture_step(step)
    x = torch.ones(2).to("pjrt")
    with pytest.warns(RuntimeWarning, match="more than 32 argument signatures"):
        for n in range(40):
            captured(x, n)
    assert len(captured._entries) <= 32 and captured.replays == 0
    assert acc.cpu().tolist() == [float(sum(range(40)))] * 2


def test_host_data_made_inside_the_step_is_a_constant_when_it_does_not_change(engine):
    """``torch.arange(n).to(device)`` inside a step (positions in a GPT) is the same every call: compared on the two
    calls that agree, it is recorded with its value. Host data that changes every call never replays."""
    acc = torch.zeros(4, device="pjrt")
    counter = [0]

    def step(x):
        acc.add_(x * torch.arange(4.0).to(x.device))
        return acc.sum()

    def changing(x):
        counter[0] += 1
        acc.add_(x * torch.tensor([float(counter[0])] * 4).to(x.device))
        return acc.sum()

    x = torch.ones(4).to("pjrt")
    captured = xs.capture_step(step)
    sums = [captured(x).item() for _ in range(5)]
    assert captured.replays == 2 and sums == [6.0 * k for k in range(1, 6)]  # calls 2 and 3 agree (1 read zeros)
    acc.zero_()
    captured = xs.capture_step(changing)
    with pytest.warns(RuntimeWarning, match="no two calls in a row"):
        sums = [captured(x).item() for _ in range(MAX_TRACED_CALLS + 1)]
    assert captured.replays == 0
    assert sums == [4.0 * sum(range(1, k + 1)) for k in range(1, MAX_TRACED_CALLS + 2)]


def test_large_host_data_made_inside_the_step_keeps_it_traced(engine):
    def step(x):
        return x + torch.ones(600_000).to(x.device)  # 2.4 MB made on the host every call

    captured = xs.capture_step(step)
    x = torch.zeros(600_000).to("pjrt")
    with pytest.warns(RuntimeWarning, match="more than 1048576 bytes"):
        outs = [captured(x) for _ in range(3)]
    assert captured.replays == 0 and outs[-1][:3].cpu().tolist() == [1.0] * 3
