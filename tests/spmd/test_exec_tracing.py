"""The tracer's hot path: compact op entries, no graph on a cache hit, exact keys, foreach ops.

A repeated step must find its program without building a torch.fx graph and leave no reference
cycles; keys must tell apart constants Python calls equal (1, 1.0, True, 0.0 and -0.0); foreach ops
are one recorded op each and give torch's numbers; lerp/addcmul/addcdiv are one op each.
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.optimizer import _default_to_fused_or_foreach

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import trace
from pjrt_plugins.spmd.trace import _materialize, _state

from _exec_support import assert_close, engine  # noqa: F401

aten = torch.ops.aten


def _counting(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    """Wrap ``module.name`` so that calls are counted (the real function still runs)."""
    real = getattr(module, name)
    calls = [0]

    def wrapper(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls


def _model_and_step(seed: int = 0):
    torch.manual_seed(seed)
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model = copy.deepcopy(ref).to("pjrt")
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01) for m in (ref, model)]
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    xp, yp = xs.mark_sharding(x.to("pjrt"), mesh, ("data", None)), y.to("pjrt")

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        losses = []
        for m, opt, (a, b) in zip((ref, model), opts, ((x, y), (xp, yp))):
            loss = F.mse_loss(m(a), b)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss)
        xs.sync()
        return losses[0], losses[1]

    return ref, model, step


def test_a_repeated_step_finds_its_program_without_building_a_graph(engine, monkeypatch):
    _, _, step = _model_and_step()
    step()
    step()  # the first step creates the optimizer state: the second is the steady-state program
    built = _counting(monkeypatch, _materialize, "build_graph")
    before = xs.metrics()
    for _ in range(3):
        step()
    after = xs.metrics()
    assert built[0] == 0
    assert (after.compiles - before.compiles, after.cache_hits - before.cache_hits) == (0, 3)


def test_a_step_leaves_no_reference_cycles_behind(engine):
    _, _, step = _model_and_step(1)
    step()
    step()
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        step()
        gc.collect()
        ours = [o for o in gc.garbage if type(o).__module__.startswith(("pjrt_plugins", "torch.fx"))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()
    assert ours == []


def test_adamw_matches_torch_on_its_foreach_and_single_tensor_paths(engine):
    """torch's optimizers take their foreach path on pjrt tensors (a few ops per parameter list)."""
    ref, model, step = _model_and_step(2)
    assert _default_to_fused_or_foreach(list(model.parameters()), False, False) == (False, True)
    for _ in range(3):
        loss_ref, loss = step()
        assert_close("loss", loss.cpu(), loss_ref.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert_close(name, p.cpu(), r, rtol=1e-5, atol=1e-6)
    # The single-tensor path gives the same numbers.
    opts = [torch.optim.AdamW(m.parameters(), lr=0.01, foreach=False) for m in (ref, model)]
    for m, opt in zip((ref, model), opts):
        device = next(m.parameters()).device
        F.mse_loss(m(torch.ones(4, 8).to(device)), torch.zeros(4, 4).to(device)).backward()
        opt.step()
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert_close(name, p.cpu(), r, rtol=1e-5, atol=1e-6)


def _lists(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(4, 6), (8,), (2, 3, 4)]
    return ([torch.rand(s, generator=g) + 0.5 for s in shapes], [torch.rand(s, generator=g) + 0.5 for s in shapes])


FOREACH_CASES = {
    "add.List alpha": lambda a, b: torch._foreach_add(a, b, alpha=0.3),
    "add.Scalar": lambda a, b: torch._foreach_add(a, 0.25),
    "sub.ScalarList": lambda a, b: torch._foreach_sub(a, [0.1, 0.2, 0.3]),
    "mul.Tensor": lambda a, b: torch._foreach_mul(a, b[1][0]),
    "div.ScalarList": lambda a, b: torch._foreach_div(a, [3.0, 0.7, 1.3]),
    "lerp.Scalar": lambda a, b: torch._foreach_lerp(a, b, 0.1),
    "lerp.List": lambda a, b: torch._foreach_lerp(a, b, a),
    "addcmul.Scalar": lambda a, b: torch._foreach_addcmul(a, b, b, value=0.001),
    "addcdiv.ScalarList": lambda a, b: torch._foreach_addcdiv(a, b, a, [-0.1, 0.2, -0.3]),
    "sqrt": lambda a, b: torch._foreach_sqrt(a),
    "pow.Scalar": lambda a, b: torch._foreach_pow(a, 2.5),
    "maximum.List": lambda a, b: torch._foreach_maximum(a, b),
    "clamp_min.Scalar": lambda a, b: torch._foreach_clamp_min(a, 0.8),
}


@pytest.mark.parametrize("case", sorted(FOREACH_CASES))
def test_foreach_ops_are_one_recorded_op_and_match_torch(engine, case):
    fn = FOREACH_CASES[case]
    a, b = _lists(3)
    mesh = xs.Mesh(range(8), (2, 4))
    pa = [t.to("pjrt") for t in a]
    xs.mark_sharding(pa[0], mesh, (0, 1))
    pb = [t.to("pjrt") for t in b]
    xs.sync()
    out = fn(pa, pb)
    ops = trace.pending_ops()
    for i, (o, r) in enumerate(zip(out, fn(a, b))):
        assert_close(f"{case}[{i}]", o.cpu(), r, rtol=1e-6, atol=1e-6)
    assert ops == (2 if case == "mul.Tensor" else 1)  # mul.Tensor also records its 0-d operand (a select)


def test_inplace_foreach_ops_update_every_tensor(engine):
    a, b = _lists(4)
    pa, pb = [t.to("pjrt") for t in a], [t.to("pjrt") for t in b]
    xs.sync()
    torch._foreach_mul_(pa, 0.9)
    torch._foreach_addcdiv_(pa, pb, pb, [0.5, -0.25, 0.125])
    torch._foreach_lerp_(pa, pb, 0.3)
    assert trace.pending_ops() == 3
    torch._foreach_mul_(a, 0.9)
    torch._foreach_addcdiv_(a, b, b, [0.5, -0.25, 0.125])
    torch._foreach_lerp_(a, b, 0.3)
    for i, (o, r) in enumerate(zip(pa, a)):
        assert_close(f"tensor {i}", o.cpu(), r, rtol=1e-6, atol=1e-6)


def test_foreach_ops_without_a_per_tensor_twin_run_per_tensor(engine):
    a, b = _lists(5)
    pa, pb = [t.to("pjrt") for t in a], [t.to("pjrt") for t in b]
    scalars = torch.tensor([0.5, 2.0, -1.0])
    cases = [
        (torch._foreach_norm(pa), torch._foreach_norm(a)),
        (torch._foreach_maximum(pa, 1.0), torch._foreach_maximum(a, 1.0)),
        (torch._foreach_addcmul(pa, pb, pb, scalars), torch._foreach_addcmul(a, b, b, scalars)),
    ]
    for k, (outs, refs) in enumerate(cases):
        for i, (o, r) in enumerate(zip(outs, refs)):
            assert_close(f"case {k} [{i}]", o.cpu(), r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weight", [0.1, 0.75, "tensor"])
def test_lerp_addcmul_addcdiv_are_one_op_each_with_torchs_results(engine, weight):
    g = torch.Generator().manual_seed(6)
    x, y, z = (torch.randn(5, 7, generator=g) for _ in range(3))
    w = torch.rand(5, 7, generator=g) if weight == "tensor" else weight
    px, py, pz = x.to("pjrt"), y.to("pjrt"), z.to("pjrt")
    pw = w.to("pjrt") if weight == "tensor" else w
    xs.sync()
    results = [torch.lerp(px, py, pw), torch.addcmul(px, py, pz, value=-0.37), torch.addcdiv(px, py, pz.abs() + 1)]
    assert trace.pending_ops() == 5  # lerp, addcmul, abs, add, addcdiv
    refs = [torch.lerp(x, y, w), torch.addcmul(x, y, z, value=-0.37), torch.addcdiv(x, y, z.abs() + 1)]
    for name, o, r in zip(("lerp", "addcmul", "addcdiv"), results, refs):
        assert_close(name, o.cpu(), r, rtol=1e-6, atol=1e-6)


def test_keys_tell_apart_constants_python_calls_equal(engine):
    """1, 1.0 and True are equal (and hash alike) in Python, as are 0.0 and -0.0: results differ."""
    ints = torch.arange(6).reshape(2, 3)
    flags = torch.tensor([True, False, True])
    t, f = ints.to("pjrt"), flags.to("pjrt")
    for _ in range(2):  # twice: the second round replays what the first recorded
        for make in (lambda a: a ** 2, lambda a: a ** 2.0, lambda a: a * True, lambda a: a * 1, lambda a: a * 1.0):
            assert_close("int tensor op", make(t).cpu(), make(ints))
        assert_close("bool + True", torch.add(f, True).cpu(), torch.add(flags, True))
        assert_close("bool + 1", torch.add(f, 1).cpu(), torch.add(flags, 1))
        for zero in (0.0, -0.0):
            assert_close("1 / full(zero)", (1 / torch.full_like(t, zero, dtype=torch.float32)).cpu(),
                         1 / torch.full_like(ints, zero, dtype=torch.float32))


def test_the_prefix_tree_starts_over_when_it_grows_too_large(engine, monkeypatch):
    monkeypatch.setattr(_state, "MAX_STEPS", 3)
    x = torch.randn(4, 4)
    t = x.to("pjrt")
    roots = set()
    for scale in (1, 2, 3, 1):  # other constants: new branches of the tree every round
        assert_close("after a restart", ((t + scale) * scale).relu().cpu(), ((x + scale) * scale).relu())
        roots.add(id(trace.ENGINE.root))
    assert len(roots) > 1


def test_factory_made_constants_are_computed_on_the_devices_not_uploaded(engine):
    """Masks (ones().tril()), fills and integer aranges made on pjrt every step move no bytes."""
    x = torch.randn(2, 4, 8, 16)
    t = x.to("pjrt")
    ref = F.scaled_dot_product_attention(x, x, x, is_causal=True) + torch.arange(16) + torch.full((16,), 0.75)
    for step in range(2):
        xs.reset_transfer_counters()
        mask = torch.ones(8, 8, dtype=torch.bool, device="pjrt").tril()
        out = F.scaled_dot_product_attention(t, t, t, attn_mask=mask) + torch.arange(16, device="pjrt")
        out = out + torch.full((16,), 0.75, device="pjrt")
        xs.sync()
        assert xs.transfer_counters().uploads == (16 if step == 0 else 0)  # the first step uploads x and 0.75
        assert_close("attention", out.cpu(), ref, rtol=1e-5, atol=1e-5)
    assert mask._pjrt_data.state.name == "DEVICE"  # the mask itself was an output too


def test_decomposed_ops_are_recorded_whole_and_give_the_piecewise_results(engine, monkeypatch):
    """layer_norm, gelu, softmax and their backwards are one entry each (their decompositions run when the
    graph is lowered, not every step), with the numbers of running the decompositions piece by piece."""
    x = torch.randn(4, 6, 8)

    def step(t: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
        y = F.softmax(F.gelu(F.layer_norm(t, (8,), w)), dim=-1)
        (grad,) = torch.autograd.grad((y * y).sum(), [w])
        return [y, grad]

    def run() -> tuple[list[torch.Tensor], set[str]]:
        w = torch.linspace(0.5, 1.5, 8).to("pjrt").requires_grad_()
        xs.sync()
        outs = step(x.to("pjrt"), w)
        recorded = {trace.ENGINE.ops_by_id[e[0]].name for e in trace.ENGINE.trace.entries if e[0] > 0}
        return [o.cpu() for o in outs], recorded

    decomposed = {"aten.native_layer_norm.default", "aten.gelu.default", "aten._softmax.default",
                  "aten.native_layer_norm_backward.default", "aten.gelu_backward.default",
                  "aten._softmax_backward_data.default"}
    whole, whole_ops = run()
    for info in list(trace.ENGINE.op_infos.values()):  # the ops seen so far: piece by piece
        monkeypatch.setattr(info, "whole", False)
    pieces, piece_ops = run()
    monkeypatch.undo()
    assert decomposed - {"aten._softmax.default"} <= whole_ops  # _softmax is lowered by hand anyway
    assert not (decomposed - {"aten._softmax.default"}) & piece_ops
    for name, a, b in zip(("output", "grad"), whole, pieces):  # equal up to XLA folding other constants
        assert_close(name, a, b, rtol=1e-6, atol=1e-7)
    w_ref = torch.linspace(0.5, 1.5, 8).requires_grad_()
    for name, a, r in zip(("output", "grad"), whole, step(x, w_ref)):
        assert_close(name, a, r.detach(), rtol=1e-5, atol=1e-6)


def test_an_op_whose_decomposition_does_not_lower_runs_piece_by_piece(engine):
    """nanquantile's decomposition needs data-dependent pieces: it is not recorded whole, and still runs."""
    x = torch.tensor([[1.0, float("nan"), 3.0, 2.0], [4.0, 0.5, float("nan"), 8.0]])
    out = torch.nanquantile(x.to("pjrt"), 0.25, dim=1)
    assert_close("nanquantile", out.cpu(), torch.nanquantile(x, 0.25, dim=1))


def test_batch_norm_updates_its_running_stats_although_its_decomposition_could_be_recorded_whole(engine):
    """native_batch_norm writes its running stats without saying so in its schema: it runs piece by piece."""
    x = torch.randn(4, 3, 5)
    mean, var = torch.zeros(3), torch.ones(3)
    pm, pv = mean.to("pjrt"), var.to("pjrt")
    out = F.batch_norm(x.to("pjrt"), pm, pv, training=True, momentum=0.1)
    ref = F.batch_norm(x, mean, var, training=True, momentum=0.1)
    assert_close("output", out.cpu(), ref, rtol=1e-5, atol=1e-6)
    assert_close("running_mean", pm.cpu(), mean, rtol=1e-5, atol=1e-6)
    assert_close("running_var", pv.cpu(), var, rtol=1e-5, atol=1e-6)
