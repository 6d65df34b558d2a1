"""Ops whose dtypes torch's CPU kernels refuse, though their meta kernels accept them, are refused on pjrt too,
with torch's own error: ``lerp`` of integer or bool tensors, ``index_put_`` / ``index_add_`` with values of
another dtype than the target. Before, the engine computed them (lerp truncated the weight; the index ops cast
the values). Each case runs on the CPU first: torch's verdict there is what the pjrt device must give.
"""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs

from _exec_support import assert_close, engine  # noqa: F401

I = torch.arange(4)
F = torch.tensor([0.5, 1.5, 2.5, 3.5])
IDX = torch.tensor([1, 2])
LONGS = torch.tensor([7, 9])

#: name -> (the tensors, the op on them). In-place ops write into the first tensor.
REFUSED = {
    "lerp long, scalar weight": ((I, I * 3), lambda a, b: torch.lerp(a, b, 0.5)),
    "lerp long, tensor weight": ((I, I * 3, torch.full((4,), 2)), lambda a, b, w: torch.lerp(a, b, w)),
    "lerp_ long": ((I, I * 3), lambda a, b: a.lerp_(b, 0.5)),
    "lerp bool": ((I.bool(), I.bool()), lambda a, b: torch.lerp(a, b, True)),
    "lerp float, long end": ((F, I), lambda a, b: torch.lerp(a, b, 0.5)),
    "lerp float, half weight": ((F, F * 2, F.half()), lambda a, b, w: torch.lerp(a, b, w)),
    "index_put_ long into float": ((F, IDX, LONGS), lambda t, i, v: t.index_put_((i,), v)),
    "index_put_ double into float": ((F, IDX, LONGS.double()), lambda t, i, v: t.index_put_((i,), v)),
    "index_put_ accumulate": ((F, IDX, LONGS), lambda t, i, v: t.index_put_((i,), v, accumulate=True)),
    "index_put": ((F, IDX, LONGS), lambda t, i, v: torch.index_put(t, (i,), v)),
    "index_put_ float into long": ((I, IDX, F[:2]), lambda t, i, v: t.index_put_((i,), v)),
    "setitem long tensor into float": ((F, IDX, LONGS), lambda t, i, v: t.__setitem__(i, v)),
    "index_add_ long into float": ((F, IDX, LONGS), lambda t, i, v: t.index_add_(0, i, v)),
    "index_add": ((F, IDX, LONGS), lambda t, i, v: torch.index_add(t, 0, i, v, alpha=2)),
}

#: The same ops where torch's CPU kernels run them: pjrt gives torch's values.
ALLOWED = {
    "lerp float": ((F, F * 2), lambda a, b: torch.lerp(a, b, 0.25)),
    "lerp float, tensor weight": ((F, F * 2, F / 4), lambda a, b, w: torch.lerp(a, b, w)),
    "lerp long, 0-dim float weight": ((I, I * 3, torch.tensor(0.5)), lambda a, b, w: torch.lerp(a, b, w)),
    "lerp_ half": ((F.half(), F.half() * 2), lambda a, b: a.lerp_(b, 0.75)),
    "index_put_ float": ((F, IDX, F[:2] * 10), lambda t, i, v: t.index_put_((i,), v)),
    "index_put_ accumulate float": ((F, IDX, F[:2]), lambda t, i, v: t.index_put_((i,), v, accumulate=True)),
    "setitem python float into long": ((I, IDX), lambda t, i: t.__setitem__(i, 2.5)),
    "index_add_ float": ((F, IDX, F[:2]), lambda t, i, v: t.index_add_(0, i, v, alpha=2)),
    "index_add_ long": ((I, IDX, LONGS), lambda t, i, v: t.index_add_(0, i, v)),
}


def _run(case, device):
    tensors, op = case
    inputs = [t.clone().to(device) for t in tensors]
    return inputs, op(*inputs)


@pytest.mark.parametrize("name", list(REFUSED))
def test_dtypes_torch_refuses_are_refused_with_its_error(engine, name):
    with pytest.raises((RuntimeError, NotImplementedError)) as cpu_error:
        _run(REFUSED[name], "cpu")
    tensors, op = REFUSED[name]
    inputs = [t.clone().to("pjrt") for t in tensors]
    with pytest.raises((RuntimeError, NotImplementedError)) as pjrt_error:
        op(*inputs)
    assert type(pjrt_error.value) is type(cpu_error.value)
    assert str(pjrt_error.value) == str(cpu_error.value)
    for k, (before, after) in enumerate(zip(tensors, inputs)):
        assert_close(f"input {k} after the refused op", after.cpu(), before)


@pytest.mark.parametrize("name", list(ALLOWED))
def test_dtypes_torch_allows_give_torch_values(engine, name):
    cpu_inputs, cpu_result = _run(ALLOWED[name], "cpu")
    pjrt_inputs, pjrt_result = _run(ALLOWED[name], "pjrt")
    for k, (p, c) in enumerate(zip(pjrt_inputs, cpu_inputs)):
        assert p.dtype == c.dtype
        assert_close(f"input {k}", p.cpu(), c)
    if cpu_result is not None:
        assert pjrt_result.dtype == cpu_result.dtype
        assert_close("result", pjrt_result.cpu(), cpu_result)


def test_a_refused_op_leaves_the_trace_going(engine):
    for step in range(2):
        i, f = I.clone().to("pjrt"), F.clone().to("pjrt")
        pending = i * 2
        with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
            i.lerp_(i * 3, 0.5)
        with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes match"):
            f[IDX.to("pjrt")] = LONGS.to("pjrt")
        f.lerp_(f * 2, 0.5)
        xs.sync()
        assert_close(f"step {step}: the pending value", pending.cpu(), I * 2)
        assert_close(f"step {step}: the float tensor", f.cpu(), torch.lerp(F, F * 2, 0.5))
