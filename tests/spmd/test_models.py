"""Real models trained on the pjrt device, compared with CPU eager torch step by step.

A GPT with tied embeddings (batch sharded on ``data``, Megatron-sharded MLP, AdamW); a CNN with
convolutions, batch norm and pooling (SGD); TransformerEncoderLayer in eval mode; activation
checkpointing; bf16 autocast. Each starts from the same weights as its CPU twin and must follow it.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import pjrt_plugins.spmd as xs

from _exec_support import Block, assert_close, engine  # noqa: F401

STEPS = 3


class GPT(nn.Module):
    def __init__(self, vocab: int = 64, d: int = 32, heads: int = 4, layers: int = 2, ctx: int = 8,
                 checkpointed: bool = False) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return self.head(self.ln(x))


def _megatron(model: GPT, mesh: xs.Mesh) -> None:
    for block in model.blocks:
        xs.mark_sharding(block.fc1.weight, mesh, ("model", None))
        xs.mark_sharding(block.fc1.bias, mesh, ("model",))
        xs.mark_sharding(block.fc2.weight, mesh, (None, "model"))


def _train_gpt(engine_checkpointed: bool) -> None:
    torch.manual_seed(0)
    ref = GPT(checkpointed=engine_checkpointed)
    model = copy.deepcopy(ref).to("pjrt")
    assert model.head.weight is model.tok.weight
    assert len(list(model.parameters())) == len(list(ref.parameters()))
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    _megatron(model, mesh)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(STEPS):
        idx, target = torch.randint(0, 64, (4, 8)), torch.randint(0, 64, (4, 8))
        loss_ref = F.cross_entropy(ref(idx).flatten(0, 1), target.flatten())
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        idx_d = xs.mark_sharding(idx.to("pjrt"), mesh, ("data", None))
        loss = F.cross_entropy(model(idx_d).flatten(0, 1), target.to("pjrt").flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        xs.sync()
        assert_close(f"loss at step {step}", loss.cpu(), loss_ref.detach(), rtol=1e-4, atol=1e-5)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        assert_close(f"{name} after {STEPS} steps", p.cpu(), r.detach(), rtol=1e-4, atol=1e-5)
    assert model.head.weight is model.tok.weight


def test_gpt_with_tied_embeddings_sharded_batch_and_megatron_mlp_trains_like_cpu(engine):
    _train_gpt(engine_checkpointed=False)
    assert xs.metrics().fallbacks == 0


def test_activation_checkpointing_trains_like_cpu(engine):
    _train_gpt(engine_checkpointed=True)


def test_cnn_with_batch_norm_and_pooling_trains_with_sgd_like_cpu(engine):
    torch.manual_seed(1)
    ref = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, stride=1, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 10),
    )
    model = copy.deepcopy(ref).to("pjrt")
    mesh = xs.Mesh(range(8), (8,), ("data",))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(STEPS):
        x, y = torch.randn(8, 3, 12, 12), torch.randint(0, 10, (8,))
        loss_ref = F.cross_entropy(ref(x), y)
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        loss = F.cross_entropy(model(xs.mark_sharding(x.to("pjrt"), mesh, ("data", None, None, None))), y.to("pjrt"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        xs.sync()
        assert_close(f"loss at step {step}", loss.cpu(), loss_ref.detach(), rtol=1e-4, atol=1e-5)
    for (name, p), r in zip(model.state_dict().items(), ref.state_dict().values()):
        assert_close(f"{name} after {STEPS} steps", p.cpu(), r, rtol=1e-4, atol=1e-4)
    assert xs.metrics().fallbacks == 0


def test_transformer_encoder_layer_in_eval_mode_matches_cpu(engine):
    torch.manual_seed(2)
    ref = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True).eval()
    model = copy.deepcopy(ref).to("pjrt")
    x = torch.randn(4, 6, 32)
    mask = torch.zeros(4, 6, dtype=torch.bool)
    mask[:, -2:] = True  # padding
    with torch.no_grad():
        out_ref = ref(x, src_key_padding_mask=mask)
        out = model(x.to("pjrt"), src_key_padding_mask=mask.to("pjrt"))
        plain_ref, plain = ref(x), model(x.to("pjrt"))
    keep = ~mask
    assert_close("encoder output (padded)", out.cpu()[keep], out_ref[keep], rtol=1e-4, atol=1e-5)
    assert_close("encoder output", plain.cpu(), plain_ref, rtol=1e-4, atol=1e-5)


def test_bf16_autocast_training_follows_cpu_autocast(engine):
    torch.manual_seed(3)
    ref = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4))
    model = copy.deepcopy(ref).to("pjrt")
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_ref = F.mse_loss(ref(x).float(), y)
        loss_ref.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        with torch.autocast("pjrt", dtype=torch.bfloat16):
            out = model(x.to("pjrt"))
            assert out.dtype == torch.bfloat16
            loss = F.mse_loss(out.float(), y.to("pjrt"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        xs.sync()
        # bfloat16 keeps 8 bits of mantissa: agree to about 1%.
        assert_close(f"loss at step {step}", loss.cpu(), loss_ref.detach(), rtol=3e-2, atol=3e-2)
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        assert p.dtype == torch.float32
        assert_close(f"{name} after {STEPS} steps", p.cpu(), r.detach(), rtol=5e-2, atol=2e-2)


def test_checkpointed_dropout_recomputes_the_same_mask(engine):
    """torch.utils.checkpoint restores the RNG state before recomputing: the dropout mask must be the forward's."""
    torch.manual_seed(4)
    lin = nn.Linear(16, 16).to("pjrt")
    x = torch.randn(8, 16).to("pjrt").requires_grad_()

    def block(t: torch.Tensor) -> torch.Tensor:
        return F.dropout(lin(t), p=0.5, training=True)

    torch.manual_seed(5)
    out = checkpoint(block, x, use_reentrant=False)
    (out * out).sum().backward()  # the gradient needs the mask; recomputed in the backward
    grad = x.grad.cpu()
    kept = out.cpu() != 0
    x.grad = None
    torch.manual_seed(5)
    plain = block(x)
    (plain * plain).sum().backward()
    assert torch.equal(plain.cpu() != 0, kept), "the same seed must give the same forward mask"
    assert_close("gradient through a recomputed dropout", grad, x.grad.cpu(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reentrant", [False, True])
def test_dropout_under_checkpoint_gets_cpu_eagers_gradients_for_the_forwards_mask(engine, reentrant):
    """The recomputation draws the forward's dropout mask (same device RNG state, same keys), so every gradient
    is CPU eager's for that mask: an element dropped in the forward has no gradient, a kept one the whole one."""
    p = 0.5
    torch.manual_seed(6)
    ref1, ref2 = nn.Linear(16, 32), nn.Linear(32, 4)
    lin1, lin2 = copy.deepcopy(ref1).to("pjrt"), copy.deepcopy(ref2).to("pjrt")
    x_cpu = torch.randn(8, 16)
    x = x_cpu.to("pjrt").requires_grad_()
    masks = []

    def block(t: torch.Tensor) -> torch.Tensor:
        h = F.dropout(lin1(t), p=p, training=True)
        masks.append(h.detach() != 0)
        return F.gelu(h)

    with torch.utils.checkpoint.set_checkpoint_early_stop(False):
        out = lin2(checkpoint(block, x, use_reentrant=reentrant))
        (out * out).sum().backward()
    assert len(masks) == 2, "the block runs in the forward and again in the backward"
    forward_mask, recomputed_mask = (m.cpu() for m in masks)
    assert torch.equal(forward_mask, recomputed_mask), "the recomputation drew another dropout mask"
    assert 0 < forward_mask.sum() < forward_mask.numel()

    x_ref = x_cpu.clone().requires_grad_()
    out_ref = ref2(F.gelu(ref1(x_ref) * forward_mask / (1 - p)))
    (out_ref * out_ref).sum().backward()
    assert_close("output", out.detach().cpu(), out_ref.detach(), rtol=1e-5, atol=1e-5)
    assert_close("input gradient", x.grad.cpu(), x_ref.grad, rtol=1e-4, atol=1e-5)
    for name, got, want in [("lin1.weight", lin1.weight, ref1.weight), ("lin1.bias", lin1.bias, ref1.bias),
                            ("lin2.weight", lin2.weight, ref2.weight)]:
        assert_close(f"{name} gradient", got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-5)

