"""cumsum and cumprod over long dimensions: shifted sums (O(n log n)) instead of one reduce_window as long as the
dimension, which XLA's CPU backend runs in O(n^2). Checked against torch's CPU kernels: integers and booleans
exactly, floats against a float64 reference within the error of float32 arithmetic."""

from __future__ import annotations

import pytest
import torch

from pjrt_plugins.spmd.lowering._reductions import WINDOW_SCAN_MAX

from _exec_support import engine, run, spec  # noqa: F401

LONG = 4 * WINDOW_SCAN_MAX + 3  # not a power of two: the last shift covers part of the dimension


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8], ids=str)
def test_integer_scans_over_a_long_dimension_are_exact(engine, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (3, LONG), generator=g).to(dtype)
    assert torch.equal(x.to("pjrt").cumsum(1).cpu(), x.cumsum(1))
    factors = torch.where(torch.rand(3, LONG, generator=g) < 0.01, 2, 1).to(dtype if dtype != torch.bool else torch.int64)
    assert torch.equal(factors.to("pjrt").cumprod(1).cpu(), factors.cumprod(1))


@pytest.mark.parametrize("shape, dim", [((LONG, 2, 5), 0), ((2, LONG, 3), 1), ((2, 3, LONG), -1)], ids=str)
def test_float_scans_over_a_long_dimension_match_a_float64_reference(engine, shape, dim):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    got = x.to("pjrt").cumsum(dim).cpu()
    exact = x.double().cumsum(dim)
    assert got.dtype == torch.float32
    assert (got.double() - exact).abs().max() <= 1e-6 * x.shape[dim] * x.abs().max()
    factors = 1 + 1e-3 * x
    got = factors.to("pjrt").cumprod(dim).cpu().double()
    exact = factors.double().cumprod(dim)
    assert ((got - exact) / exact).abs().max() < 1e-4


def test_a_long_scan_of_a_sharded_tensor_is_one_program(engine):
    x = torch.randn(LONG, 8)
    outs, program = run(lambda t: torch.cumsum(t, 0), [x], [spec(None, 0)])
    assert (outs[0].double() - x.double().cumsum(0)).abs().max() < 1e-3
    assert "aten.cumsum.default" in program.lowered.ops


def test_at_the_threshold_the_window_and_the_shifted_sums_agree(engine):
    x = torch.randint(-5, 6, (2, WINDOW_SCAN_MAX + 1))
    window = x[:, :WINDOW_SCAN_MAX].to("pjrt").cumsum(1).cpu()
    shifted = x.to("pjrt").cumsum(1).cpu()
    assert torch.equal(window, x[:, :WINDOW_SCAN_MAX].cumsum(1))
    assert torch.equal(shifted, x.cumsum(1))
