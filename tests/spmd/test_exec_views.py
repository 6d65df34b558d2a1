"""Views on the pjrt device alias their base as torch's do: a write into the base reaches every live view, a
write into a view reaches the base and the other views, across chains of views, multi-output views (split,
unbind), views the CPU fallback makes (view_as_real, unfold) and materializations. Each case runs on the CPU
and on pjrt and must give the same tensors (these were silent wrong answers: views were snapshots)."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import CpuFallbackWarning

from _exec_support import engine  # noqa: F401


def _base_written_after_views(dev: str) -> list[torch.Tensor]:
    x = torch.zeros(3, 4, device=dev)
    views = [x[0], x.t(), x.view(12), x[:, 1:3], x.diagonal()]
    x.add_(1)
    x[1, 2] = 7
    return [*views, x]


def _sibling_views(dev: str) -> list[torch.Tensor]:
    x = torch.zeros(3, 4, device=dev)
    row, col = x[0], x[:, 0]
    row.fill_(2)
    col.add_(5)
    return [row, col, x]


def _chain_of_views(dev: str) -> list[torch.Tensor]:
    x = torch.arange(12.).reshape(3, 4).to(dev)
    t = x.t()
    row = t[1]
    x.mul_(2)
    row.add_(100)
    return [x, t, row]


def _intermediate_view_dropped(dev: str) -> list[torch.Tensor]:
    x = torch.zeros(4, 6, device=dev)
    piece = x.t()[2:4]  # the transposed intermediate is gone: the piece still writes into x
    piece.add_(3)
    return [x, piece]


def _written_after_materializing(dev: str) -> list[torch.Tensor]:
    x = torch.zeros(4, device=dev)
    v = x[1:3]
    if dev != "cpu":
        xs.sync()
    x.add_(3)
    return [v, x]


def _copy_from_the_cpu(dev: str) -> list[torch.Tensor]:
    x = torch.zeros(2, 3, device=dev)
    v = x[1]
    x.copy_(torch.ones(2, 3))
    return [v]


def _unbind_and_split(dev: str) -> list[torch.Tensor]:
    x = torch.zeros(2, 6, device=dev)
    a, b = x.unbind(0)
    first, second = x.split(4, dim=1)
    a.add_(1)
    second.add_(2)
    x.mul_(3)
    return [x, a, b, first, second]


def _complex_from_parts(dev: str) -> list[torch.Tensor]:
    real, imag = torch.tensor([1., 2., 3.]), torch.tensor([4., 5., 6.])
    return [torch.view_as_real(torch.complex(real.to(dev), imag.to(dev)))]


def _fallback_views(dev: str) -> list[torch.Tensor]:
    c = torch.zeros(3, dtype=torch.complex64, device=dev)
    r = torch.view_as_real(c)
    r[:, 1] = 2
    c.mul_(torch.full((3,), 2 + 1j).to(dev))
    x = torch.zeros(6, device=dev)
    u = x.unfold(0, 2, 2)
    x.add_(torch.arange(6.).to(dev))
    return [torch.view_as_real(c), r, u]


CASES: dict[str, Callable[[str], list[torch.Tensor]]] = {
    "base written after views": _base_written_after_views,
    "sibling views": _sibling_views,
    "chain of views": _chain_of_views,
    "intermediate view dropped": _intermediate_view_dropped,
    "written after materializing": _written_after_materializing,
    "copy from the cpu": _copy_from_the_cpu,
    "unbind and split": _unbind_and_split,
    "complex from parts": _complex_from_parts,
    "fallback views": _fallback_views,
}


@pytest.mark.parametrize("case", CASES)
def test_views_alias_their_base_as_on_the_cpu(engine, case):
    want = CASES[case]("cpu")
    xs.set_cpu_fallback(True)  # view_as_real and unfold go through it (the fixture is strict)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CpuFallbackWarning)
        got = [t.cpu() for t in CASES[case]("pjrt")]
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), f"{case}: tensor {i} is {g}, the CPU gives {w}"


def test_writing_into_an_expanded_view_raises_as_on_the_cpu(engine):
    x = torch.zeros(1, 3).to("pjrt")
    xs.set_cpu_fallback(True)  # the write is done on the CPU, which raises
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CpuFallbackWarning)
        with pytest.raises(RuntimeError, match="single memory location"):
            x.expand(2, 3).add_(1)
    assert torch.equal(x.cpu(), torch.zeros(1, 3))


def test_a_step_with_views_of_a_parameter_still_hits_the_trace_cache(engine):
    """Views made every step register with their base and die with the step: the program does not change."""
    w = torch.ones(8, 8).to("pjrt")
    for step in range(4):
        y = (w.t()[0:4] * 2).sum()
        w.sub_(0.1 * y)
        xs.sync()
        if step == 1:
            before = xs.metrics()
    after = xs.metrics()
    assert (after.compiles - before.compiles, after.cache_hits - before.cache_hits) == (0, 2)
    assert len(w._pjrt_data.live_views()) == 0

