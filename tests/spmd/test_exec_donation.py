"""Buffer donation: a step that updates parameters and optimizer state in place writes them into their old
buffers (``tf.aliasing_output``), with the same results as without, and never when something else can still
read the old buffers.

Runs on the 8-device CPU plugin; the reference is the same loop with donation off (bit-identical) and CPU torch.
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import execution
from pjrt_plugins.spmd.lowering import _module
from pjrt_plugins.spmd.trace import ENGINE

from _exec_support import engine  # noqa: F401


@pytest.fixture
def donation():
    """Donation on for the test, back to the default afterwards."""
    xs.set_donation(True)
    yield
    xs.set_donation(True)


def _model(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _batches(n: int):
    g = torch.Generator().manual_seed(7)
    return [(torch.randn(16, 16, generator=g), torch.randn(16, 8, generator=g)) for _ in range(n)]


def _train(model, make_opt, batches, mesh, *, donate: bool, compiled: bool = False):
    xs.set_donation(donate)
    model = copy.deepcopy(model).to("pjrt")
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    xs.mark_sharding(model[2].weight, mesh, (None, "model"))
    opt = make_opt(model.parameters())
    forward = torch.compile(model, backend="pjrt") if compiled else model
    before = xs.metrics().donated_buffers
    losses = []
    for x, y in batches:
        x, y = x.to("pjrt"), y.to("pjrt")
        xs.mark_sharding(x, mesh, ("data", None))
        loss = F.mse_loss(forward(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        xs.sync()
        losses.append(loss.detach().cpu())
    params = [p.detach().cpu() for p in model.parameters()]
    return losses, params, xs.metrics().donated_buffers - before


OPTIMIZERS = {
    "sgd_foreach": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=True),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True),
    "adamw_for_loop": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=False),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_training_is_bit_identical_with_and_without_donation(engine, donation, name):
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    model, batches = _model(), _batches(3)
    on = _train(model, OPTIMIZERS[name], batches, mesh, donate=True)
    text = execution.last_program().lowered.text
    off = _train(model, OPTIMIZERS[name], batches, mesh, donate=False)
    for a, b in zip(on[0] + on[1], off[0] + off[1]):
        assert torch.equal(a, b)
    # Every parameter (4) is donated once its step updates it in place, on each of 8 devices.
    assert on[2] >= 4 * 8 * 2
    assert "tf.aliasing_output" in text
    assert off[2] == 0
    # And both match CPU torch.
    ref = _model()
    opt = OPTIMIZERS[name](ref.parameters())
    for x, y in batches:
        F.mse_loss(ref(x), y).backward()
        opt.step()
        opt.zero_grad()
    for p, q in zip(on[1], ref.parameters()):
        torch.testing.assert_close(p, q.detach(), rtol=1e-5, atol=1e-6)


def test_a_compiled_step_is_bit_identical_with_and_without_donation(engine, donation):
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    model, batches = _model(), _batches(3)
    on = _train(model, OPTIMIZERS["adamw_foreach"], batches, mesh, donate=True, compiled=True)
    off = _train(model, OPTIMIZERS["adamw_foreach"], batches, mesh, donate=False, compiled=True)
    for a, b in zip(on[0] + on[1], off[0] + off[1]):
        assert torch.equal(a, b)
    assert on[2] > 0 and off[2] == 0


def _step(p: torch.Tensor) -> None:
    with torch.no_grad():
        p.mul_(2).add_(1)


def test_an_in_place_update_donates_and_the_new_value_is_right(engine, donation):
    p = torch.arange(16.0).reshape(4, 4).to("pjrt")
    xs.sync()
    before = xs.metrics().donated_buffers
    _step(p)
    xs.sync()
    assert xs.metrics().donated_buffers - before == 8
    assert torch.equal(p.cpu(), torch.arange(16.0).reshape(4, 4) * 2 + 1)


def test_buffers_held_elsewhere_are_not_donated_and_keep_their_old_value(engine, donation):
    p = torch.arange(16.0).reshape(4, 4).to("pjrt")
    _step(p)
    xs.sync()  # p now holds device buffers a program wrote
    held = list(p._pjrt_data.buffers)  # anything holding the old buffers, known to the engine or not
    before = xs.metrics().donated_buffers
    _step(p)
    xs.sync()
    assert xs.metrics().donated_buffers == before
    assert not any(b.is_deleted for b in held)
    old = torch.arange(16.0).reshape(4, 4) * 2 + 1
    assert all(b.to_numpy().tolist() == old.tolist() for b in held)  # replicated: each device has it all
    assert torch.equal(p.cpu(), old * 2 + 1)
    del held
    _step(p)
    xs.sync()
    assert xs.metrics().donated_buffers == before + 8  # nothing holds them now
    assert torch.equal(p.cpu(), (old * 2 + 1) * 2 + 1)


def test_donation_and_its_refusals_survive_a_failed_compile(engine, donation):
    """After dynamo fails on a view input, frames hold their locals once more than before (found in the
    suite's order); the holders are counted where no frame names them, so donation works as before."""
    double = torch.compile(lambda a: a * 2, backend="pjrt")
    with pytest.raises(Exception, match="pass a copy"):
        double(torch.randn(4, 16).to("pjrt")[1:])
    p = torch.arange(16.0).reshape(4, 4).to("pjrt")
    _step(p)
    xs.sync()
    before = xs.metrics().donated_buffers
    held = list(p._pjrt_data.buffers)
    _step(p)
    xs.sync()
    refused = xs.metrics().donated_buffers - before
    del held
    _step(p)
    xs.sync()
    assert (refused, xs.metrics().donated_buffers - before) == (0, 8)
    assert torch.equal(p.cpu(), ((torch.arange(16.0).reshape(4, 4) * 2 + 1) * 2 + 1) * 2 + 1)


@pytest.mark.parametrize("alias", ["detach", "view", "clone_before", "data"])
def test_user_aliases_read_what_cpu_torch_reads(engine, donation, alias):
    def run(device: str):
        p = torch.arange(16.0).reshape(4, 4).to(device)
        if device == "pjrt":
            xs.sync()
        other = {"detach": lambda: p.detach(), "view": lambda: p[1], "clone_before": lambda: p.clone(),
                 "data": lambda: p.data}[alias]()
        _step(p)
        if device == "pjrt":
            xs.sync()
        return p.cpu(), other.cpu()

    (p, other), (p_ref, other_ref) = run("pjrt"), run("cpu")
    assert torch.equal(p, p_ref)
    assert torch.equal(other, other_ref)


def test_a_tensor_saved_for_backward_is_not_donated(engine, donation):
    w = torch.arange(4.0, requires_grad=True)
    x = w.detach().clone().to("pjrt").requires_grad_(True)
    xs.sync()
    y = (x * x).sum()  # saves x for backward
    with torch.no_grad():
        x.add_(1)  # torch's version counter makes backward refuse the changed x, as on the CPU
    xs.sync()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_donation_is_off_with_set_donation_false(engine, donation):
    xs.set_donation(False)
    p = torch.ones(8, 8).to("pjrt")
    xs.sync()
    before = xs.metrics().donated_buffers
    _step(p)
    xs.sync()
    assert xs.metrics().donated_buffers == before
    assert "tf.aliasing_output" not in execution.last_program().lowered.text
    assert torch.equal(p.cpu(), torch.full((8, 8), 3.0))


def test_the_environment_variable_turns_donation_off(monkeypatch):
    from pjrt_plugins.spmd.trace import _donation

    monkeypatch.setattr(_donation, "_switch", [None])
    monkeypatch.setenv("PJRT_PLUGINS_DONATE", "0")
    assert not _donation.donation_enabled()
    monkeypatch.setenv("PJRT_PLUGINS_DONATE", "1")
    assert _donation.donation_enabled()
    monkeypatch.setenv("PJRT_PLUGINS_DONATE", "Off")
    assert not _donation.donation_enabled()
    monkeypatch.setenv("PJRT_PLUGINS_DONATE", "maybe")
    with pytest.raises(ValueError, match="PJRT_PLUGINS_DONATE='maybe' is not a boolean"):
        _donation.donation_enabled()
    monkeypatch.delenv("PJRT_PLUGINS_DONATE")
    assert _donation.donation_enabled()


def _fused_adamw(donate: bool, device: str = "pjrt"):
    """Three steps of a fused AdamW over a replicated bias next to row-split weights (XLA would shard the new
    bias like the weight unless the result keeps its input's sharding); the parameters after them."""
    xs.set_donation(donate)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    if device == "pjrt":
        mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
        xs.mark_sharding(model[0].weight, mesh, ("model", None))
        xs.mark_sharding(model[2].weight, mesh, (None, "model"))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(16, 8, generator=g).to(device), torch.randn(16, 4, generator=g).to(device)
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if device == "pjrt":
            xs.sync()
    return [p.detach().cpu() for p in model.parameters()]


@pytest.fixture(params=["gspmd", "shardy"])
def partitioner(request):
    """Each partitioner for the test, the default choice back afterwards."""
    xs.set_partitioner(request.param)
    yield request.param
    xs.set_partitioner(None)
    execution.reset_partitioner_probes()
    execution.clear_compile_cache()


def test_a_fused_adamw_with_mixed_shardings_donates(engine, donation, partitioner, caplog):
    """Each donated result keeps its input's sharding (a result attribute), so XLA aliases them all: the
    parameters are donated, nothing is compiled again without donation, and the values are right."""
    xs.clear_compile_cache()  # forget a refusal (or a program) of an earlier test
    before = xs.metrics().donated_buffers
    with caplog.at_level(logging.INFO, logger="pjrt_plugins.spmd.trace"):
        donated = _fused_adamw(True)
    assert xs.metrics().donated_buffers > before
    assert "runs without donation" not in caplog.text
    assert execution.last_program().lowered.partitioner == partitioner
    for a, b, c in zip(donated, _fused_adamw(False), _fused_adamw(False, "cpu")):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-6)


def test_a_program_xla_cannot_alias_runs_without_donation(engine, donation, caplog, monkeypatch):
    """Whatever alias XLA still refuses (here: the fused AdamW without its results' shardings, so XLA shards
    the new bias like the weight) compiles the program again without donation, with the same results; and
    ``clear_compile_cache`` forgets that refusal."""
    monkeypatch.setattr(_module, "_pin_aliased_results", lambda *args: None)
    xs.clear_compile_cache()  # forget a refusal (or a program) of an earlier test
    with caplog.at_level(logging.INFO, logger="pjrt_plugins.spmd.trace"):
        donated = _fused_adamw(True)
    assert "runs without donation" in caplog.text  # the path this test is about was taken
    assert ENGINE.programs.donation_refused
    for a, b in zip(donated, _fused_adamw(False)):
        assert torch.equal(a, b)
    assert ENGINE.programs.donation_fits  # what may alias what, remembered per program key
    xs.clear_compile_cache()
    assert not ENGINE.programs.donation_refused and not ENGINE.programs.donation_fits
