"""A value read on the host runs what it needs; cheap rearranging (``cat``, slices) that nothing read needs stays
pending, so a tensor that grows every step (``generate``'s ``input_ids``) does not make every step's program new.
Reads through a pending ``cat`` (``x[:, -1:]``) read the operand they fall in, with the values and view semantics
of reading the ``cat``."""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import trace
from pjrt_plugins.spmd.transport import TensorState

from _exec_support import assert_close, engine  # noqa: F401

MESH = xs.Mesh(range(8), (8,), ("data",))


def _rows(t: torch.Tensor) -> torch.Tensor:
    return xs.mark_sharding(t.to("pjrt"), MESH, ("data",) + (None,) * (t.dim() - 1))


def test_a_growing_tensor_and_a_flag_read_every_step_compile_a_bounded_number_of_programs(engine):
    # generate's loop: the next token from the last one, appended with cat, and a stop flag read on the host.
    g = torch.Generator().manual_seed(0)
    table = torch.randn(16, 16, generator=g)
    ids = torch.randint(0, 16, (8, 3), generator=g)
    table_p, ids_p = table.to("pjrt"), _rows(ids)
    compiles = []
    for _ in range(8):
        before = xs.metrics().compiles
        nxt_p = table_p[ids_p[:, -1]].argmax(-1)
        ids_p = torch.cat([ids_p, nxt_p[:, None]], dim=1)
        stop_p = bool((nxt_p == 99).all())
        compiles.append(xs.metrics().compiles - before)
        nxt = table[ids[:, -1]].argmax(-1)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        assert stop_p == bool((nxt == 99).all())
        assert ids_p._pjrt_data.state is TensorState.LAZY  # the cat waits
    assert compiles[3:] == [0] * 5, f"programs compiled per step: {compiles}"
    assert torch.equal(ids_p.cpu(), ids)


@pytest.mark.parametrize("read", [
    lambda t: t[:, -1:], lambda t: t[:, -1], lambda t: t[:, 3:5], lambda t: t[:, 2:4], lambda t: t[:, 1:],
    lambda t: t[:, ::2], lambda t: t[:, 5:5], lambda t: t[:, -2:-1], lambda t: t[1:, 4], lambda t: t[:, 0],
], ids=["last", "select-last", "inside", "across", "tail", "strided", "empty", "second-last", "rows", "first"])
def test_reads_through_a_pending_cat_give_the_cats_values(engine, read):
    g = torch.Generator().manual_seed(1)
    a, b, c = torch.randn(8, 3, generator=g), torch.randn(8, 2, generator=g), torch.randn(8, 1, generator=g)
    nested = torch.cat([torch.cat([a, b], dim=1), c * 2], dim=-1)
    nested_p = torch.cat([torch.cat([_rows(a), _rows(b)], dim=1), _rows(c) * 2], dim=-1)
    assert_close("read", read(nested_p).cpu(), read(nested))


def test_a_write_into_a_read_through_a_pending_cat_reaches_the_cat(engine):
    a, b = torch.randn(4, 3), torch.randn(4, 2)
    joined = torch.cat([a, b], dim=1)
    joined_p = torch.cat([_rows(a) + 0, _rows(b) + 0], dim=1)
    joined[:, -1:].mul_(10)
    joined_p[:, -1:].mul_(10)
    assert_close("the cat after the write", joined_p.cpu(), joined)


def test_work_that_is_not_cheap_runs_with_the_value_read(engine):
    x = torch.randn(8, 8)
    x_p = _rows(x)
    product = x_p @ x_p.T  # not needed by the value read, and not cheap: runs in the same program
    grown = torch.cat([x_p, x_p], dim=0)  # cheap, but the product makes the whole trace run
    before = xs.metrics().executions
    assert_close("sum", torch.tensor(x_p.sum().item()), x.sum())
    assert xs.metrics().executions == before + 1
    assert product._pjrt_data.state is TensorState.DEVICE and grown._pjrt_data.state is TensorState.DEVICE
    assert trace.pending_ops() == 0
    assert_close("product", product.cpu(), x @ x.T)


def test_cheap_work_left_pending_runs_at_the_next_sync(engine):
    x = torch.randn(8, 4)
    x_p = _rows(x)
    grown = torch.cat([x_p * 2, x_p], dim=1)
    assert (x_p * 2).sum().item() == pytest.approx(float((x * 2).sum()), rel=1e-5)
    assert grown._pjrt_data.state is TensorState.LAZY and trace.pending_ops() > 0
    xs.sync()
    assert grown._pjrt_data.state is TensorState.DEVICE and trace.pending_ops() == 0
    assert_close("grown", grown.cpu(), torch.cat([x * 2, x], dim=1))


