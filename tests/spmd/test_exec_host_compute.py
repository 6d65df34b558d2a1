"""A small integer or boolean value read on the host (``bool(flag)``, ``.item()``, ``.cpu()``) is computed on the
CPU from the device values it reads, with no program: integer and boolean arithmetic is exact, so the values are
the program's bit for bit. ``generate`` makes five such checks on its prompt and special tokens before it starts;
each was a program of its own. Floating-point work, large values and random ops still run as a program."""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd.transport import TensorState

from _exec_support import engine  # noqa: F401

MESH = xs.Mesh(range(8), (8,), ("data",))


def _rows(t: torch.Tensor) -> torch.Tensor:
    return xs.mark_sharding(t.to("pjrt"), MESH, ("data",) + (None,) * (t.dim() - 1))


def _checks(ids: torch.Tensor, pad: torch.Tensor, eos: torch.Tensor) -> list:
    """generate's checks on its prompt and special tokens (transformers 5.24, ``generate`` and its helpers)."""
    default = torch.ones(ids.shape, dtype=torch.long, device=ids.device)
    pad_in_ids = torch.isin(ids, pad).any()
    pad_is_not_eos = ~torch.isin(eos, pad).any()
    can_infer = pad_in_ids * pad_is_not_eos
    mask = ids.ne(pad).long() * can_infer + default * ~can_infer
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    return [
        bool(torch.isin(eos.unsqueeze(0), pad).any()),
        bool((eos < 0).any()),
        bool(torch.sum(ids[:, -1] == pad) > 0),
        bool((mask == 1).all()),
        bool((ids < 0).any()),
        positions.tolist(),
        int(torch.where(ids > 30, ids, -ids).sum(dtype=torch.int32)),
        (ids.to(torch.int32) * 123456789 * 987654).tolist(),  # wraps around on overflow, as on the CPU
    ]


@pytest.mark.parametrize("pad_id", [0, 7], ids=["no-padding", "padded"])
def test_generates_checks_are_computed_on_the_host_with_the_cpus_values(engine, pad_id):
    ids = torch.randint(1, 50, (8, 6), generator=torch.Generator().manual_seed(0))
    ids[:3, :2] = 7
    pad, eos = torch.tensor([pad_id]), torch.tensor([2])
    want = _checks(ids, pad, eos)
    ids_p, pad_p, eos_p = _rows(ids), pad.to("pjrt"), eos.to("pjrt")
    xs.sync()  # the prompt's upload is not what the test counts
    before = xs.metrics()
    got = _checks(ids_p, pad_p, eos_p)
    after = xs.metrics()
    assert got == want
    assert (after.compiles - before.compiles, after.executions - before.executions) == (0, 0)


def test_a_value_computed_on_the_host_feeds_later_device_ops(engine):
    ids = torch.randint(0, 50, (8, 4), generator=torch.Generator().manual_seed(1))
    ids_p = _rows(ids)
    flags_p = ids_p > 25
    assert flags_p.tolist() == (ids > 25).tolist()
    assert flags_p._pjrt_data.state is TensorState.HOST
    table = torch.randn(50, 3)
    got = (table.to("pjrt")[ids_p] * flags_p[..., None]).cpu()
    assert torch.equal(got, table[ids] * (ids > 25)[..., None])


@pytest.mark.parametrize("read", [
    lambda x, i: bool((x > 0.5).any()),  # a comparison of floats: the CPU plugin flushes subnormals
    lambda x, i: (x * 3).sum().item(),  # float arithmetic may round otherwise in a program
    lambda x, i: bool((i.float() * 0.5 > 3).all()),
    lambda x, i: int((i < torch.randint(0, 50, (8, 4), device="pjrt")).sum()),  # random numbers
    lambda x, i: int(i.sum(dtype=torch.float32) > 0),
    lambda x, i: bool((torch.arange(300_000, device="pjrt") == i[0, 0]).any()),  # too big to compute on the host
    lambda x, i: int((i // 3).sum()),  # integer division: not replayed
], ids=["float-compare", "float-sum", "to-float", "random", "float-sum-dtype", "large", "floordiv"])
def test_floats_random_numbers_and_large_values_still_run_a_program(engine, read, request):
    x, i = torch.rand(8, 4), torch.randint(0, 50, (8, 4))
    x_p, i_p = _rows(x), _rows(i)
    xs.sync()
    before = xs.metrics().executions
    got = read(x_p, i_p)
    assert xs.metrics().executions > before
    if request.node.callspec.id != "random":
        assert got == pytest.approx(read(x, i), rel=1e-6)
