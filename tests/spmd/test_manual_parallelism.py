"""Tensor parallelism written by hand with the collectives of a manual-sharding region (an all-gather matmul,
a ring matmul over collective_permute, a Megatron MLP) against the SPMD partitioner's result and CPU torch,
forward and backward; and the gradient of each differentiable collective against the math, on CPU torch."""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs
import pjrt_plugins.spmd.xla_model as xm

from _exec_support import engine  # noqa: F401

N = 8
HALVES = [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.fixture
def mesh(engine):  # noqa: F811
    return xs.Mesh(range(N), (N,), ("x",))


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _on_pjrt(t: torch.Tensor, grad: bool = False) -> torch.Tensor:
    return t.detach().to("pjrt").requires_grad_(grad)


def _partitioned(fn, tensors, specs, mesh):
    """``fn`` on pjrt copies of ``tensors`` marked with ``specs``: the partitioner's result."""
    placed = [xs.mark_sharding(_on_pjrt(t), mesh, s) for t, s in zip(tensors, specs)]
    return fn(*placed).cpu()


# -- hand-written matmuls against the partitioner ----------------------------------------------------


def test_all_gather_matmul_matches_the_partitioner(mesh):
    x, w = _rand(16, 32, seed=0), _rand(32, 64, seed=1)
    xl = xs.enable_manual_sharding(_on_pjrt(x), ("x", None), mesh=mesh)  # (2, 32): a block of rows each
    wl = xs.enable_manual_sharding(_on_pjrt(w), (None, "x"), mesh=mesh)  # (32, 8): a block of columns each
    yl = xm.all_gather(xl, dim=0) @ wl  # every row of x against this device's columns
    y = xs.disable_manual_sharding(yl, (None, "x"), (16, 64), mesh=mesh)
    auto = _partitioned(torch.matmul, (x, w), [("x", None), (None, "x")], mesh)
    torch.testing.assert_close(y.cpu(), auto, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(auto, x @ w, rtol=1e-5, atol=1e-5)


def test_ring_matmul_over_collective_permute_matches_the_partitioner(mesh):
    """Rows of x and of w split over 8 devices; w's blocks travel a ring, each device multiplying the block it
    holds with the matching columns of its rows of x (found from its own index, itself a region value)."""
    x, w = _rand(16, 32, seed=2), _rand(32, 24, seed=3)
    xl = xs.enable_manual_sharding(_on_pjrt(x), ("x", None), mesh=mesh)  # (2, 32)
    wl = xs.enable_manual_sharding(_on_pjrt(w), ("x", None), mesh=mesh)  # (4, 24): block d of w's rows
    index = xs.enable_manual_sharding(torch.arange(N).to("pjrt"), ("x",), mesh=mesh)  # (1,): this device's id
    blocks = xl.reshape(2, N, 4)  # x's columns in the blocks that meet w's row blocks
    ring = [[d, (d + 1) % N] for d in range(N)]
    acc = torch.zeros(2, 24).to("pjrt")
    held = wl
    for step in range(N):
        k = (index - step) % N  # the block of w this device holds at this step
        acc = acc + torch.index_select(blocks, 1, k).reshape(2, 4) @ held
        held = xm.collective_permute(held, ring)
    y = xs.disable_manual_sharding(acc, ("x", None), (16, 24), mesh=mesh)
    auto = _partitioned(torch.matmul, (x, w), [("x", None), ("x", None)], mesh)
    torch.testing.assert_close(y.cpu(), auto, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(auto, x @ w, rtol=1e-4, atol=1e-5)


def test_megatron_mlp_forward_and_backward_match_the_partitioner_and_cpu(mesh):
    """Column-parallel then row-parallel linear: one all-reduce forward; the gradients of the sharded weights
    and of the replicated input are the global ones (the input's copies add up on the way back)."""
    x, w1, w2 = _rand(4, 16, seed=4), _rand(16, 32, seed=5) / 4, _rand(32, 16, seed=6) / 4
    target = _rand(4, 16, seed=7)

    def loss_of(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return ((y - t) ** 2).mean()

    # By hand, in a region.
    px, pw1, pw2 = _on_pjrt(x, True), _on_pjrt(w1, True), _on_pjrt(w2, True)
    xl = xs.enable_manual_sharding(px, (None, None), mesh=mesh)  # every device: all of x
    w1l = xs.enable_manual_sharding(pw1, (None, "x"), mesh=mesh)  # (16, 4)
    w2l = xs.enable_manual_sharding(pw2, ("x", None), mesh=mesh)  # (4, 16)
    partial = torch.relu(xl @ w1l) @ w2l
    yl = xm.all_reduce(xm.REDUCE_SUM, partial)
    y = xs.disable_manual_sharding(yl, (None, None), (4, 16), mesh=mesh)
    manual_loss = loss_of(y, target.to("pjrt"))
    manual_loss.backward()

    # The partitioner's.
    ax = _on_pjrt(x, True)
    aw1 = xs.mark_sharding(_on_pjrt(w1, True), mesh, (None, "x"))
    aw2 = xs.mark_sharding(_on_pjrt(w2, True), mesh, ("x", None))
    auto_loss = loss_of(torch.relu(ax @ aw1) @ aw2, target.to("pjrt"))
    auto_loss.backward()

    # CPU torch.
    cx, cw1, cw2 = x.clone().requires_grad_(), w1.clone().requires_grad_(), w2.clone().requires_grad_()
    cpu_loss = loss_of(torch.relu(cx @ cw1) @ cw2, target)
    cpu_loss.backward()

    torch.testing.assert_close(manual_loss.cpu(), auto_loss.cpu(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(manual_loss.cpu(), cpu_loss.detach(), rtol=1e-5, atol=1e-6)
    for manual, auto, cpu in ((px, ax, cx), (pw1, aw1, cw1), (pw2, aw2, cw2)):
        torch.testing.assert_close(manual.grad.cpu(), auto.grad.cpu(), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(manual.grad.cpu(), cpu.grad, rtol=1e-4, atol=1e-6)


# -- the gradient of each collective ----------------------------------------------------------------
# Each case is a global function of x (16 or 64 rows split over the 8 devices) through one collective, and
# the same function written with CPU torch ops on the whole tensor; the gradients of a weighted sum must agree.


def _rows(t: torch.Tensor) -> list[torch.Tensor]:
    return list(t.chunk(N))


def _all_reduce_case(xl, mesh):
    return xs.disable_manual_sharding(xm.all_reduce(xm.REDUCE_SUM, xl, scale=0.5, groups=HALVES), ("x", None),
                                      (16, 4), mesh=mesh)


def _all_reduce_math(x):
    rows = _rows(x)
    return torch.cat([0.5 * sum(rows[k] for k in HALVES[d // 4]) for d in range(N)])


def _all_gather_case(xl, mesh):
    return xs.disable_manual_sharding(xm.all_gather(xl, dim=1, groups=HALVES), ("x", None), (16, 16), mesh=mesh)


def _all_gather_math(x):
    rows = _rows(x)
    return torch.cat([torch.cat([rows[k] for k in HALVES[d // 4]], dim=1) for d in range(N)])


def _reduce_scatter_case(xl, mesh):
    out = xm.reduce_scatter(xm.REDUCE_SUM, xl, 2.0, 1, 4, groups=HALVES)  # (2, 1) from (2, 4)
    return xs.disable_manual_sharding(out, ("x", None), (16, 1), mesh=mesh)


def _reduce_scatter_math(x):
    rows = _rows(x)
    return torch.cat([2.0 * sum(rows[k] for k in HALVES[d // 4])[:, d % 4:d % 4 + 1] for d in range(N)])


def _all_to_all_case(xl, mesh):
    return xs.disable_manual_sharding(xm.all_to_all(xl, 1, 0, 4, groups=HALVES), ("x", None), (64, 1), mesh=mesh)


def _all_to_all_math(x):
    rows = _rows(x)
    return torch.cat([torch.cat([rows[k][:, d % 4:d % 4 + 1] for k in HALVES[d // 4]]) for d in range(N)])


def _permute_case(xl, mesh):
    pairs = [[d, (d + 3) % N] for d in range(N) if d != 2]  # device 5 receives nothing
    return xs.disable_manual_sharding(xm.collective_permute(xl, pairs), ("x", None), (16, 4), mesh=mesh)


def _permute_math(x):
    rows = _rows(x)
    return torch.cat([rows[(d - 3) % N] if d != 5 else torch.zeros_like(rows[0]) for d in range(N)])


@pytest.mark.parametrize("case, math", [(_all_reduce_case, _all_reduce_math), (_all_gather_case, _all_gather_math),
                                        (_reduce_scatter_case, _reduce_scatter_math),
                                        (_all_to_all_case, _all_to_all_math), (_permute_case, _permute_math)],
                         ids=["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute"])
def test_collective_gradients_match_the_math(mesh, case, math):
    x = _rand(16, 4, seed=8)
    px = _on_pjrt(x, True)
    out = case(xs.enable_manual_sharding(px, ("x", None), mesh=mesh), mesh)
    cx = x.clone().requires_grad_()
    expected = math(cx)
    weights = _rand(*expected.shape, seed=9)
    (out * weights.to("pjrt")).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(out.cpu(), expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(px.grad.cpu(), cx.grad, rtol=1e-5, atol=1e-6)


def test_gradient_of_a_replicated_output_is_shared_among_its_copies(engine):  # noqa: F811
    """A 2x4 mesh, x split over "data" and copied over "model": the copies of the output are one value, so the
    gradient reaching x is the global one, not four times it."""
    mesh = xs.Mesh(range(N), (2, 4), ("data", "model"))
    x = _rand(8, 4, seed=10)
    px = _on_pjrt(x, True)
    local = xs.enable_manual_sharding(px, ("data", None), mesh=mesh)  # (4, 4), 4 copies of each half
    out = xs.disable_manual_sharding(torch.sin(local) * 3, ("data", None), (8, 4), mesh=mesh)
    out.sum().backward()
    torch.testing.assert_close(px.grad.cpu(), 3 * torch.cos(x), rtol=1e-5, atol=1e-6)


def test_a_reduction_other_than_sum_has_no_gradient(mesh):
    px = _on_pjrt(_rand(16, 4, seed=11), True)
    local = xs.enable_manual_sharding(px, ("x", None), mesh=mesh)
    out = xs.disable_manual_sharding(xm.all_reduce(xm.REDUCE_MAX, local), (None, None), (2, 4), mesh=mesh)
    with pytest.raises(RuntimeError, match="reduce_type 'max' is not differentiable"):
        out.sum().backward()
    torch.testing.assert_close(out.cpu(), px.detach().cpu().reshape(N, 2, 4).amax(0))  # the forward still runs
