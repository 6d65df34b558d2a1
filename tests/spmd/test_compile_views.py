"""``torch.compile(..., backend="pjrt")`` returns views of its inputs with torch's values.

AOTAutograd does not return an output that is a view of an input (or of another output) as the compiled
function computed it: it makes it again from that tensor with ``as_strided`` and the layout the compiled
function reported. Each case compares the compiled function on pjrt with the same code on the CPU: the
outputs, and the inputs after it (views share their values with the input, as on the CPU).
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import pjrt_plugins.spmd as xs

from _exec_support import assert_close, engine  # noqa: F401


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # conftest.py


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _compare(fn, *inputs: torch.Tensor, dynamic: bool | None = None) -> None:
    """``fn`` compiled on pjrt copies of ``inputs`` against ``fn`` on CPU copies: outputs and inputs after."""
    cpu = [x.clone() for x in inputs]
    pjrt = [x.to("pjrt") for x in inputs]
    got = _as_tuple(torch.compile(fn, backend="pjrt", dynamic=dynamic)(*pjrt))
    want = _as_tuple(fn(*cpu))
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.device.type == "pjrt", f"output {i} is on {g.device}"
        assert_close(f"output {i}", g.cpu(), w)
    for i, (p, c) in enumerate(zip(pjrt, cpu)):
        assert_close(f"input {i} after the call", p.cpu(), c)


X = torch.arange(12.0).reshape(3, 4)

VIEWS = {
    "select": lambda a: a[1],
    "slice": lambda a: a[1:2],
    "narrow": lambda a: a.narrow(0, 1, 1),
    "columns": lambda a: a[:, 1:3],
    "column": lambda a: a[:, 2],
    "transpose of a slice": lambda a: a[1:].t(),
    "view of a view of a view": lambda a: a[1:][:, 1:][0],
    "reshaped row": lambda a: a.view(2, 6)[1],
    "expanded row": lambda a: a[2].unsqueeze(0).expand(2, 4),
    "diagonal": lambda a: a.diagonal(offset=1),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_a_view_of_an_input_has_the_viewed_values(engine, name):
    _compare(VIEWS[name], X)


def test_views_of_an_input_with_computed_outputs_keep_their_places(engine):
    _compare(lambda a: (a[1], a * 2), X)
    _compare(lambda a: (a + 1, a[:, 2], a[2], (a * a).sum()), X)
    _compare(lambda a, b: (b[1:], a @ b, a[0, 1:]), X, torch.arange(20.0).reshape(4, 5))


def test_views_of_a_computed_output_have_its_values(engine):
    def f(a):
        b = a * 3 + 1
        return b, b[1], b[:, 2:]

    _compare(f, X)
    _compare(lambda a: (a - 1)[2], X)


def test_inputs_changed_in_place_and_their_views(engine):
    def add_then_view(a):
        a.add_(1)
        return a[1]

    def change_a_view(a):
        v = a[1]
        v.mul_(2)
        return v

    def zero_rows(a):
        a[1:2].zero_()
        return a[:, 2:], a.sum()

    for fn in (add_then_view, change_a_view, zero_rows):
        _compare(fn, X)


def test_a_returned_view_shares_the_input_values_as_on_the_cpu(engine):
    x, xp = X.clone(), X.to("pjrt")
    row = torch.compile(lambda a: a[1], backend="pjrt")(xp)
    row.fill_(-1)
    x[1].fill_(-1)
    assert_close("input after writing into the returned view", xp.cpu(), x)


def test_a_graph_that_runs_op_by_op_returns_views_too(engine, caplog):
    # A dtype view has no lowering: with the CPU fallback on (the default), the graph runs op by op.
    xs.set_cpu_fallback(True)
    caplog.set_level("INFO", logger="pjrt_plugins.spmd.frontend._dynamo_backend")
    _compare(lambda a: (a[1].view(torch.int32), a * 2, a[:, 3]), X)
    assert "runs op by op" in caplog.text
    _compare(lambda a: (F.dropout(a, 0.0, training=True), a[1]), X)


def test_views_with_dynamic_shapes_follow_each_call_size(engine):
    xs.set_cpu_fallback(True)  # the dtype view runs on the CPU, so that the graph runs op by op

    def region(a):  # a region per size
        return a[a.shape[0] // 2:], a[:, 1] * 2

    def op_by_op(a):  # one graph run op by op for every size: the offsets follow the sizes
        return a.view(torch.int32)[a.shape[0] // 2:], a[a.shape[0] - 1]

    for fn in (region, op_by_op):
        compiled = torch.compile(fn, backend="pjrt", dynamic=True)
        for rows in (4, 6, 9):
            x = torch.arange(rows * 3.0).reshape(rows, 3)
            for i, (g, w) in enumerate(zip(compiled(x.to("pjrt")), fn(x))):
                assert_close(f"{fn.__name__}, {rows} rows, output {i}", g.cpu(), w)


def test_gradients_flow_through_a_returned_view(engine):
    w = torch.arange(12.0).reshape(3, 4).requires_grad_()
    wp = w.detach().to("pjrt").requires_grad_()

    def f(a):
        return a[1:], (a * a).sum()

    view, total = torch.compile(f, backend="pjrt")(wp)
    cview, ctotal = f(w)
    assert_close("view", view.detach().cpu(), cview)
    (view.sum() * 3 + total).backward()
    (cview.sum() * 3 + ctotal).backward()
    assert_close("gradient", wp.grad.cpu(), w.grad)
