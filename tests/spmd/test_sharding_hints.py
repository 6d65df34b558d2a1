"""Sharding hints inside computations: ``mark_sharding_with_gradients`` / ``MarkShardingFunction``,
``mark_sharding`` inside ``torch.compile(backend="pjrt")`` without a graph break, ``annotate_custom_sharding``,
``shard_as``, ``optimization_barrier_`` and ``apply_backward_optimization_barrier``.

All on the real 8-device CPU plugin: numbers are compared with torch on the CPU, shardings with what
the partitioner reports, and the compiled programs' StableHLO is read for the hints.
"""

from __future__ import annotations


import pytest
import torch
import torch.nn as nn

import pjrt_plugins.spmd as xs
import pjrt_plugins.spmd.xla_model as xm
from pjrt_plugins.errors import ShardingError
from pjrt_plugins.spmd.execution import PROGRAMS

from _exec_support import engine  # noqa: F401

MESH = xs.Mesh(range(8), (2, 4), ("data", "model"))
ROWS = "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
COLS = "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # conftest.py


def _spec(partition) -> str:
    return MESH.get_op_sharding(partition).to_hlo()


#: How the last program writes a constraint to split columns over "model", and a shard group, by partitioner.
_COLUMNS = {"gspmd": "devices=[1,4,2]", "shardy": '[{}, {"model"}]'}
_GROUP = {"gspmd": "shard_as", "shardy": "sdy.sharding_group"}


def _last_program() -> tuple[str, str]:
    lowered = PROGRAMS.last.lowered
    return lowered.partitioner, lowered.text


def test_mark_sharding_with_gradients_shards_the_result_and_its_gradient(engine):
    x0 = torch.randn(8, 16)
    x = x0.to("pjrt").requires_grad_()
    h = xs.mark_sharding_with_gradients(x, MESH, ("data", None))
    assert h is not x and h.sharding_spec == _spec(("data", None))
    (h * h).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), 2 * x0)
    # The gradient flowing back through the annotation carries the annotated sharding.
    assert x.grad.sharding_spec == _spec(("data", None))
    assert x.sharding_spec != h.sharding_spec  # x itself was not annotated in place


def test_mark_sharding_function_is_the_autograd_function_behind_it(engine):
    x = torch.randn(8, 4).to("pjrt").requires_grad_()
    h = xs.MarkShardingFunction.apply(x, MESH, (None, "model"))
    h.sum().backward()
    assert x.grad.sharding_spec == _spec((None, "model"))
    with pytest.raises(ShardingError):
        xs.mark_sharding_with_gradients(x, MESH, ("data",))  # one entry for two dimensions


def test_mark_sharding_in_a_compiled_function_breaks_no_graph_and_constrains(engine):
    def f(a):
        b = a + 1
        xs.mark_sharding(b, MESH, (None, "model"))
        return b * 2

    x = torch.randn(8, 8)
    explained = torch._dynamo.explain(f)(x.to("pjrt"))
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="pjrt", fullgraph=True)
    out = compiled(x.to("pjrt"))
    torch.testing.assert_close(out.cpu(), (x + 1) * 2)
    partitioner, text = _last_program()
    assert _COLUMNS[partitioner] in text, text


def test_use_dynamo_custom_op_is_accepted(engine):
    def f(a):
        b = a * 3
        xs.mark_sharding(b, MESH, ("data", None), use_dynamo_custom_op=True)
        return b.sum(0)

    x = torch.randn(8, 4)
    compiled = torch.compile(f, backend="pjrt", fullgraph=True)
    torch.testing.assert_close(compiled(x.to("pjrt")).cpu(), (x * 3).sum(0))
    eager = xs.mark_sharding(torch.randn(8, 4).to("pjrt"), MESH, ("data", None), use_dynamo_custom_op=True)
    assert eager.sharding_spec == ROWS


