"""``torch.nonzero_static`` lowered natively (static shapes), against torch's CPU kernel on the CPU plugin's 8 devices.

The result has ``size`` rows: the row-major indices of the first ``size`` nonzero elements, then ``fill_value``
rows. Every dtype torch's CPU kernel takes, sizes below, at and above the count, 1-D to 3-D, 0-d and empty inputs.
"""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs

from _exec_support import engine, run, spec  # noqa: F401

#: The dtypes torch's CPU kernel takes; complex32 is left out because no pjrt tensor holds it (the transfer
#: refuses ComplexHalf before any op runs).
DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.complex64, torch.complex128]


def _sample(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Small integers (about half of them zero) in ``dtype``; complex ones with a zero part now and then."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, shape, generator=g) * torch.randint(0, 2, shape, generator=g)
    if dtype.is_complex:
        return torch.complex(x.double(), torch.randint(-1, 2, shape, generator=g).double() * (x == 0)).to(dtype)
    return x.to(dtype)


def _check(x: torch.Tensor, size: int, fill_value: int = -1) -> torch.Tensor:
    got = torch.nonzero_static(x.to("pjrt"), size=size, fill_value=fill_value).cpu()
    want = torch.nonzero_static(x, size=size, fill_value=fill_value)
    assert got.dtype == want.dtype and tuple(got.shape) == tuple(want.shape), (got.dtype, got.shape, want.shape)
    assert torch.equal(got, want), f"{x.dtype}{list(x.shape)} size={size} fill={fill_value}:\n{got}\nCPU:\n{want}"
    return got


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_matches_the_cpu_kernel_below_at_and_above_the_count(engine, dtype):
    x = _sample((4, 5), dtype)
    count = int((x != 0).sum())
    assert 0 < count < x.numel()
    for size in (count - 3, count, count + 4, x.numel() + 3):
        _check(x, size)
    assert xs.metrics().fallbacks == 0  # strict fixture: a fallback would have raised


@pytest.mark.parametrize("shape", [(9,), (3, 4), (2, 3, 4), (2, 1, 3, 2)], ids=str)
def test_each_rank_lists_row_major_indices_and_fills_the_rest(engine, shape):
    x = _sample(shape, torch.float32, seed=len(shape))
    count = int((x != 0).sum())
    for size, fill in ((count // 2, -1), (count + 2, 7), (count + 2, -100)):
        _check(x, size, fill)


def test_nan_is_nonzero_and_negative_zero_is_zero(engine):
    x = torch.tensor([[float("nan"), -0.0, 0.0], [float("inf"), 0.0, -1e-30]])
    assert _check(x, 5).tolist() == [[0, 0], [1, 0], [1, 2], [-1, -1], [-1, -1]]


@pytest.mark.parametrize("shape", [(0,), (0, 3), (2, 0, 4)], ids=str)
def test_an_empty_input_gives_only_fill_rows(engine, shape):
    got = _check(torch.zeros(shape), 3, fill_value=4)
    assert got.tolist() == [[4] * len(shape)] * 3


@pytest.mark.parametrize("value", [0.0, 2.5])
def test_a_zero_dim_input_has_no_coordinates(engine, value):
    _check(torch.tensor(value), 3)


def test_size_zero_and_an_all_zero_input(engine):
    _check(_sample((3, 4), torch.int32), 0)
    assert _check(torch.zeros(3, 4, dtype=torch.int64), 2).tolist() == [[-1, -1], [-1, -1]]
    assert _check(torch.ones(2, 2), 2).tolist() == [[0, 0], [0, 1]]  # every element nonzero, size below the count


def test_a_sharded_input_lowers_to_one_program(engine):
    """Rows of the input split over the 8 devices: the sort runs in the same program, no fallback."""
    x = _sample((16, 6), torch.float32, seed=3)
    outs, program = run(lambda t: torch.nonzero_static(t, size=40, fill_value=-2), [x], [spec(0, None)])
    assert torch.equal(outs[0], torch.nonzero_static(x, size=40, fill_value=-2))
    assert "aten.nonzero_static.default" in program.lowered.ops


def test_the_count_changes_but_the_program_does_not(engine):
    """A fixed size is the point: new data with another count runs the program compiled for the first."""
    xs.reset_metrics()
    results = []
    for seed in range(3):
        x = _sample((6, 5), torch.float32, seed=seed)
        results.append(_check(x, 12))
    assert xs.metrics().compiles == 1, xs.metrics()


def test_under_torch_compile_it_is_part_of_the_graph(engine, fresh_dynamo):
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero_static(x > 0, size=8, fill_value=-1) * 2

    x = _sample((4, 4), torch.float32, seed=5)
    got = torch.compile(f, backend="pjrt")(x.to("pjrt")).cpu()
    assert torch.equal(got, f(x))


def test_bad_arguments_raise_as_on_the_cpu(engine):
    x = torch.ones(3).to("pjrt")
    with pytest.raises(RuntimeError, match="'size' must be a non-negative integer, got -1"):
        torch.nonzero_static(x, size=-1)
    with pytest.raises(RuntimeError, match="torch.uint16"):
        torch.nonzero_static(torch.ones(3, dtype=torch.uint16).to("pjrt"), size=2)
    with pytest.raises(RuntimeError, match="not implemented for 'UInt16'"):
        torch.nonzero_static(torch.ones(3, dtype=torch.uint16), size=2)


def test_the_out_variant_writes_the_result(engine):
    x = _sample((3, 4), torch.float32, seed=6)
    out = torch.empty(5, 2, dtype=torch.int64).to("pjrt")
    assert torch.nonzero_static(x.to("pjrt"), size=5, out=out) is out
    assert torch.equal(out.cpu(), torch.nonzero_static(x, size=5))
