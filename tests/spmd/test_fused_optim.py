"""torch's fused optimizers (``fused=True``) on pjrt tensors: one traced op for a whole parameter list.

Adam and AdamW record one ``pjrt::adam_step`` per step, SGD one ``pjrt::sgd_step``, and give the
numbers of torch's own fused CPU kernels; a changing learning rate does not recompile. What is not
lowered (a GradScaler's ``grad_scale``/``found_inf``, fused Adagrad) runs through the CPU fallback with
the same numbers, and is refused with UnsupportedOpError when the fallback is off (these used to
fail with an AttributeError).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import UnsupportedOpError
from pjrt_plugins.spmd.frontend import _fallback, _fused_optim
from pjrt_plugins.spmd.lowering import ADAM_STEP, SGD_STEP

from _exec_support import assert_close, engine  # noqa: F401

aten = torch.ops.aten


@pytest.fixture
def fallback(engine):
    xs.set_cpu_fallback(True)
    _fallback._warned.clear()
    yield engine
    xs.set_cpu_fallback(True)


def _pair(seed: int = 0) -> tuple[nn.Module, nn.Module, tuple, tuple]:
    """A CPU model and its sharded pjrt copy, with a batch for each."""
    torch.manual_seed(seed)
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model = copy.deepcopy(ref).to("pjrt")
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    xs.mark_sharding(model[2].weight, mesh, (None, "model"))
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    return ref, model, (x, y), (xs.mark_sharding(x.to("pjrt"), mesh, ("data", None)), y.to("pjrt"))


def _train(ref, model, batches, make_opt, steps: int, schedule=None):
    opts = [make_opt(m.parameters()) for m in (ref, model)]
    for i in range(steps):
        for m, opt, (a, b) in zip((ref, model), opts, batches):
            if schedule is not None:
                for group in opt.param_groups:
                    group["lr"] = schedule(i)
            F.mse_loss(m(a), b).backward()
            opt.step()
            opt.zero_grad()
        xs.sync()
    return opts


def _assert_same_state(ref, model, opts) -> None:
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert_close(name, p.cpu(), r.detach(), rtol=1e-5, atol=1e-6)
    for p, r in zip(model.parameters(), ref.parameters()):
        mine, theirs = opts[1].state[p], opts[0].state[r]
        assert mine.keys() == theirs.keys()
        for key in theirs:
            assert_close(key, mine[key].cpu(), theirs[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("optimizer, options", [
    (torch.optim.AdamW, {}),
    (torch.optim.AdamW, {"amsgrad": True, "weight_decay": 0.1}),
    (torch.optim.Adam, {}),
    (torch.optim.Adam, {"weight_decay": 0.05, "maximize": True}),
    (torch.optim.Adam, {"amsgrad": True, "betas": (0.8, 0.9)}),
])
def test_fused_adam_matches_torchs_fused_cpu_kernel(engine, optimizer, options):
    ref, model, batch, pjrt_batch = _pair()
    fallbacks = xs.metrics().fallbacks
    opts = _train(ref, model, (batch, pjrt_batch), lambda ps: optimizer(ps, lr=0.01, fused=True, **options), 4)
    _assert_same_state(ref, model, opts)
    assert xs.metrics().fallbacks == fallbacks


def test_a_fused_step_is_one_recorded_op_and_a_new_learning_rate_reuses_the_program(engine, monkeypatch):
    ref, model, batch, pjrt_batch = _pair(1)
    calls = []
    real = _fused_optim.record_into
    monkeypatch.setattr(_fused_optim, "record_into", lambda func, *a: calls.append(func) or real(func, *a))
    opts = _train(ref, model, (batch, pjrt_batch), lambda ps: torch.optim.AdamW(ps, lr=0.01, fused=True), 2)
    assert calls == [ADAM_STEP, ADAM_STEP]  # one op per step for the whole parameter list
    compiles = xs.metrics().compiles
    for i in range(3):  # a learning-rate schedule: a run-time scalar, not a constant of the program
        for opt in opts:
            opt.param_groups[0]["lr"] = 0.01 / (i + 2)
        for m, opt, (a, b) in zip((ref, model), opts, (batch, pjrt_batch)):
            F.mse_loss(m(a), b).backward()
            opt.step()
            opt.zero_grad()
        xs.sync()
    assert xs.metrics().compiles == compiles
    _assert_same_state(ref, model, opts)


def test_a_tensor_learning_rate_takes_the_tensor_lr_overload(engine):
    ref, model, batch, pjrt_batch = _pair(2)
    lrs = [torch.tensor(0.02), torch.tensor(0.02)]
    opts = _train(ref, model, (batch, pjrt_batch),
                  lambda ps: torch.optim.Adam(ps, lr=lrs.pop(), fused=True), 3)
    _assert_same_state(ref, model, opts)


def _adam_lists(device: str, seed: int = 3) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 6), (8,)]
    lists = [[torch.rand(s, generator=g) for s in shapes] for _ in range(4)]
    steps = [torch.tensor(3.0) for _ in shapes]
    return [[t.to(device) for t in ts] for ts in (*lists, [], steps)]


def test_a_grad_scaler_step_runs_through_the_fallback_with_torchs_numbers(fallback):
    cpu, pjrt = _adam_lists("cpu"), _adam_lists("pjrt")
    fallbacks = xs.metrics().fallbacks
    for lists, device in ((cpu, "cpu"), (pjrt, "pjrt")):
        torch._fused_adamw_(*lists, lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.01, eps=1e-8, amsgrad=False,
                            maximize=False, grad_scale=torch.tensor(4.0, device=device),
                            found_inf=torch.tensor(0.0, device=device))
    for mine, theirs in zip(pjrt, cpu):
        for a, b in zip(mine, theirs):
            assert_close("state", a.cpu(), b, rtol=1e-6, atol=1e-7)
    assert xs.metrics().fallbacks > fallbacks


def test_without_the_fallback_unlowered_fused_steps_are_refused_clearly(fallback):
    xs.set_cpu_fallback(False)
    with pytest.raises(UnsupportedOpError, match="grad_scale"):
        torch._fused_adam_(*_adam_lists("pjrt"), lr=0.01, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8,
                           amsgrad=False, maximize=False, grad_scale=torch.tensor(2.0, device="pjrt"))
    model = nn.Linear(4, 2).to("pjrt")
    opt = torch.optim.Adagrad(model.parameters(), lr=0.1, fused=True)
    model(torch.ones(3, 4).to("pjrt")).sum().backward()
    with pytest.raises(UnsupportedOpError, match="_fused_adagrad_"):
        opt.step()


def test_fused_adagrad_runs_through_the_fallback(fallback):
    torch.manual_seed(4)
    ref = nn.Linear(4, 2)
    model = copy.deepcopy(ref).to("pjrt")
    opts = [torch.optim.Adagrad(m.parameters(), lr=0.1, fused=True) for m in (ref, model)]
    for _ in range(2):
        for m, opt in zip((ref, model), opts):
            device = next(m.parameters()).device
            m(torch.ones(3, 4).to(device)).sum().backward()
            opt.step()
            opt.zero_grad()
    for p, r in zip(model.parameters(), ref.parameters()):
        assert_close("param", p.cpu(), r.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("options", [
    {},
    {"momentum": 0.9},
    {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
    {"momentum": 0.8, "dampening": 0.1, "maximize": True},
])
def test_fused_sgd_is_one_op_with_torchs_numbers(engine, monkeypatch, options):
    ref, model, batch, pjrt_batch = _pair(5)
    calls = []
    real = _fused_optim.record_into
    monkeypatch.setattr(_fused_optim, "record_into", lambda func, *a: calls.append(func) or real(func, *a))
    fallbacks = xs.metrics().fallbacks
    opts = _train(ref, model, (batch, pjrt_batch), lambda ps: torch.optim.SGD(ps, lr=0.05, fused=True, **options), 3,
                  schedule=lambda i: 0.05 / (i + 1))
    _assert_same_state(ref, model, opts)
    assert calls == [SGD_STEP] * 3
    assert xs.metrics().fallbacks == fallbacks