def test_mark_sharding_with_gradients_in_a_compiled_training_step(engine):
    torch.manual_seed(0)
    a0, w0 = torch.randn(8, 16), torch.randn(16, 4)

    def loss_fn(a, w):
        h = xs.mark_sharding_with_gradients(a @ w, MESH, ("data", None))
        return (h * h).sum()

    compiled = torch.compile(loss_fn, backend="pjrt", fullgraph=True)
    a, w = a0.to("pjrt").requires_grad_(), w0.to("pjrt").requires_grad_()
    compiled(a, w).backward()
    ac, wc = a0.clone().requires_grad_(), w0.clone().requires_grad_()
    ((ac @ wc) ** 2).sum().backward()
    torch.testing.assert_close(a.grad.cpu(), ac.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad.cpu(), wc.grad, rtol=1e-4, atol=1e-4)


def test_annotate_custom_sharding_keeps_the_data_and_constrains_the_next_ops(engine):
    x0 = torch.randn(8, 8)
    t = xs.mark_sharding(x0.to("pjrt"), MESH, ("data", None))
    assert xs.annotate_custom_sharding(t, MESH, (None, "model")) is t
    xs.sync()
    torch.testing.assert_close((t + 1).cpu(), x0 + 1)
    with pytest.raises(ShardingError):
        xs.annotate_custom_sharding(t, MESH, ("data",))


def test_shard_as_gives_both_tensors_one_sharding(engine):
    a0, b0 = torch.randn(8, 4), torch.randn(8, 4)
    b = xs.mark_sharding(b0.to("pjrt"), MESH, ("data", None))
    a, b2 = xs.shard_as(a0.to("pjrt") * 2, b + 1)
    out = a + b2
    xs.sync()
    torch.testing.assert_close(out.cpu(), a0 * 2 + b0 + 1)
    assert a.sharding_spec == b2.sharding_spec == ROWS
    partitioner, text = _last_program()
    assert _GROUP[partitioner] in text, text
    pa, pb = xs.shard_as({"x": a0.to("pjrt"), "y": None}, {"x": b, "y": None})
    assert pa["y"] is None and pb["x"].shape == (8, 4)
    with pytest.raises(ValueError, match="same structure"):
        xs.shard_as([a0.to("pjrt")], (b,))


def test_optimization_barrier_keeps_values_and_reaches_the_program(engine):
    x0 = torch.randn(4, 4)
    x = x0.to("pjrt")
    y = x * 2
    xm.optimization_barrier_([x, y])
    z = (x + y).sum()
    torch.testing.assert_close(z.cpu(), (x0 * 3).sum())
    assert "optimization_barrier" in PROGRAMS.last.lowered.text


def test_apply_backward_optimization_barrier_leaves_the_gradients_unchanged(engine):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    ref = [p.detach().clone() for p in model.parameters()]
    x0 = torch.randn(4, 8)
    model(x0).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    device_model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2)).to("pjrt")
    with torch.no_grad():
        for p, r in zip(device_model.parameters(), ref):
            p.copy_(r.to("pjrt"))
    xs.apply_backward_optimization_barrier(device_model[0])
    x = x0.to("pjrt").requires_grad_()  # the hook fires with the gradient of the module's input
    device_model(x).sum().backward()
    xs.sync()
    for p, e in zip(device_model.parameters(), expected):
        torch.testing.assert_close(p.grad.cpu(), e, rtol=1e-5, atol=1e-5)
    assert "optimization_barrier" in PROGRAMS.last.lowered.text


def test_the_other_hints_inside_a_compiled_function_break_no_graph(engine):
    def f(a, b):
        a2, b2 = xs.shard_as(a * 2, b + 1)
        xs.annotate_custom_sharding(a2, MESH, (None, "model"))
        h = a2 + b2
        xm.optimization_barrier_([h])
        return h.sum(0)

    a0, b0 = torch.randn(8, 8), torch.randn(8, 8)
    b = xs.mark_sharding(b0.to("pjrt"), MESH, ("data", None))
    explained = torch._dynamo.explain(f)(a0.to("pjrt"), b)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="pjrt", fullgraph=True)
    out = compiled(a0.to("pjrt"), b)
    torch.testing.assert_close(out.cpu(), (a0 * 2 + b0 + 1).sum(0))
    partitioner, text = _last_program()
    assert _GROUP[partitioner] in text and "optimization_barrier" in text and _COLUMNS[partitioner] in text, text
