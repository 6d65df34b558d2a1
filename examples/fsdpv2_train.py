"""Train a small GPT with FSDPv2 and sharded input loading, written as a PyTorch/XLA SPMD script would be.

    python examples/fsdpv2_train.py                    # the CPU plugin's 8 devices, 20 steps
    python examples/fsdpv2_train.py --steps 3 --check  # also train on plain CPU torch and compare
    PJRT_DEVICE=cuda python examples/fsdpv2_train.py --plugin default

Every parameter is split over the mesh's "fsdp" axis (FSDPv2: SpmdFullyShardedDataParallel with a
transformer auto-wrap policy), and the DataLoader's batches reach the devices through MpDeviceLoader,
split along the batch over the same axis, each device receiving only its rows. The task is
synthetic (continue counting sequences), so the loss falls within a few steps.
The PyTorch/XLA name each line stands for is in its comment.
"""

from __future__ import annotations

import argparse
import copy
import functools
import math
import sys
from collections.abc import Iterable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

import pjrt_plugins.spmd as xs  # torch_xla.distributed.spmd
import pjrt_plugins.spmd.runtime as xr  # torch_xla.runtime
import pjrt_plugins.spmd.xla_model as xm  # torch_xla.core.xla_model
from pjrt_plugins.spmd.fsdp_wrap import transformer_auto_wrap_policy  # torch_xla.distributed.fsdp.wrap
from pjrt_plugins.spmd.parallel_loader import MpDeviceLoader  # torch_xla.distributed.parallel_loader
from pjrt_plugins.spmd.spmd_fully_sharded_data_parallel import (  # torch_xla.experimental.spmd_fully_...
    SpmdFullyShardedDataParallel as FSDPv2,
)

#: Largest relative difference from plain CPU torch accepted by --check (float32 sums run in another order).
TOLERANCE = 1e-4


class CountingDataset(Dataset):
    """Sequences ``start, start + stride, ...`` (mod vocab); the label of each token is the next one."""

    def __init__(self, size: int, seq_len: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab, (size, 1), generator=g)
        strides = torch.randint(1, 4, (size, 1), generator=g)
        self.tokens = (starts + strides * torch.arange(seq_len + 1)) % vocab

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i, :-1], "labels": self.tokens[i, 1:]}


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        attention = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq_len: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq_len, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(input_ids) + self.pos(torch.arange(input_ids.shape[1], device=input_ids.device))
        return self.head(self.ln(self.blocks(x)))


def loss_of(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten())


def train(model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], lr: float, log: bool) -> list[torch.Tensor]:
    """One pass of AdamW steps over ``batches``; returns each step's loss (still on the model's device)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step, batch in enumerate(batches):
        loss = loss_of(model, batch)
        loss.backward()
        opt.step()  # xm.optimizer_step(opt) works too
        opt.zero_grad()
        losses.append(loss.detach())
        if log and step % 5 == 0:  # no xm.mark_step(): taking the next batch from the loader runs this step
            print(f"step {step:3d}  loss {loss.item():.4f}")
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--plugin", default="cpu", help="plugin name, or 'default' for PJRT_DEVICE / the best one")
    parser.add_argument("--cpu-devices", type=int, default=8, help="devices of the CPU plugin (default 8)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16, help="global batch; a multiple of the device count")
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--check", action="store_true", help="train plain CPU torch too and compare the losses")
    args = parser.parse_args(argv)

    if args.plugin != "default":
        xs.set_plugin(args.plugin, options={"cpu_device_count": args.cpu_devices} if args.plugin == "cpu" else None)
    xr.use_spmd()
    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(range(n), (n, 1), ("fsdp", "tensor"))
    xs.set_global_mesh(mesh)
    print(f"{xr.device_type()}: {n} devices, mesh {dict(mesh.shape())}")

    torch.manual_seed(0)
    reference = GPT(args.vocab, args.dim, args.heads, args.layers, args.seq_len)
    model = FSDPv2(copy.deepcopy(reference), auto_wrap_policy=functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls={Block}))  # the mesh: xs.get_global_mesh()
    print(f"each block wrapped: {all(isinstance(b, FSDPv2) for b in model.blocks)}; "
          f"blocks.0.fc1.weight {model.blocks[0].fc1.weight.sharding_spec}")

    dataset = CountingDataset(args.steps * args.batch_size, args.seq_len, args.vocab)
    loader = DataLoader(dataset, batch_size=args.batch_size, drop_last=True)
    input_sharding = {  # the batch dimension over "fsdp", as the model's outputs
        "input_ids": xs.ShardingSpec(mesh, ("fsdp", None)),
        "labels": xs.ShardingSpec(mesh, ("fsdp", None)),
    }
    xs.reset_transfer_counters()
    xm.send_cpu_data_to_device(next(iter(loader)), xm.xla_device(), input_sharding)  # what the loader does
    batch_bytes = 2 * args.batch_size * args.seq_len * 8  # input_ids and labels, int64
    print(f"a batch of {batch_bytes:,} bytes: device 0 receives {xs.transfer_counters().uploaded[0]:,} (its rows)")

    device_loader = MpDeviceLoader(loader, xm.xla_device(), input_sharding=input_sharding)
    losses = [float(loss) for loss in train(model, device_loader, args.lr, log=True)]
    print(f"losses: first {losses[0]:.4f}, last {losses[-1]:.4f}")
    if not args.check:
        return 0
    expected = [float(loss) for loss in train(reference, loader, args.lr, log=False)]
    worst = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(losses, expected))
    verdict = "OK" if worst <= TOLERANCE else "FAILED"
    print(f"{verdict}: largest relative difference from plain CPU torch over {len(losses)} steps {worst:.2e} "
          f"(within {TOLERANCE})")
    return 0 if verdict == "OK" else 1


if __name__ == "__main__":
    sys.exit(main())
