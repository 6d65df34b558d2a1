"""Models on sharded tensors against plain torch: a single-head attention block and embedding lookups.

Embeddings run under both gather modes of the ``dense_gather_factor`` hook (dense one-hot form and sparse gather), switched
with a site override of the CPU plugin's ``pjrt_dense_gather_factor`` hook.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import execution

from _exec_support import GatherFactor, assert_close, engine, overriding  # noqa: F401


class AttentionBlock(nn.Module):
    """Single-head self-attention with a residual connection and layer norm."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k.transpose(-2, -1) / (x.shape[-1] ** 0.5)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        return self.norm(x + self.out(attn @ v))


def test_attention_block_forward_and_backward_match_torch(engine):
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    torch.manual_seed(3)
    ref = AttentionBlock(16)
    block = copy.deepcopy(ref).to("pjrt")
    for name in ("q", "k", "v"):
        xs.mark_sharding(getattr(block, name).weight, mesh, ("model", None))
    xs.mark_sharding(block.out.weight, mesh, (None, "model"))
    x = torch.randn(4, 8, 16)
    xd = xs.mark_sharding(x.to("pjrt"), mesh, ("data", None, None))

    out_ref = ref(x)
    out = block(xd)
    (out_ref * torch.arange(16.0)).sum().backward()
    (out * torch.arange(16.0).to("pjrt")).sum().backward()
    assert_close("attention output", out.cpu(), out_ref)
    for (name, p), (_, r) in zip(block.named_parameters(), ref.named_parameters()):
        assert_close(f"{name}.grad", p.grad.cpu(), r.grad, rtol=1e-5, atol=1e-5)
    # The batch sharding propagates to the output.
    assert out.sharding_spec.startswith("{devices=[2,")


def test_classifier_with_cross_entropy_matches_torch(engine):
    """Ops that reach the device through torch's decompositions (cross_entropy, layer_norm, gelu)."""
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    torch.manual_seed(5)
    ref = nn.Sequential(nn.Linear(12, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 10))
    model = copy.deepcopy(ref).to("pjrt")
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    x, target = torch.randn(16, 12), torch.randint(0, 10, (16,))
    loss_ref = nn.functional.cross_entropy(ref(x), target, label_smoothing=0.1)
    loss_ref.backward()
    xd = xs.mark_sharding(x.to("pjrt"), mesh, ("data", None))
    loss = nn.functional.cross_entropy(model(xd), target.to("pjrt"), label_smoothing=0.1)
    loss.backward()
    assert_close("loss", loss.cpu(), loss_ref)
    for (name, p), (_, r) in zip(model.named_parameters(), ref.named_parameters()):
        assert_close(f"{name}.grad", p.grad.cpu(), r.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("factor,dense", [(0, False), (8192, True)])
def test_embedding_lookup_and_gradient_under_both_gather_modes(engine, factor, dense):
    with overriding(engine.plugin, GatherFactor(factor)):
        mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
        torch.manual_seed(4)
        ref = nn.Embedding(50, 12)
        emb = copy.deepcopy(ref).to("pjrt")
        xs.mark_sharding(emb.weight, mesh, (None, "model"))
        idx = torch.randint(0, 50, (8, 6))
        idx_d = xs.mark_sharding(idx.to("pjrt"), mesh, ("data", None))
        xs.clear_compile_cache()
        out = emb(idx_d)
        weights = torch.linspace(-1, 1, 12)
        (out * weights.to("pjrt")).sum().backward()
        out_ref = ref(idx)
        (out_ref * weights).sum().backward()
        assert_close("embedding", out.cpu(), out_ref)
        assert_close("embedding grad", emb.weight.grad.cpu(), ref.weight.grad)
        program = execution.last_program()
        text = program.lowered.text
        if dense:
            assert "stablehlo.gather" not in text and "stablehlo.scatter" not in text
        else:
            assert "stablehlo.gather" in text and "stablehlo.scatter" in text
