"""Mixture-of-experts layers with bounded shapes: a capacity-factor experts function for transformers models.

transformers' ``eager`` experts path routes tokens with ``nonzero`` in a Python loop, so its shapes follow the
data and every step on the pjrt device makes new programs. Here each expert gets a buffer of ``capacity`` token
slots (GShard, Switch Transformer, MaxText's ``capacity_factor``): the tokens' choices are written into their
expert's buffer in token order, choices past the capacity are dropped (they add nothing; the residual connection
carries the token on), the experts run as one batched product and the results are gathered back. Every shape
depends only on the number of tokens, so a training loop compiles its programs once. Plain torch: the same
function runs on the CPU, with the same drops.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["ExpertsForward", "capacity_experts", "dispatch_slots", "expert_capacity"]

#: transformers' experts interface: ``fn(experts_module, hidden_states [T, H], top_k_index [T, k],
#: top_k_weights [T, k]) -> [T, H]``.
ExpertsForward = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def expert_capacity(num_tokens: int, top_k: int, num_experts: int, capacity_factor: float | None = None) -> int:
    """Token slots per expert: ``ceil(capacity_factor * num_tokens * top_k / num_experts)``, at most ``num_tokens``
    (a token picks an expert once, so that many never drops one); ``None`` gives ``num_tokens``.

    Example::

        expert_capacity(64, 2, 4, 1.25)   # 40 slots per expert; 64 with capacity_factor=None
    """
    for name, value in (("num_tokens", num_tokens), ("top_k", top_k), ("num_experts", num_experts)):
        if not isinstance(value, int) or value < (0 if name == "num_tokens" else 1):
            raise ValueError(f"{name} must be a {'non-negative' if name == 'num_tokens' else 'positive'} int, "
                             f"got {value!r}")
    if capacity_factor is None:
        return num_tokens
    if not isinstance(capacity_factor, (int, float)) or not capacity_factor > 0 or math.isinf(capacity_factor):
        raise ValueError(f"capacity_factor must be a positive number (1.0: an even share of the tokens' choices per "
                         f"expert) or None (no token dropped), got {capacity_factor!r}")
    return min(num_tokens, math.ceil(capacity_factor * num_tokens * top_k / num_experts))


def dispatch_slots(top_k_index: torch.Tensor, num_experts: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each choice goes: ``(slot, kept)``, both ``[T * k]`` in row-major order of ``top_k_index [T, k]``.

    ``slot`` indexes a flattened ``[num_experts * capacity + 1]`` buffer: expert ``e``'s ``p``-th choice (in token
    order) is slot ``e * capacity + p``; a choice past the capacity is not ``kept`` and goes to the last slot,
    which nothing reads. Static shapes throughout: a choice's place in its expert's queue is its rank in a stable
    sort by expert less the choices of the experts before (two sorts of ``T * k`` ids, where MaxText's masks
    take a cumulative sum over a ``[T * k, num_experts]`` one-hot).
    """
    if top_k_index.dim() != 2 or top_k_index.dtype.is_floating_point or top_k_index.dtype.is_complex:
        raise ValueError(f"top_k_index must be an integer [tokens, top_k] tensor, got {top_k_index.dtype}"
                         f"{list(top_k_index.shape)}")
    expert = top_k_index.reshape(-1).long()
    counts = (expert.unsqueeze(1) == torch.arange(num_experts, device=expert.device)).sum(0)  # choices per expert
    before = counts.cumsum(0) - counts  # choices of the experts before each
    rank = torch.argsort(torch.sort(expert, stable=True).indices, stable=True)  # place in the sorted order
    position = rank - before.index_select(0, expert)  # this choice's place in its expert's queue
    kept = position < capacity
    slot = torch.where(kept, expert * capacity + position, torch.full_like(expert, num_experts * capacity))
    return slot, kept


def _expert_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, transposed: bool) -> torch.Tensor:
    """``[E, C, in]`` through each expert's ``weight`` (``[E, out, in]``, or ``[E, in, out]`` when transposed)."""
    y = torch.bmm(x, weight if transposed else weight.transpose(1, 2))
    return y if bias is None else y + bias.unsqueeze(1)


def _projections(experts: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """(up weight, its bias, down weight, its bias) of a transformers experts module."""
    has_gate, has_bias = getattr(experts, "has_gate", True), getattr(experts, "has_bias", False)
    up = experts.gate_up_proj if has_gate else experts.up_proj
    up_bias = (experts.gate_up_proj_bias if has_gate else experts.up_proj_bias) if has_bias else None
    return up, up_bias, experts.down_proj, experts.down_proj_bias if has_bias else None


def capacity_experts(capacity_factor: float | None = None) -> ExpertsForward:
    """An experts function for transformers' ``ExpertsInterface`` that gives each expert ``expert_capacity(tokens,
    top_k, experts, capacity_factor)`` token slots: static shapes, one program per token count.

    ``capacity_factor=None`` (the default) gives every expert room for all tokens, so none is dropped and the
    results equal the ``eager`` path's (at ``num_experts / top_k`` times the expert FLOPs of a perfect split); a
    factor such as 1.25 keeps about that share and drops the choices that do not fit, in token order.

    Example::

        from transformers.integrations.moe import ExpertsInterface
        ExpertsInterface.register("capacity", moe.capacity_experts(1.25))
        model = AutoModelForCausalLM.from_config(config, experts_implementation="capacity")
    """
    expert_capacity(1, 1, 1, capacity_factor)  # a bad factor fails here, not at the first forward

    def capacity_experts_forward(experts: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                                 top_k_weights: torch.Tensor) -> torch.Tensor:
        if getattr(experts, "_is_expert_parallel", False):
            raise NotImplementedError("capacity_experts does not take transformers' expert-parallel sentinels; shard "
                                      "the experts' weights with mark_sharding instead")
        tokens, hidden = hidden_states.shape
        num_experts, top_k = experts.num_experts, top_k_index.shape[-1]
        capacity = expert_capacity(tokens, top_k, num_experts, capacity_factor)
        slot, kept = dispatch_slots(top_k_index, num_experts, capacity)
        up, up_bias, down, down_bias = _projections(experts)
        transposed = getattr(experts, "is_transposed", False)

        # Dispatch: each kept choice's token into its slot (unique slots: the sum is a copy).
        buffer = hidden_states.new_zeros(num_experts * capacity + 1, hidden)
        buffer = buffer.index_add(0, slot, hidden_states.repeat_interleave(top_k, dim=0))
        x = buffer[:-1].view(num_experts, capacity, hidden).to(up.dtype)
        h = _expert_linear(x, up, up_bias, transposed)
        flat = h.reshape(num_experts * capacity, h.shape[-1])
        h = (experts._apply_gate(flat) if getattr(experts, "has_gate", True) else experts.act_fn(flat))
        y = _expert_linear(h.view(num_experts, capacity, -1), down, down_bias, transposed)
        y = y.reshape(num_experts * capacity, hidden)
        if getattr(experts, "has_post_expert_norm", False):
            y = experts.post_expert_norm(y)

        # Combine: each choice reads its slot back (a dropped one reads the zero row), weighted, summed per token.
        y = torch.cat([y, y.new_zeros(1, hidden)])
        weights = top_k_weights.reshape(-1) * kept
        out = (y.index_select(0, slot) * weights.unsqueeze(1).to(y.dtype)).view(tokens, top_k, hidden).sum(1)
        return out.to(hidden_states.dtype)

    return capacity_experts_forward
