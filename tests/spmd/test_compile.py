"""``torch.compile(..., backend="pjrt")``: a cache hit records one op per graph, not one per operator.

The backend is found through the real ``torch_dynamo_backends`` entry point of the installed package.
Compiled functions and training steps give the numbers of the same code run eagerly on pjrt (and of
torch on the CPU); graphs that do not lower whole (dropout) run op by op; ``.cpu()`` inside, factories
on the input's device, input mutation and ``mark_sharding`` around and inside a compiled function keep
their meaning.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import pjrt_plugins.spmd as xs


from _exec_support import assert_close, engine  # noqa: F401

MESH = xs.Mesh(range(8), (2, 4), ("data", "model"))


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # conftest.py


def _recorded_ops(fn) -> tuple[int, torch.Tensor]:
    xs.sync()
    before = xs.metrics().ops_recorded
    result = fn()
    xs.sync()
    return xs.metrics().ops_recorded - before, result


def test_the_backend_is_found_by_name_and_a_cache_hit_records_one_op(engine):
    assert "pjrt" in torch._dynamo.list_backends()  # the installed entry point
    x, w = torch.randn(16, 8), torch.randn(8, 4)
    xp = xs.mark_sharding(x.to("pjrt"), MESH, ("data", None))
    wp = w.to("pjrt")

    def f(a, b):
        return torch.tanh(a @ b).softmax(-1).sum(0) * 3 + 1

    compiled = torch.compile(f, backend="pjrt", fullgraph=True)
    assert_close("first call", compiled(xp, wp).cpu(), f(x, w))
    eager_ops, _ = _recorded_ops(lambda: f(xp, wp))
    compiles = xs.metrics().compiles
    compiled_ops, out = _recorded_ops(lambda: compiled(xp, wp))
    assert_close("second call", out.cpu(), f(x, w))
    assert compiled_ops == 1 < eager_ops
    assert xs.metrics().compiles == compiles


def _gpt_like(seed: int) -> nn.Module:
    torch.manual_seed(seed)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(32, 16)
            self.ln = nn.LayerNorm(16)
            self.fc = nn.Linear(16, 64)
            self.out = nn.Linear(64, 32)

        def forward(self, idx, tgt):
            pos = torch.arange(idx.shape[1], device=idx.device)  # a factory on the input's device
            x = self.tok(idx) + self.tok(pos)
            h = self.out(F.gelu(self.fc(self.ln(x))))
            return F.cross_entropy(h.view(-1, 32), tgt.reshape(-1))

    return Net()


@pytest.mark.parametrize("fused", [False, True])
def test_a_compiled_training_step_gives_the_eager_numbers(engine, fused):
    ref = _gpt_like(0)
    eager, compiled_model = copy.deepcopy(ref).to("pjrt"), copy.deepcopy(ref).to("pjrt")
    for model in (eager, compiled_model):
        xs.mark_sharding(model.fc.weight, MESH, ("model", None))
        xs.mark_sharding(model.out.weight, MESH, (None, "model"))
    idx, tgt = torch.randint(0, 32, (8, 6)), torch.randint(0, 32, (8, 6))
    batch = [xs.mark_sharding(t.to("pjrt"), MESH, ("data", None)) for t in (idx, tgt)]
    step_fns = [eager, torch.compile(compiled_model, backend="pjrt")]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2, fused=fused or None)
            for m in (ref, eager, compiled_model)]
    losses: list[list[float]] = [[], [], []]
    for step in range(4):
        if step == 3:
            compiles = xs.metrics().compiles
        for fn, opt, inputs, out in zip((ref, *step_fns), opts, ((idx, tgt), batch, batch), losses):
            loss = fn(*inputs)
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss)
        xs.sync()
    assert xs.metrics().compiles == compiles  # a steady step reuses its program
    ref_losses, eager_losses, compiled_losses = ([float(v) for v in vs] for vs in losses)
    assert compiled_losses == eager_losses
    assert compiled_losses == pytest.approx(ref_losses, rel=1e-5)
    assert compiled_losses[-1] < compiled_losses[0]
    for (name, p), r in zip(compiled_model.named_parameters(), ref.parameters()):
        assert_close(name, p.cpu(), r, rtol=1e-4, atol=1e-5)


def test_dropout_in_a_region_draws_the_eager_masks(engine):
    """A region's random ops take keys of the device RNG stream when the call is recorded, one per op as
    the engine does: the same seed gives the eager mask, and every call a new one."""
    x = torch.rand(64, 32) + 1
    xp = x.to("pjrt")

    def f(a):
        return F.dropout(a * 1.0, 0.5, training=True)

    compiled = torch.compile(f, backend="pjrt")
    compiled(xp)
    torch.manual_seed(5)
    eager = f(xp).cpu()
    torch.manual_seed(5)
    ops, out = _recorded_ops(lambda: compiled(xp))
    assert ops == 1
    assert torch.equal(out.cpu(), eager)
    kept = eager != 0
    assert 0.3 < kept.float().mean() < 0.7
    torch.testing.assert_close(eager[kept], x[kept] * 2)
    assert not torch.equal(compiled(xp).cpu(), eager)


def test_cpu_results_input_mutation_and_views_keep_their_meaning(engine):
    x = torch.randn(4, 6)
    xp = x.to("pjrt")

    def f(a):
        a.add_(1)  # written back into the caller's tensor
        return (a * 2).cpu(), a.t()

    host, view = torch.compile(f, backend="pjrt")(xp)
    assert host.device.type == "cpu" and torch.equal(host, (x + 1) * 2)
    assert torch.equal(xp.cpu(), x + 1)
    assert torch.equal(view.cpu(), (x + 1).t())


def test_tensors_made_by_factories_inside_come_back_as_pjrt_tensors(engine):
    x = torch.randn(4)
    compiled = torch.compile(lambda a: (a + 1, torch.arange(3, device=a.device) * 2.0,
                                        torch.ones(2, 2, device="pjrt")), backend="pjrt")
    plus, steps, ones = compiled(x.to("pjrt"))
    assert all(isinstance(t, xs.XLAShardedTensor) for t in (plus, steps, ones))
    assert torch.equal(plus.cpu(), x + 1)
    assert torch.equal(steps.cpu(), torch.arange(3) * 2.0)
    assert torch.equal(ones.cpu(), torch.ones(2, 2))


def test_mark_sharding_inside_a_compiled_function_is_part_of_the_graph(engine):
    """mark_sharding inside a compiled function breaks no graph: it constrains the value in the graph, and the
    result is laid out that way once it runs (test_sharding_hints has the rest)."""
    x = torch.randn(8, 4)

    def f(a):
        marked = xs.mark_sharding(a + 1, MESH, ("data", None))
        return marked, marked * 2

    marked, out = torch.compile(f, backend="pjrt", fullgraph=True)(x.to("pjrt"))
    xs.sync()
    assert marked.sharding_spec == xs.mark_sharding(torch.zeros(8, 4).to("pjrt"), MESH, ("data", None)).sharding_spec
    assert torch.equal(out.cpu(), (x + 1) * 2)


def test_a_new_shape_recompiles_and_eager_ops_stay_right_after_tracing(engine):
    compiled = torch.compile(lambda a: a.cumsum(0) - a.mean(), backend="pjrt", dynamic=False)
    for n in (4, 7):
        x = torch.randn(n, 3)
        assert_close(f"shape {n}", compiled(x.to("pjrt")).cpu(), x.cumsum(0) - x.mean())
    x = torch.randn(5)
    assert torch.equal((x.to("pjrt") * 3).cpu(), x * 3)  # eager, while dynamo may keep traced tensors
    model = copy.deepcopy(_gpt_like(2)).to("pjrt")
    torch.compile(model, backend="pjrt")(torch.zeros(2, 3, dtype=torch.long).to("pjrt"),
                                         torch.zeros(2, 3, dtype=torch.long).to("pjrt"))
    clone = copy.deepcopy(model)  # the inner tensors torch traced are not copied with the parameters
    assert "_pjrt_inner_tensor" not in clone.fc.weight.__dict__
    assert torch.equal(clone.fc.weight.cpu(), model.fc.weight.cpu())


def test_lazy_inputs_are_recorded_into_the_same_program(engine):
    x = torch.randn(6, 6)
    compiled = torch.compile(lambda a: a @ a.t(), backend="pjrt")
    compiled(x.to("pjrt"))
    xs.sync()
    executions = xs.metrics().executions
    out = compiled(x.to("pjrt") + 1) + 2  # eager ops before and after the region: one program
    assert_close("out", out.cpu(), (x + 1) @ (x + 1).t() + 2, rtol=1e-5, atol=1e-5)
    assert xs.metrics().executions == executions + 1


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_another_backend_is_refused_with_a_clear_error(engine, backend):
    x = torch.randn(4, 3)
    with pytest.raises(Exception, match='backend="pjrt"'):
        torch.compile(lambda a: a.sin() + 1, backend=backend)(x.to("pjrt"))
    assert torch.equal(torch.compile(lambda a: a * 2, backend="eager")(x.to("pjrt")).cpu(), x * 2)


class _Tied(nn.Module):
    """An embedding and a head sharing one weight."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 16)
        self.head = nn.Linear(16, 20, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, i):
        return self.head(torch.tanh(self.emb(i)))


