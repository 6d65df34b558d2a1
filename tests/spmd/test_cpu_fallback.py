"""The CPU fallback: on by default, warns once per op, counted, refused when strict, and robust.

Robust means: data-dependent shapes, in-place ops (also into a pending view), out= tensors,
several results, non-tensor results and autograd through a fallback op all give torch's answer.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import CpuFallbackWarning, UnsupportedOpError
from pjrt_plugins.spmd.frontend import _fallback

from _exec_support import assert_close, engine  # noqa: F401


@pytest.fixture
def fallback(engine):
    """The engine with the CPU fallback on (its default) and its warnings forgotten."""
    xs.set_cpu_fallback(True)
    _fallback._warned.clear()
    return engine


def test_the_fallback_is_on_by_default_and_the_environment_can_make_it_strict():
    code = "from pjrt_plugins.spmd.frontend import _fallback; print(_fallback.cpu_fallback_enabled())"
    default = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    strict = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "PJRT_CPU_FALLBACK": "0"})
    assert (default.stdout.strip(), strict.stdout.strip()) == ("True", "False"), (default.stderr, strict.stderr)


def test_each_op_warns_once_and_every_use_is_counted(fallback):
    t = torch.tensor([[1.0, -2.0], [0.0, 3.0]]).to("pjrt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            t.nonzero()
    mine = [w for w in caught if issubclass(w.category, CpuFallbackWarning)]
    assert len(mine) == 1 and "aten.nonzero.default" in str(mine[0].message)
    m = xs.metrics()
    assert m.fallbacks == 3 and m.fallback_ops == {"aten.nonzero.default": 3}


@pytest.mark.parametrize("name, fn", [
    ("nonzero", lambda t: t.nonzero()),
    ("masked_select", lambda t: torch.masked_select(t, t > 0)),
    ("boolean indexing", lambda t: t[t > 0]),
    ("unique", lambda t: torch.unique(t, sorted=True)),
    ("unique with inverse and counts", lambda t: torch.unique(t, return_inverse=True, return_counts=True)),
    ("boolean index_put", lambda t: t.clone().index_put_((t < 0,), torch.tensor(5.0))),
])
def test_data_dependent_shapes_run_through_the_fallback(fallback, name, fn):
    x = torch.tensor([[1.0, -2.0, 1.0], [0.0, 3.0, -2.0]])
    out, ref = fn(x.to("pjrt")), fn(x)
    outs, refs = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
    for o, r in zip(outs, refs):
        assert isinstance(o, xs.XLAShardedTensor), name
        assert_close(name, o.cpu(), r)
    assert xs.metrics().fallbacks >= 1


def test_strict_mode_refuses_with_the_op_name(fallback):
    xs.set_cpu_fallback(False)
    with pytest.raises(UnsupportedOpError, match="aten.nonzero.default.*fallback is off"):
        torch.ones(3).to("pjrt").nonzero()


def test_in_place_fallback_into_a_pending_view_reaches_its_base(fallback):
    x = torch.tensor([[1.0, -2.0], [0.0, 3.0]])
    y = x.to("pjrt") * 1  # pending
    row = y[1]
    row[row > 0] = 7.0  # index_put_ with a mask on a view: the fallback, written back into y
    expected = x * 1
    expected[1][expected[1] > 0] = 7.0
    assert_close("written through the view", y.cpu(), expected)


def test_out_tensors_get_the_results_and_keep_their_identity(fallback):
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out = torch.empty(3, 4).to("pjrt")
    returned = torch.add(a.to("pjrt"), b.to("pjrt"), out=out)
    assert returned is out
    assert_close("add out=", out.cpu(), a + b)
    values, indices = torch.empty(3).to("pjrt"), torch.empty(3, dtype=torch.long).to("pjrt")
    torch.max(a.to("pjrt"), 1, out=(values, indices))
    assert_close("max out= values", values.cpu(), a.max(1).values)
    assert_close("max out= indices", indices.cpu(), a.max(1).indices)
    with pytest.raises(RuntimeError, match="cannot be resized"):
        torch.add(a.to("pjrt"), b.to("pjrt"), out=torch.empty(2).to("pjrt"))


def test_autograd_flows_through_a_fallback_op(fallback):
    x = torch.randn(4, 5)
    t = x.to("pjrt").requires_grad_()
    (t[t > 0] ** 2).sum().backward()
    assert_close("grad through boolean indexing", t.grad.cpu(), torch.where(x > 0, 2 * x, torch.zeros_like(x)))


@pytest.mark.parametrize("name, fn", [
    ("complex", lambda a, b: torch.complex(a, b)),
    ("polar", lambda a, b: torch.polar(a.abs(), b)),
    ("complex arithmetic", lambda a, b: torch.view_as_real(torch.complex(a, b) * torch.complex(b, a)).sum(-1)),
    ("in place on a complex view", lambda a, b: torch.complex(a, b)[1:].mul_(2)),
    ("abs of a complex", lambda a, b: torch.complex(a, b).abs()),
])
def test_complex_numbers_run_through_the_fallback_not_the_lowering(fallback, name, fn):
    """No lowering computes complex numbers: they must reach the CPU, never give the lowering's wrong values."""
    torch.manual_seed(0)
    a, b = torch.randn(4), torch.randn(4)
    out = fn(a.to("pjrt"), b.to("pjrt"))
    assert_close(name, out.cpu(), fn(a, b))
    assert xs.metrics().fallbacks >= 1


def test_strict_mode_refuses_complex_numbers_with_the_op_name(fallback):
    xs.set_cpu_fallback(False)
    a = torch.randn(3).to("pjrt")
    with pytest.raises(UnsupportedOpError, match="aten.complex.default computes with complex numbers"):
        torch.complex(a, a)
