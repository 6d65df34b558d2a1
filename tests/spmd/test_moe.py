"""``pjrt_plugins.spmd.moe``: the capacity of each expert and where each token's choice goes, on the CPU and on the
pjrt device; and the warning that sends a ``nonzero`` user to the bounded paths. (Whole transformers models with
these experts train in ``tests/models/test_moe_paths.py``.)"""

from __future__ import annotations

import warnings

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import CpuFallbackWarning
from pjrt_plugins.spmd import moe
from pjrt_plugins.spmd.frontend import _fallback

from _exec_support import engine  # noqa: F401


def slots_by_loop(top_k_index: torch.Tensor, num_experts: int, capacity: int) -> tuple[list[int], list[bool]]:
    """The definition: walk the choices in token order, each expert filling its slots until full."""
    filled = [0] * num_experts
    slots, kept = [], []
    for e in top_k_index.reshape(-1).tolist():
        fits = filled[e] < capacity
        slots.append(e * capacity + filled[e] if fits else num_experts * capacity)
        kept.append(fits)
        filled[e] += 1
    return slots, kept


@pytest.mark.parametrize("capacity_factor, expected", [(None, 64), (1.0, 32), (1.25, 40), (0.1, 4), (10.0, 64)])
def test_capacity_is_the_factor_times_an_even_share_and_at_most_every_token(capacity_factor, expected):
    assert moe.expert_capacity(64, 2, 4, capacity_factor) == expected


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "1"])
def test_a_bad_capacity_factor_is_refused_when_the_function_is_made(bad):
    with pytest.raises(ValueError, match="capacity_factor must be a positive number"):
        moe.capacity_experts(bad)


def test_bad_counts_and_routing_are_refused():
    with pytest.raises(ValueError, match="num_experts must be a positive int"):
        moe.expert_capacity(8, 2, 0)
    with pytest.raises(ValueError, match=r"integer \[tokens, top_k\] tensor, got torch.float32\[8\]"):
        moe.dispatch_slots(torch.zeros(8), 4, 2)


@pytest.mark.parametrize("capacity", [1, 3, 5, 16])
def test_slots_follow_token_order_and_drop_what_does_not_fit(capacity):
    g = torch.Generator().manual_seed(capacity)
    top_k_index = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(16)])
    slot, kept = moe.dispatch_slots(top_k_index, 4, capacity)
    want_slots, want_kept = slots_by_loop(top_k_index, 4, capacity)
    assert slot.tolist() == want_slots and kept.tolist() == want_kept
    if capacity < 8:  # 32 choices over 4 experts cannot all fit in fewer than 8 slots each
        assert not kept.all()


def test_on_the_device_the_slots_are_the_cpus(engine):
    g = torch.Generator().manual_seed(0)
    top_k_index = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(64)])
    mesh = xs.Mesh(range(8), (8,), ("data",))
    on_device = xs.mark_sharding(top_k_index.to("pjrt"), mesh, ("data", None))
    for capacity in (4, 16):
        slot, kept = moe.dispatch_slots(on_device, 8, capacity)
        want = moe.dispatch_slots(top_k_index, 8, capacity)
        assert torch.equal(slot.cpu(), want[0]) and torch.equal(kept.cpu(), want[1])


def test_nonzero_on_the_device_warns_once_naming_the_bounded_paths(engine):
    xs.set_cpu_fallback(True)
    _fallback._warned.clear()
    x = torch.tensor([[0.0, 1.0], [2.0, 0.0]]).to("pjrt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            x.nonzero()
    mine = [str(w.message) for w in caught if issubclass(w.category, CpuFallbackWarning)]
    assert len(mine) == 1, mine
    for words in ("compiled anew for each new count", "torch.nonzero_static", '"grouped_mm"', '"batched_mm"',
                  "pjrt_plugins.spmd.moe.capacity_experts"):
        assert words in mine[0], (words, mine[0])
