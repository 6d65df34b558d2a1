"""Gathers and scatters along one dimension on sharded tensors: the values match the CPU, and the partitioner keeps
a sharded batch where it is (no collective moves the indices).

torch.gather, torch.scatter and an embedding's backward lower to a gather or scatter whose other dimensions are
batching dimensions (``operand_batching_dims``), and whose index has no size-1 dimension that would pin it
replicated; as gathers at full coordinates (an iota per dimension beside the index) they all-gathered the indices
and all-reduced the result. A data-parallel training step lost 4 collectives of 6 (its loss and embedding).
A scatter into a batch-sharded KV cache (whose head count does not divide the devices) keeps the batch split
under Shardy, which can pin just the uneven dimensions. Inside a manual-sharding region a scatter is pinned
nowhere (XLA aborted the process on the guard's replicated pin of a manual value).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import execution

from _exec_support import assert_close, engine, partitioner  # noqa: F401

COLLECTIVES = ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter")


def _collectives(hlo: str) -> dict[str, int]:
    """How many instructions of each collective kind an optimized module runs (async pairs counted once)."""
    return {kind: sum(f" {kind}(" in line or f" {kind}-start(" in line for line in hlo.splitlines())
            for kind in COLLECTIVES}


@pytest.mark.parametrize("name", ["shardy", "gspmd"])
def test_cross_entropy_of_a_sharded_batch_moves_no_index_between_devices(engine, partitioner, name):
    partitioner(name)
    torch.manual_seed(0)
    mesh = xs.Mesh(range(8), (8,), ("data",))
    logits, labels = torch.randn(64, 40), torch.randint(0, 40, (64,))
    labels[::7] = -100  # ignored positions, as a causal LM's padding
    ld = xs.mark_sharding(logits.to("pjrt").requires_grad_(), mesh, ("data", None))
    yd = xs.mark_sharding(labels.to("pjrt"), mesh, ("data",))
    loss = F.cross_entropy(ld, yd, reduction="sum")
    (grad,) = torch.autograd.grad(loss, ld)
    xs.sync()
    hlo = execution.last_program().executable.optimized_hlo_text()

    ref = logits.clone().requires_grad_()
    ref_loss = F.cross_entropy(ref, labels, reduction="sum")
    (ref_grad,) = torch.autograd.grad(ref_loss, ref)
    assert_close("loss", loss.cpu(), ref_loss, rtol=1e-5, atol=1e-5)
    assert_close("gradient", grad.cpu(), ref_grad, rtol=1e-5, atol=1e-6)
    counts = _collectives(hlo)
    assert counts["all-gather"] == 0 and counts["collective-permute"] == 0, counts
    assert counts["all-reduce"] <= 1, counts  # the loss's sum over the batch, nothing for the indices


def test_embedding_backward_of_sharded_ids_gathers_no_ids(engine):
    torch.manual_seed(0)
    mesh = xs.Mesh(range(8), (8,), ("data",))
    weight, ids = torch.randn(50, 16), torch.randint(0, 50, (16, 12))
    wd = weight.to("pjrt").requires_grad_()
    idd = xs.mark_sharding(ids.to("pjrt"), mesh, ("data", None))
    (grad,) = torch.autograd.grad(F.embedding(idd, wd).square().sum(), wd)
    xs.sync()
    hlo = execution.last_program().executable.optimized_hlo_text()

    ref = weight.clone().requires_grad_()
    (ref_grad,) = torch.autograd.grad(F.embedding(ids, ref).square().sum(), ref)
    assert_close("gradient", grad.cpu(), ref_grad, rtol=1e-5, atol=1e-5)
    assert _collectives(hlo)["all-gather"] == 0, _collectives(hlo)


@pytest.mark.parametrize("shape, index_shape, dim, partition", [
    ((16, 24), (16, 3), 1, ("data", None)),         # one sharded batch dimension, several indices per row
    ((16, 24), (16, 3), 1, ("data", "model")),      # the gathered dimension sharded too (vocabulary-parallel)
    ((16, 24), (10, 3), 1, ("data", None)),         # an index smaller than x on a batch dimension: x is cut
    ((6, 10, 24), (6, 10, 1), 2, (None, "data", None)),
    ((16, 24), (5, 24), 0, (None, "model")),        # along the unsharded dimension, the other one sharded
    ((13, 24), (13, 1), 1, ("data", None)),         # 13 rows over 2: uneven shards
])
def test_gather_and_scatter_of_sharded_tensors_match_the_cpu(engine, shape, index_shape, dim, partition):
    torch.manual_seed(0)
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    x = torch.randn(shape)
    index = torch.randint(0, shape[dim], index_shape)
    src = torch.randn(index_shape)
    xd = xs.mark_sharding(x.to("pjrt").requires_grad_(), mesh, partition)
    idd, sd = index.to("pjrt"), src.to("pjrt")
    gathered = torch.gather(xd, dim, idd)
    (grad,) = torch.autograd.grad(gathered.square().sum(), xd)  # the backward is a scatter-add of the same index
    scattered = torch.scatter(xd.detach(), dim, idd, sd)
    added = torch.scatter_add(xd.detach(), dim, idd, sd)

    ref = x.clone().requires_grad_()
    ref_gathered = torch.gather(ref, dim, index)
    (ref_grad,) = torch.autograd.grad(ref_gathered.square().sum(), ref)
    assert_close("gather", gathered.cpu(), ref_gathered)
    assert_close("gather's gradient", grad.cpu(), ref_grad, rtol=1e-5, atol=1e-5)
    assert_close("scatter_add", added.cpu(), torch.scatter_add(x, dim, index, src), rtol=1e-5, atol=1e-5)
    if index_shape[dim] == 1:  # torch.scatter with repeated indices along dim keeps an unspecified one of them
        assert_close("scatter", scattered.cpu(), torch.scatter(x, dim, index, src))


def test_scatter_of_one_element_per_row_of_a_vector(engine):
    # rank 1: no batching dimension, the index keeps its one dimension
    x, index, src = torch.randn(9), torch.tensor([4]), torch.tensor([2.5])
    out = torch.scatter(x.to("pjrt"), 0, index.to("pjrt"), src.to("pjrt"))
    assert_close("scatter", out.cpu(), torch.scatter(x, 0, index, src))
    assert_close("gather", torch.gather(x.to("pjrt"), 0, index.to("pjrt")).cpu(), torch.gather(x, 0, index))


@pytest.mark.parametrize("name", ["shardy", "gspmd"])
def test_a_kv_cache_update_of_a_batch_sharded_cache_keeps_the_batch_split(engine, partitioner, name):
    # StaticCache.update: index_copy_ of the new positions along the sequence. Its 2 key/value heads do not divide
    # the 8 devices, so a scatter pins that dimension unsplit; with Shardy's partial constraint the batch stays
    # split, where pinning the whole cache replicated gathered it on every device at every decode step.
    partitioner(name)
    torch.manual_seed(0)
    mesh = xs.Mesh(range(8), (8,), ("data",))
    cache, states, positions = torch.randn(8, 2, 24, 16), torch.randn(8, 2, 3, 16), torch.tensor([5, 0, 23])
    cd = xs.mark_sharding(cache.clone().to("pjrt"), mesh, ("data", None, None, None))
    sd = xs.mark_sharding(states.to("pjrt"), mesh, ("data", None, None, None))
    cd.index_copy_(2, positions.to("pjrt"), sd)
    out = cd.cpu()
    program = execution.last_program()
    assert torch.equal(out, cache.clone().index_copy_(2, positions, states))
    counts = _collectives(program.executable.optimized_hlo_text())
    if program.lowered.partitioner == "shardy":
        assert sum(counts.values()) == 0, counts
    else:  # GSPMD's annotations cannot leave a dimension open: the whole update stays replicated
        assert counts["all-gather"] >= 1, counts


MANUAL_CHILD = textwrap.dedent('''
    import torch, pjrt_plugins.spmd as xs
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    mesh = xs.Mesh(range(8), (8,), ("x",))
    torch.manual_seed(0)
    x, src, idx = torch.randn(16, 3), torch.randn(16, 3), torch.randint(0, 3, (16, 3))
    rows = torch.tensor([2, 0, 1])

    def local(t):
        return xs.enable_manual_sharding(xs.mark_sharding(t.to("pjrt"), mesh, ("x", None)), ("x", None), mesh=mesh)

    cases = {
        "scatter_add": (lambda xl, il, sl: xl.scatter_add(1, il, sl), x.scatter_add(1, idx, src)),
        "index_add": (lambda xl, il, sl: xl.index_add(1, rows.to("pjrt"), sl), x.index_add(1, rows, src)),
    }
    for name, (fn, ref) in cases.items():
        out = xs.disable_manual_sharding(fn(local(x), local(idx), local(src)), ("x", None), (16, 3), mesh=mesh)
        print(name, torch.allclose(out.cpu(), ref, atol=1e-6))
''')


def test_scatters_inside_a_manual_sharding_region_run_in_a_surviving_process():
    # Each device's [2, 3] shard has dimensions the 8 devices do not divide: the uneven-scatter guard pinned them
    # replicated, and XLA aborted the process on a replicated pin of a manual value (Check failed: !IsManual()).
    proc = subprocess.run([sys.executable, "-c", MANUAL_CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"the process died ({proc.returncode}): {proc.stderr[-1500:]}"
    assert proc.stdout.split() == ["scatter_add", "True", "index_add", "True"], proc.stdout