def test_the_final_cat_of_any_length_is_read_without_a_program(engine):
    # generate returns input_ids, the prompt with one cat per token: read on the host, no length compiles.
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 50, (8, 4), generator=g)
    for length in (3, 5, 9):
        tokens = [torch.randint(0, 50, (8,), generator=g) for _ in range(length)]
        ids_p, ids = _rows(prompt), prompt
        for t in tokens:
            ids_p = torch.cat([ids_p, _rows(t)[:, None]], dim=1)
            ids = torch.cat([ids, t[:, None]], dim=1)
        before = xs.metrics()
        got = ids_p.cpu()
        after = xs.metrics()
        assert (after.compiles - before.compiles, after.executions - before.executions) == (0, 0), length
        assert torch.equal(got, ids) and torch.equal(ids_p.cpu(), ids)
        assert ids_p._pjrt_data.state is TensorState.HOST
        assert torch.equal((ids_p + 1).cpu(), ids + 1)  # host data feeds device ops as any host data


@pytest.mark.parametrize("make", [
    lambda a, b: torch.cat([a, b.t()], dim=0).transpose(0, 1)[1:],
    lambda a, b: torch.cat([a[:, :1].expand(8, 3), b.reshape(8, 8)[:, 2:5]], dim=1).clone(),
    lambda a, b: torch.stack([a, a], dim=0)[0].squeeze(),
], ids=["transpose", "expand", "stack"])
def test_data_moves_read_on_the_host_give_the_devices_values(engine, make):
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)
    assert_close("moves", make(_rows(a), _rows(b)).cpu(), make(a, b))


def test_values_that_compute_or_have_live_views_still_run_as_a_program(engine):
    x = torch.randn(8, 4)
    summed = torch.cat([_rows(x), _rows(x) * 2], dim=1)  # the product computes
    joined = torch.cat([_rows(x), _rows(x)], dim=1)
    view = joined[:, :2]  # a live view of the value read keeps it on the devices
    before = xs.metrics().executions
    assert_close("computed", summed.cpu(), torch.cat([x, x * 2], dim=1))
    assert_close("with a view", joined.cpu(), torch.cat([x, x], dim=1))
    assert xs.metrics().executions > before
    assert joined._pjrt_data.state is TensorState.DEVICE
    assert_close("the view", view.cpu(), x[:, :2])


@pytest.mark.parametrize("read_result", [True, False], ids=["read", "dropped"])
def test_the_leftover_cat_of_an_earlier_loop_does_not_make_the_next_loop_compile(engine, read_result):
    # Two generate calls in a row: the first call's cat chain, still pending when its tensors die, is dropped
    # when the next call first reads a value, instead of running (a program per earlier length).
    prompt = torch.randint(0, 50, (8, 4), generator=torch.Generator().manual_seed(4))

    def loop(steps: int) -> torch.Tensor:
        ids_p = _rows(prompt)
        assert not bool((ids_p < 0).any())  # a check before the loop (generate's on its special tokens)
        for _ in range(steps):
            nxt_p = ids_p[:, -1] + 1
            ids_p = torch.cat([ids_p, nxt_p[:, None]], dim=1)
            assert not bool((nxt_p > 1000).all())
        return ids_p

    compiles = []
    for steps in (3, 4, 6, 5, 9):
        before = xs.metrics().compiles
        ids_p = loop(steps)
        if read_result:
            want = torch.cat([prompt] + [prompt[:, -1:] + k for k in range(1, steps + 1)], dim=1)
            assert torch.equal(ids_p.cpu(), want)
        del ids_p
        compiles.append(xs.metrics().compiles - before)
    assert compiles[2:] == [0, 0, 0], f"programs compiled per loop: {compiles}"
    xs.sync()  # nothing live is left of the last loop's cats: nothing to run
    assert trace.pending_ops() == 0


def test_a_host_read_gathers_pieces_of_any_layout_and_dtype(engine):
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(4, 16, generator=g) > 0, torch.randn(4, 8, generator=g) > 0
    a_p = xs.mark_sharding(a.to("pjrt"), MESH, (None, "data"))  # split along the cat's dimension
    b_p = b.to("pjrt")  # replicated
    joined_p = torch.cat([a_p, b_p, a_p[:, :3]], dim=1)
    before = xs.metrics().compiles
    assert torch.equal(joined_p.cpu(), torch.cat([a, b, a[:, :3]], dim=1))
    assert xs.metrics().compiles == before
