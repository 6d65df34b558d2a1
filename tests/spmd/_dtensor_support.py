"""Shared parts of the DTensor tests: a real one-process gloo group, pjrt DeviceMeshes, a torchtitan-style Llama
with torchtitan's tensor-parallel plan, and a train-and-compare loop against CPU eager.

Import fixtures from here into a test module (``from _dtensor_support import gloo  # noqa: F401``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from _exec_support import ensure_cpu8
from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import dtensor  # loads the bridge, which routes torch's DTensor functions for pjrt meshes


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dist.ProcessGroup]:
    """A real default process group: gloo, world size 1, rendezvous through a FileStore (no port)."""
    assert not dist.is_initialized(), "a process group is left over from another test"
    store = dist.FileStore(str(tmp_path_factory.mktemp("gloo") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture
def mesh8() -> Any:
    """A 1-D pjrt DeviceMesh ("tp") over the 8-device CPU plugin."""
    ensure_cpu8()
    return dtensor.init_device_mesh("pjrt", (8,), mesh_dim_names=("tp",))


@pytest.fixture
def mesh2x4() -> Any:
    """A 2-D pjrt DeviceMesh ("dp", "tp") over the 8-device CPU plugin."""
    ensure_cpu8()
    return dtensor.init_device_mesh("pjrt", (2, 4), mesh_dim_names=("dp", "tp"))


# -- a torchtitan-style Llama ---------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class Attention(nn.Module):
    """Heads from ``view(..., -1, head_dim)``, as torchtitan writes it: the code is the same whole or sharded."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        bs, seq, _ = x.shape
        q, k, v = (w(x).view(bs, seq, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotary(q, *rope), rotary(k, *rope)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim: int, n_heads: int, hidden: int) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, n_heads: int = 8, hidden: int = 64, n_layers: int = 2,
                 max_seq: int = 16) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, n_heads, hidden) for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)
        head_dim = dim // n_heads
        angles = torch.outer(torch.arange(max_seq).float(),
                             1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim)))
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        rope = (self.cos[: tokens.shape[1]], self.sin[: tokens.shape[1]])
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, rope)
        return self.output(self.norm(h))


def block_plan() -> dict[str, Any]:
    """torchtitan's tensor-parallel plan of one transformer block (sequence-parallel norms)."""
    return {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
        "feed_forward.w3": ColwiseParallel(),
    }


def parallelize_llama(model: Llama, mesh: Any) -> Llama:
    """torchtitan's ``apply_tp`` for Llama: the embedding row-wise into sequence shards, the head column-wise."""
    parallelize_module(model, mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for block in model.layers:
        parallelize_module(block, mesh, block_plan())
    return model


# -- training against CPU eager -------------------------------------------------------------------------------


def train_both(reference: nn.Module, sharded: Callable[[nn.Module], nn.Module], batches: list[tuple[torch.Tensor, ...]],
               loss_fn: Callable[..., torch.Tensor], lr: float = 0.05) -> tuple[list[float], list[float], nn.Module]:
    """SGD steps on a CPU copy of ``reference`` and on ``sharded(pjrt copy)``; returns both loss lists and the
    sharded model (``xs.sync()`` once per step, as a training loop should)."""
    cpu = copy.deepcopy(reference)
    model = sharded(copy.deepcopy(reference).to("pjrt"))
    losses: tuple[list[float], list[float]] = ([], [])
    for net, out in ((cpu, losses[0]), (model, losses[1])):
        opt = torch.optim.SGD(net.parameters(), lr=lr)
        on_pjrt = net is model
        for batch in batches:
            args = [b.to("pjrt") for b in batch] if on_pjrt else list(batch)
            loss = loss_fn(net, *args)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if on_pjrt:
                xs.sync()
            out.append(loss.item())
    for (name, p), q in zip(model.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-4, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    return losses[0], losses[1], model
