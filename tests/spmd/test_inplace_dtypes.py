"""Ops that write into existing pjrt tensors follow torch's dtype rule: a result is written only into a tensor
whose dtype its type can be cast to (``torch.can_cast``), else torch's RuntimeError, and no tensor changes.

Each case runs on the CPU first: torch's verdict there is what the pjrt device must give.
"""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs

from _exec_support import assert_close, engine  # noqa: F401

I = torch.arange(4)
F = torch.tensor([0.5, 1.5, 2.5, 3.5])
B = torch.tensor([True, False, True, False])

#: name -> (the tensors, the op on them). The op writes into the first tensor (or the out= tensor it makes).
CASES = {
    "int /= 2": ((I,), lambda i: i.__itruediv__(2)),
    "bool += 1": ((B,), lambda b: b.__iadd__(1)),
    "long *= float tensor": ((I, F), lambda i, f: i.__imul__(f)),
    "long.add_(1.5)": ((I,), lambda i: i.add_(1.5)),
    "long.clamp_(min=0.5)": ((I,), lambda i: i.clamp_(min=0.5)),
    "long.sigmoid_()": ((I,), lambda i: i.sigmoid_()),
    "long.pow_(0.5)": ((I,), lambda i: i.pow_(0.5)),
    "long.div_(2.0, floor)": ((I,), lambda i: i.div_(2.0, rounding_mode="floor")),
    "float.add_(complex)": ((F,), lambda f: f.add_(1j)),
    "foreach long add_ 1.5": ((I, I), lambda a, b: torch._foreach_add_([a, b], 1.5)),
    "foreach long mul_ float": ((I, F), lambda i, f: torch._foreach_mul_([i, i * 2], [f, f])),
    "add out=long": ((F, I), lambda f, i: torch.add(f, f, out=i)),
    "sqrt out=long": ((I,), lambda i: torch.sqrt(i, out=i)),
}

#: What torch allows though the dtypes differ: the result is cast into the target.
ALLOWED = {
    "long.div_(2, floor)": ((I,), lambda i: i.div_(2, rounding_mode="floor")),
    "long.lt_(float)": ((I, F), lambda i, f: i.lt_(f)),
    "float.lt_(2)": ((F,), lambda f: f.lt_(2)),
    "long.masked_fill_(1.5)": ((I, B), lambda i, b: i.masked_fill_(b, 1.5)),
    "long.fill_(1.5)": ((I,), lambda i: i.fill_(1.5)),
    "long.copy_(float)": ((I, F), lambda i, f: i.copy_(f)),
    "half += float": ((F, F), lambda h, f: h.half().__iadd__(f)),
    "int32 += int64": ((I,), lambda i: i.int().__iadd__(i)),
    "long &= bool": ((I, B), lambda i, b: i.bitwise_and_(b)),
    "foreach float add_ long": ((F, I), lambda f, i: torch._foreach_add_([f, f * 2], [i, i])),
    "add out=int32 from long": ((I,), lambda i: torch.add(i, i, out=i.int())),
    "sum out=long": ((F, I), lambda f, i: torch.sum(f, 0, out=i[0])),
}


def _run(case, device):
    tensors, op = case
    inputs = [t.clone().to(device) for t in tensors]
    return inputs, op(*inputs)


@pytest.mark.parametrize("name", list(CASES))
def test_a_write_torch_refuses_is_refused_and_changes_nothing(engine, name):
    with pytest.raises(RuntimeError, match="can't be cast") as cpu_error:
        _run(CASES[name], "cpu")
    xs.set_cpu_fallback(True)  # the default: complex numbers compute on the CPU
    tensors, op = CASES[name]
    inputs = [t.clone().to("pjrt") for t in tensors]
    with pytest.raises(RuntimeError, match="can't be cast|expected out|Expected out"):
        op(*inputs)
    assert cpu_error.value is not None
    for k, (before, after) in enumerate(zip(tensors, inputs)):
        assert_close(f"input {k} after the refused op", after.cpu(), before)


@pytest.mark.parametrize("name", list(ALLOWED))
def test_a_write_torch_allows_gives_torch_values(engine, name):
    cpu_inputs, cpu_result = _run(ALLOWED[name], "cpu")
    pjrt_inputs, pjrt_result = _run(ALLOWED[name], "pjrt")
    for k, (p, c) in enumerate(zip(pjrt_inputs, cpu_inputs)):
        assert_close(f"input {k}", p.cpu(), c)
    results = pjrt_result if isinstance(pjrt_result, list) else [pjrt_result]
    wanted = cpu_result if isinstance(cpu_result, list) else [cpu_result]
    for k, (p, c) in enumerate(zip(results, wanted)):
        assert_close(f"result {k}", p.cpu(), c)


def test_the_trace_goes_on_after_a_refused_write(engine):
    # A refused in-place op in the middle of a trace: the values pending before it, and the writes after it,
    # are torch's; the integer tensor stays an integer tensor, in this step and the next ones.
    for step in range(3):
        i, f = I.clone().to("pjrt"), F.clone().to("pjrt")
        doubled = i * 2
        with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
            i /= 2
        with pytest.raises(RuntimeError, match="can't be cast"):
            torch._foreach_add_([f, i], 0.5)
        i += 1
        f.add_(i)
        xs.sync()
        assert i.dtype == torch.int64
        assert_close(f"step {step}: the int tensor", i.cpu(), I + 1)
        assert_close(f"step {step}: the pending value", doubled.cpu(), I * 2)
        assert_close(f"step {step}: the float tensor", f.cpu(), F + I + 1)


def test_a_refused_foreach_write_changes_none_of_its_tensors(engine):
    floats, ints = F.clone().to("pjrt"), I.clone().to("pjrt")
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch._foreach_mul_([floats, ints], [F, F])  # the float target first: it is refused too
    assert_close("the float tensor", floats.cpu(), F)
    assert_close("the int tensor", ints.cpu(), I)
