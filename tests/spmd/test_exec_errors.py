"""Clear errors for what the pjrt device cannot run, and the opt-in, counted CPU fallback."""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import DataDependentShapeError, UnsupportedOpError
from pjrt_plugins.spmd.frontend import _fallback
from pjrt_plugins.spmd.trace import _materialize
from pjrt_plugins.spmd.transport import TensorState

from _exec_support import assert_close, engine  # noqa: F401


def test_unsupported_op_gives_an_error_naming_the_op(engine):
    x = torch.randn(4, 4)
    t = x.to("pjrt")
    y = t * 2  # pending work before the bad op survives it
    with pytest.raises(UnsupportedOpError, match=r"aten\._linalg_svd\.default") as info:
        torch.linalg.svdvals(t)
    assert info.value.op == "aten._linalg_svd.default"
    assert "set_cpu_fallback" in str(info.value)
    assert xs.metrics().executions == 0
    assert_close("pending work", y.cpu(), x * 2)


def test_data_dependent_shapes_are_refused_with_a_hint_when_strict(engine):
    t = torch.randn(4, 4).to("pjrt")
    with pytest.raises(DataDependentShapeError, match="boolean mask.*torch.where"):
        t[t > 0]


def test_out_forms_run_natively_into_their_out_tensors(engine):
    t = torch.randn(4).to("pjrt")
    out = torch.empty(4).to("pjrt")
    torch.add(t, t, out=out)
    assert_close("add out=", out.cpu(), t.cpu() * 2)
    assert xs.metrics().fallbacks == 0


def test_explicit_generators_are_refused(engine):
    t = torch.rand(4, 4).to("pjrt")
    with pytest.raises(UnsupportedOpError, match="torch.Generator"):
        torch.bernoulli(t, generator=torch.Generator().manual_seed(0))


def test_combining_with_another_device_is_an_error(engine):
    t = torch.randn(4).to("pjrt")
    with pytest.raises(Exception, match="meta"):
        t + torch.randn(4, device="meta")


def test_strict_mode_refuses_what_the_cpu_fallback_would_run(engine):
    x = torch.randn(5, 7)
    t = xs.mark_sharding(x.to("pjrt"), xs.Mesh(range(8), (2, 4)), (None, None))
    assert not _fallback.cpu_fallback_enabled()
    with pytest.raises(UnsupportedOpError, match="_linalg_svd.*fallback is off"):
        torch.linalg.svdvals(t @ t.T + torch.eye(5).to("pjrt"))
    assert xs.metrics().fallbacks == 0


def test_a_failed_graph_leaves_its_tensors_with_a_clear_error(engine, monkeypatch):
    t = torch.randn(4).to("pjrt")
    y = t + 1

    def broken(*args, **kwargs):
        raise RuntimeError("compiler exploded")

    monkeypatch.setattr(_materialize, "program_for", broken)
    with pytest.raises(RuntimeError, match="compiler exploded"):
        xs.sync()
    monkeypatch.undo()
    assert y._pjrt_data.state is TensorState.LAZY
    with pytest.raises(Exception, match="failed earlier"):
        y.cpu()
    # New work is unaffected.
    assert_close("after a failure", (t * 3).cpu(), t.cpu() * 3)
