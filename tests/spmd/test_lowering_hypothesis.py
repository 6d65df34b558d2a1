"""Random shapes and partition specs (hypothesis) for the elementwise, matmul and reduction lowerings.

Every example compiles one program on the real 8-device CPU plugin, so the example counts stay small.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _exec_support import assert_close, ensure_cpu8, run, spec

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: The mesh axes an entry may use: none, one of (2, 4), or both merged.
AXES = [None, 0, 1, (0, 1), (1, 0)]


@pytest.fixture(scope="module", autouse=True)
def _cpu8():
    ensure_cpu8()


@st.composite
def shapes_and_spec(draw, min_rank=1, max_rank=3):
    rank = draw(st.integers(min_rank, max_rank))
    shape = tuple(draw(st.integers(1, 9)) for _ in range(rank))
    entries, used = [], set()
    for _ in range(rank):
        options = [a for a in AXES if a is None or not (set(a if isinstance(a, tuple) else (a,)) & used)]
        entry = draw(st.sampled_from(options))
        if entry is not None:
            used |= set(entry if isinstance(entry, tuple) else (entry,))
        entries.append(entry)
    return shape, spec(*entries)


def _tensor(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g)


BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": lambda a, b: a / (b.abs() + 0.5),
    "maximum": torch.maximum,
    "where": lambda a, b: torch.where(a > b, a * 2, b),
    "pow": lambda a, b: a.abs().pow(b.clamp(-2, 2)),
}


@SETTINGS
@given(data=shapes_and_spec(), other=st.sampled_from([None, 0, 1]), op=st.sampled_from(sorted(BINARY)),
       seed=st.integers(0, 1000))
def test_elementwise_with_random_shapes_and_specs(data, other, op, seed):
    shape, s = data
    x = _tensor(shape, seed)
    # The second operand broadcasts from a trailing slice of the first one's shape.
    y = _tensor(shape[-1:], seed + 1)
    y_spec = spec(other)
    outs, _ = run(lambda a, b: [BINARY[op](a, b), BINARY[op](b, a)], [x, y], [s, y_spec])
    for o, r in zip(outs, [BINARY[op](x, y), BINARY[op](y, x)]):
        assert_close(op, o, r)


@SETTINGS
@given(m=st.integers(1, 9), k=st.integers(1, 17), n=st.integers(1, 9), batch=st.sampled_from([None, 1, 3]),
       a_axes=st.sampled_from([(None, None), (0, None), (None, 1), (0, 1), (1, 0)]),
       b_axes=st.sampled_from([(None, None), (0, None), (None, 1), (1, None), (None, 0)]),
       seed=st.integers(0, 1000))
def test_matmul_with_random_shapes_and_specs(m, k, n, batch, a_axes, b_axes, seed):
    if batch is None:
        a, b = _tensor((m, k), seed), _tensor((k, n), seed + 1)
        sa, sb = spec(*a_axes), spec(*b_axes)
        fn = lambda a, b: [a @ b, torch.addmm(b[0], a, b)]  # noqa: E731
    else:
        a, b = _tensor((batch, m, k), seed), _tensor((batch, k, n), seed + 1)
        sa, sb = spec(None, *a_axes), spec(None, *b_axes)
        fn = lambda a, b: [torch.bmm(a, b), a @ b]  # noqa: E731
    outs, _ = run(fn, [a, b], [sa, sb])
    for o, r in zip(outs, fn(a, b)):
        assert_close("matmul", o, r, rtol=1e-5, atol=1e-5)


REDUCE = {
    "sum": lambda x, d: x.sum(d),
    "sum_keepdim": lambda x, d: x.sum(d, keepdim=True),
    "mean": lambda x, d: x.mean(d),
    "amax": lambda x, d: x.amax(d),
    "amin": lambda x, d: x.amin(d, keepdim=True),
    "argmax": lambda x, d: x.argmax(d),
    "softmax": lambda x, d: torch.softmax(x, d),
    "log_softmax": lambda x, d: torch.log_softmax(x, d),
    "var": lambda x, d: x.var(d, correction=0),
}


@SETTINGS
@given(data=shapes_and_spec(), op=st.sampled_from(sorted(REDUCE)), dim_seed=st.integers(0, 10), seed=st.integers(0, 1000))
def test_reductions_with_random_shapes_and_specs(data, op, dim_seed, seed):
    shape, s = data
    x = _tensor(shape, seed)
    d = dim_seed % len(shape)
    outs, _ = run(lambda x: [REDUCE[op](x, d), x.sum()], [x], [s])
    refs = [REDUCE[op](x, d), x.sum()]
    for o, r in zip(outs, refs):
        assert_close(op, o, r, rtol=1e-5, atol=1e-5)