class _Breaks(nn.Module):
    """A forward that dynamo cannot trace whole (a print): two graphs, eager code between them."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = self.a(x)
        print("between the graphs")
        return self.b(torch.relu(h))


@pytest.mark.parametrize("make, make_input", [
    (_Tied, lambda: torch.randint(0, 20, (4, 5))),
    (lambda: nn.Sequential(nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU()), lambda: torch.randn(8, 16)),
    (_Breaks, lambda: torch.randn(8, 16)),
    (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(144, 2)),
     lambda: torch.randn(2, 3, 8, 8)),
], ids=["tied-weights", "batchnorm-buffers", "graph-break", "conv2d"])
def test_models_train_to_the_cpu_numbers(engine, make, make_input):
    torch.manual_seed(3)
    ref = make()
    model = copy.deepcopy(ref).to("pjrt")
    compiled = torch.compile(model, backend="pjrt")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model)]
    x = make_input()
    for _ in range(2):
        for fn, opt, inp in ((ref, opts[0], x), (compiled, opts[1], x.to("pjrt"))):
            fn(inp).square().mean().backward()
            opt.step()
            opt.zero_grad()
        xs.sync()
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        assert_close(name, p.cpu(), r, rtol=1e-4, atol=1e-5)
    for (name, b), r in zip(model.named_buffers(), ref.buffers()):  # BatchNorm's running statistics
        assert_close(name, b.cpu(), r, rtol=1e-4, atol=1e-5)


def test_dynamic_shapes_record_one_region_per_graph_for_every_size(engine, caplog):
    # dynamic=True: one graph for every batch size; each size is a region of its own, made on first use.
    torch.manual_seed(4)
    ref = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    model = copy.deepcopy(ref).to("pjrt")
    compiled = torch.compile(model, backend="pjrt", dynamic=True)
    caplog.set_level("DEBUG", logger="pjrt_plugins.spmd.frontend._dynamo_backend")
    for batch in (4, 6, 8, 6):
        x = torch.randn(batch, 8)
        ops, out = _recorded_ops(lambda x=x: compiled(xs.mark_sharding(x.to("pjrt"), MESH, ("data", None))))
        assert ops == 1, batch  # the forward region (the transfer of x is no op)
        expected = ref(x)
        assert_close(f"batch {batch}", out.cpu(), expected)
        out.sum().backward()
        expected.sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert_close("accumulated gradient", p.grad.cpu(), q.grad)
    assert "op by op" not in caplog.text, caplog.text
    made = caplog.text.count("a region for the sizes")
    assert made == 6, caplog.text  # forward and backward for each of the three batch sizes


def test_a_new_sequence_length_keeps_training_in_regions(engine, caplog):
    # Without dynamic=..., dynamo makes the sizes that changed symbolic on the second length (automatic
    # dynamic shapes); the graphs it then gives the backend stay regions, and the numbers eager ones.
    ref = _gpt_like(5)
    eager, compiled_model = copy.deepcopy(ref).to("pjrt"), copy.deepcopy(ref).to("pjrt")
    step_fns = [eager, torch.compile(compiled_model, backend="pjrt")]
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (eager, compiled_model)]
    caplog.set_level("DEBUG", logger="pjrt_plugins.spmd.frontend._dynamo_backend")
    for length in (6, 9, 12, 9):
        idx, tgt = torch.randint(0, 32, (8, length)), torch.randint(0, 32, (8, length))
        losses = []
        for step, opt in zip(step_fns, opts):
            batch = [xs.mark_sharding(t.to("pjrt"), MESH, ("data", None)) for t in (idx, tgt)]
            opt.zero_grad()
            loss = step(*batch)
            loss.backward()
            opt.step()
            xs.sync()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-5), length
    for p, q in zip(eager.parameters(), compiled_model.parameters()):
        assert_close("parameter", q.cpu(), p.cpu())
    assert "op by op" not in caplog.text, caplog.text
    assert "a region for the sizes" in caplog.text  # the graphs of lengths 9 and 12 are dynamic
    idx = torch.zeros(8, 7, dtype=torch.long).to("pjrt")
    ops, _ = _recorded_ops(lambda: step_fns[1](idx, idx))
    assert ops == 1  # the forward of a length never seen: one region


def test_an_integer_that_keeps_changing_stops_making_regions(engine, caplog, monkeypatch):
    # A step counter becomes a symbolic int after it changes once: a region per value, kept for the process,
    # would pile up, so past MAX_SIGNATURES the graph runs op by op.

    from pjrt_plugins.spmd.frontend import _dynamo_backend
    from pjrt_plugins.spmd.lowering import _region

    monkeypatch.setattr(_dynamo_backend, "MAX_SIGNATURES", 3)
    compiled = torch.compile(lambda a, step: a * step + step, backend="pjrt")
    x = torch.randn(4)
    xp = x.to("pjrt")
    caplog.set_level("INFO", logger="pjrt_plugins.spmd.frontend._dynamo_backend")
    for step in range(1, 9):
        assert_close(f"step {step}", compiled(xp, step).cpu(), x * step + step)
    assert caplog.text.count("met more than 3 signatures") == 1, caplog.text
    regions = len(_region._regions)
    for step in range(9, 12):
        assert_close(f"step {step}", compiled(xp, step).cpu(), x * step + step)
    assert len(_region._regions) == regions


def test_a_dynamic_graph_that_is_no_region_runs_op_by_op(engine, caplog):
    compiled = torch.compile(lambda a: (a * 2).cpu() + 1, backend="pjrt", dynamic=True)
    caplog.set_level("INFO", logger="pjrt_plugins.spmd.frontend._dynamo_backend")
    for n in (3, 5):
        x = torch.randn(n)
        out = compiled(x.to("pjrt"))
        assert out.device.type == "cpu"
        assert_close(f"size {n}", out, x * 2 + 1)
    assert "op by op on the pjrt device for these shapes" in caplog.text


def test_a_view_input_torch_lays_out_otherwise_gets_a_clear_error(engine):
    # A pjrt view reports contiguous strides from offset 0; dynamo rebuilds a view input from its base and its
    # internal check fails on x[:, :8] (not contiguous) and x[1:] (offset 16). The error says what to do instead.
    x = torch.randn(4, 16)
    xp = x.to("pjrt")
    double = torch.compile(lambda a: a * 2, backend="pjrt")
    for view in (xp[:, :8], xp[1:], xp[2]):
        with pytest.raises(Exception, match=r"pass a copy \(x\[1:\]\.clone\(\)\) or pass the whole tensor and "
                                            r"take the view inside"):
            double(view)
    assert_close("a copy", double(xp[:, :8].clone()).cpu(), x[:, :8] * 2)
    assert_close("rows", double(xp[:2]).cpu(), x[:2] * 2)  # a view laid out contiguously passes
    inside = torch.compile(lambda a, n: a[:, :n] * 2, backend="pjrt")
    for n in (8, 12):
        assert_close(f"view inside, {n}", inside(xp, n).cpu(), x[:, :n] * 2)


@pytest.mark.parametrize("dynamic", [False, True])
def test_numbers_made_in_the_compiled_code_are_part_of_the_region(engine, dynamic, caplog):
    # torch.tensor(2.5) in compiled code is a 0-d CPU constant that torch lifts out as a graph attribute.
    def f(a):
        return torch.where(a > 0, a * torch.tensor(2.5), torch.tensor(float("-inf")))

    compiled = torch.compile(f, backend="pjrt", dynamic=dynamic)
    caplog.set_level("INFO", logger="pjrt_plugins.spmd.frontend._dynamo_backend")
    for rows in (2, 5):
        x = torch.randn(rows, 3)
        ops, out = _recorded_ops(lambda x=x: compiled(x.to("pjrt")))
        assert ops == 1
        assert torch.equal(out.cpu(), f(x))
    assert "op by op" not in caplog.text, caplog.text


@pytest.mark.parametrize("dynamic", [False, True])
def test_tensors_made_from_python_data_inside_are_part_of_the_region(engine, dynamic, caplog):
    # torch.tensor(list, device=x.device) is built in C++ past dynamo's fake mode: transformers' KV cache
    # starts from torch.tensor([], device=...) in every forward.
    def f(a):
        empty = torch.tensor([], dtype=a.dtype, device=a.device)
        table = torch.tensor([1.0, -2.0, 3.0], dtype=a.dtype, device=a.device)
        picks = torch.tensor([2, 0], device=a.device)
        return torch.cat([empty, a * table]).index_select(1, picks)

    compiled = torch.compile(f, backend="pjrt", dynamic=dynamic)
    caplog.set_level("INFO", logger="pjrt_plugins.spmd.frontend._dynamo_backend")
    for rows in (2, 5):
        x = torch.randn(rows, 3)
        ops, out = _recorded_ops(lambda x=x: compiled(xs.mark_sharding(x.to("pjrt"), MESH, (None, None))))
        assert ops == 1
        assert torch.equal(out.cpu(), f(x))
    assert "op by op" not in caplog.text, caplog.text


def test_in_place_writes_into_tensors_made_inside_are_kept(engine):
    # A static KV cache: zeros made on the first call, traced values written into them with index_copy_, and a
    # position counter moved to pjrt and advanced in place; later calls update the same tensors.
    class Cache:
        keys: torch.Tensor | None = None

        def __init__(self) -> None:
            self.length = torch.tensor(0)

    def step(x, cache):
        if cache.keys is None:
            cache.keys = torch.zeros(x.shape[0], 6, dtype=x.dtype, device=x.device)
            cache.length = cache.length.to(x.device)
        positions = torch.arange(x.shape[1], device=x.device) + cache.length
        cache.length.add_(x.shape[1])
        cache.keys.index_copy_(1, positions, x)
        return cache.keys.sum(0)

    compiled = torch.compile(step, backend="pjrt")
    want, got = Cache(), Cache()
    for width in (3, 1, 1):
        x = torch.randn(4, width)
        assert_close(f"a call with {width} new columns", compiled(x.to("pjrt"), got).cpu(), step(x, want))
        assert torch.equal(got.keys.cpu(), want.keys)
        assert int(got.length.cpu()) == int(want.length)


def test_printing_a_pjrt_tensor_under_a_fake_mode_downloads_nothing(engine):
    # Dynamo formats its errors with repr() of the arguments under its fake mode, where a download fails with
    # an unrelated error that hid the real one.
    xp = torch.arange(6.0).to("pjrt") + 1
    xs.sync()
    downloaded = xs.metrics().bytes_downloaded
    with FakeTensorMode():
        text = repr(xp)
    assert "size=(6,)" in text and "torch.float32" in text, text
    assert xs.metrics().bytes_downloaded == downloaded
    assert "2." in repr(xp)  # outside any mode: the values
