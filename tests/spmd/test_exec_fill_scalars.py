"""Int and bool fill values (``torch.full(size, flag)``, ``x.fill_(n)``) are run-time scalars, as float fills are:
a value that changes every step (``generate``'s stop flag, a step counter) reuses the program compiled for the
first one. Shapes, dtypes and sizes stay part of the program; the ints 0 and 1 (``torch.zeros``/``torch.ones``)
and ints too large for a float64 stay constants."""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs

from _exec_support import engine  # noqa: F401

MESH = xs.Mesh(range(8), (8,), ("data",))


def _rows(t: torch.Tensor) -> torch.Tensor:
    return xs.mark_sharding(t.to("pjrt"), MESH, ("data",) + (None,) * (t.dim() - 1))


def _compiles_per_value(values: list, make) -> list[int]:
    counts = []
    for value in values:
        before = xs.metrics().compiles
        make(value)
        counts.append(xs.metrics().compiles - before)
    return counts


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.int32, torch.uint8])
def test_fill_values_of_an_integer_or_bool_full_are_one_program(engine, dtype):
    x = torch.arange(8)
    x_p = _rows(x)
    values = [True, False, True] if dtype is torch.bool else [2, 7, -3 if dtype.is_signed else 200]

    def step(value):
        got = (x_p + torch.full((8,), value, dtype=dtype, device="pjrt")).cpu()
        assert torch.equal(got, x + torch.full((8,), value, dtype=dtype)), value

    counts = _compiles_per_value(values, step)
    assert counts[1:] == [0] * (len(values) - 1), f"programs compiled per value: {counts}"


def test_a_bool_flag_without_a_dtype_keeps_the_bool_dtype(engine):
    # MaxLengthCriteria: torch.full((B,), is_done) with is_done a Python bool; an int in the same place is int64.
    mask_p = _rows(torch.tensor([True, False] * 4))
    for value in (False, True, 5, 9, True):
        def combine(full: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return full | mask if type(value) is bool else full + mask

        got = combine(torch.full((8,), value, device="pjrt"), mask_p).cpu()
        want = combine(torch.full((8,), value), mask_p.cpu())
        assert got.dtype == want.dtype and torch.equal(got, want), value


def test_fill_of_a_pending_integer_tensor_with_a_changing_value_is_one_program(engine):
    x = torch.arange(16).reshape(8, 2)
    x_p = _rows(x)

    def step(value):
        got = (x_p * 3).fill_(value).add(x_p).cpu()
        assert torch.equal(got, (x * 3).fill_(value).add(x)), value

    counts = _compiles_per_value([4, 11, -6], step)
    assert counts[1:] == [0, 0], f"programs compiled per value: {counts}"


def test_ints_a_float64_cannot_hold_stay_exact_constants(engine):
    x_p = _rows(torch.zeros(8, dtype=torch.int64))
    for value in (2**62 + 1, 2**62 + 3, -(2**60) - 1):
        got = (x_p + torch.full((8,), value, dtype=torch.int64, device="pjrt")).cpu()
        assert torch.equal(got, torch.full((8,), value, dtype=torch.int64)), value
