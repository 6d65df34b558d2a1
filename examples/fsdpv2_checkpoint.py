"""Train with FSDPv2 and sharded input loading, checkpoint asynchronously, and resume where a stopped run left off.

    python examples/fsdpv2_checkpoint.py --steps 20          # trains, saving every 5 steps
    python examples/fsdpv2_checkpoint.py --steps 40          # resumes from step 20, trains to 40
    PJRT_DEVICE=cuda python examples/fsdpv2_checkpoint.py --plugin default

SpmdFullyShardedDataParallel (FSDPv2) splits every parameter over the mesh's "fsdp" axis, and an
MpDeviceLoader uploads each batch on a background thread, each device receiving its rows only. A
CheckpointManager saves every --save-every steps on a background thread while training goes on,
keeps the last --keep checkpoints, and a new run restores the latest one: model, optimizer, the
step, and the CPU and device RNG states (the model has dropout), so the resumed run computes what
an uninterrupted run would have. Kill it at any point (Ctrl-C, SIGKILL): a checkpoint that was
being written is ignored, the previous one is used. The PyTorch/XLA name of each API is in its comment.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

import pjrt_plugins.spmd as xs  # torch_xla.distributed.spmd
from pjrt_plugins.spmd.distributed_checkpoint import (  # torch_xla.experimental.distributed_checkpoint
    CheckpointManager,
    prime_optimizer,
)
from pjrt_plugins.spmd.parallel_loader import MpDeviceLoader  # torch_xla.distributed.parallel_loader
from pjrt_plugins.spmd.spmd_fully_sharded_data_parallel import (  # torch_xla.experimental.spmd_fully_...
    SpmdFullyShardedDataParallel as FSDPv2,
)

FEATURES, HIDDEN, CLASSES = 32, 200, 10  # 200 and 10 rows do not split evenly over 8 devices: fine


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, HIDDEN)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(F.gelu(self.fc1(x))))


def batch(step: int, size: int) -> dict[str, torch.Tensor]:
    """A synthetic batch: the class is which of the first CLASSES features is largest. Step ``step`` always
    gets the same batch, whatever happened before (so a resumed run sees the data it would have)."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(size, FEATURES, generator=g)
    return {"x": x, "y": x[:, :CLASSES].argmax(dim=1)}


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="train until this step (default 20)")
    parser.add_argument("--ckpt-dir", default="fsdpv2_checkpoints", help="where the checkpoints go")
    parser.add_argument("--save-every", type=int, default=5, help="save every N steps (default 5)")
    parser.add_argument("--keep", type=int, default=2, help="keep the last N checkpoints (default 2)")
    parser.add_argument("--batch", type=int, default=64, help="batch size (a multiple of the device count)")
    parser.add_argument("--plugin", default="cpu", help="'cpu' (8 devices) or 'default' (PJRT_DEVICE's plugin)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.plugin == "cpu":
        xs.set_plugin("cpu", options={"cpu_device_count": 8})
    devices = xs.virtual_device().num_devices
    mesh = xs.Mesh(range(devices), (devices,), ("fsdp",))  # xs.get_1d_mesh("fsdp")

    torch.manual_seed(0)
    model = FSDPv2(Classifier(), mesh=mesh)  # on pjrt, each parameter split over "fsdp"; outputs by batch
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3, fused=True)

    manager = CheckpointManager(args.ckpt_dir, save_interval=args.save_every, max_to_keep=args.keep)
    start = 0
    if manager.all_steps():
        latest = max(manager.all_steps())
        prime_optimizer(optim)  # the optimizer's state must exist to be loaded into
        state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": 0,
                 "rng": {"cpu": torch.get_rng_state(), "pjrt": torch.pjrt.get_rng_state()}}
        manager.restore(latest, state)  # in place, into the tensors' current sharding
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
        torch.set_rng_state(state["rng"]["cpu"])
        torch.pjrt.set_rng_state(state["rng"]["pjrt"])
        start = state["step"]
        print(f"resumed from step {start} ({args.ckpt_dir}/{start})")

    model.train()
    steps = range(start + 1, args.steps + 1)
    loader = MpDeviceLoader([batch(step, args.batch) for step in steps], xs.device(), input_sharding={
        "x": xs.ShardingSpec(mesh, ("fsdp", None)), "y": xs.ShardingSpec(mesh, ("fsdp",))})  # rows over fsdp
    for step, data in zip(steps, loader):
        loss = F.cross_entropy(model(data["x"]), data["y"])
        loss.backward()
        optim.step()
        optim.zero_grad()
        xs.sync()  # torch_xla.sync(): the step runs as one program on every device
        print(f"step {step:4d}  loss {loss.item():.6f}")
        state = {"model": model.state_dict(), "optim": optim.state_dict(), "step": step,
                 "rng": {"cpu": torch.get_rng_state(), "pjrt": torch.pjrt.get_rng_state()}}
        if manager.save_async(step, state):  # saves every --save-every steps, in the background
            print(f"step {step:4d}  checkpoint being written to {args.ckpt_dir}/{step}")
    manager.join()  # wait for the last checkpoint before exiting
    print(f"checkpoints kept: steps {manager.all_steps()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
