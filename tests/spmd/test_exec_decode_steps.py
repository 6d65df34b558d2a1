"""A decode loop as ``generate`` runs it: a prefill over the prompt, then one step per token, each reading its stop
flag on the host. The small values a step leaves for the next (the next position, a cache length updated in place)
run with the step's program instead of waiting in the next step's trace, so the first decode step after the
prefill runs the same program as every later one: one prefill and one decode program in all, whatever the length.
Only what grows every step (the ``cat`` of positions and tokens, and what reads it) stays pending. A padded
prompt's attention mask grows by a column of ones every step and is padded to the cache's length: that padded
mask is computed on the host and read by the step as an input of one shape, so it adds no program either."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import trace

from _exec_support import engine  # noqa: F401

MESH = xs.Mesh(range(8), (8,), ("data",))
PROMPT = 5
CACHE = 16


def _rows(t: torch.Tensor) -> torch.Tensor:
    return xs.mark_sharding(t.to("pjrt"), MESH, ("data",) + (None,) * (t.dim() - 1))


def _generate(ids: torch.Tensor, table: torch.Tensor, new_tokens: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Greedy decoding in the shape of transformers' loop, on whichever device the tensors are."""
    length = torch.zeros((), dtype=torch.long, device=ids.device)  # StaticCache's cumulative_length
    positions = torch.arange(ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1) + 0
    step_ids, step_positions = ids, positions
    weights = torch.linspace(0.5, 2.0, CACHE, device=ids.device)
    for _ in range(new_tokens):
        length.add_(step_ids.shape[1])
        scores = (table[step_ids] * (step_positions[..., None] + 1)).sum(1) + length
        if mask is not None:  # transformers pads the mask to the cache's length, reads it on the host and uses it
            padded = F.pad(mask.bool(), (0, CACHE - mask.shape[1]))
            if not bool(padded.sum() == padded.numel()):
                scores = scores + torch.where(padded, weights, 0.0).sum(-1, keepdim=True)
        token = scores.argmax(-1)
        ids = torch.cat([ids, token[:, None]], dim=-1)
        next_position = torch.arange(1, device=ids.device).view(1, -1) + positions[..., -1:] + 1
        positions = torch.cat([positions, next_position], dim=-1)
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
        if bool((token == 99).all()):  # the stop flag, read on the host every step
            break
        step_ids, step_positions = ids[:, -1:].clone(), positions[..., -1:].clone()
    return ids


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
def test_the_first_decode_step_runs_the_later_steps_program(engine, padded):
    g = torch.Generator().manual_seed(0)
    table = torch.randn(32, 16, generator=g)
    prompt = torch.randint(0, 32, (8, PROMPT), generator=g)
    mask = None
    if padded:
        mask = torch.ones_like(prompt)
        mask[:4, :2] = 0
    table_p = table.to("pjrt")
    # The same prompt tensors in every call: an operand of the last call's pending cats, they must not move the
    # next call's inputs.
    prompt_p, mask_p = _rows(prompt), None if mask is None else _rows(mask)
    compiles = {}
    for new_tokens in (4, 6, 9, 3):
        want = _generate(prompt, table, new_tokens, mask)
        before = xs.metrics()
        got = _generate(prompt_p, table_p, new_tokens, mask_p)
        assert torch.equal(got.cpu(), want), new_tokens
        after = xs.metrics()
        compiles[new_tokens] = after.compiles - before.compiles
        assert after.executions - before.executions == new_tokens  # the prefill and a decode step per token
    assert compiles == {4: 2, 6: 0, 9: 0, 3: 0}, f"programs compiled per call: {compiles}"
    xs.sync()
    assert trace.pending_ops() == 0
