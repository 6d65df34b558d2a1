"""A small sharded training run that checkpoints, dies and resumes; test_distributed_checkpoint.py runs it.

    python _checkpoint_train.py train DIR STEPS
        trains STEPS steps, saving with torch.distributed.checkpoint itself at step SAVE_AT (DIR/dcp) and
        through a CheckpointManager every 2 steps, asynchronously (DIR/manager); prints each loss, then
        kills itself with SIGKILL (no clean exit: pending saves, buffers and atexit handlers are lost).
    python _checkpoint_train.py resume DIR STEPS
        resumes from DIR/dcp and trains to STEPS, then (in the same process, from scratch) resumes
        from the manager's latest complete checkpoint and trains to STEPS.

Each loss is printed as ``loss STEP HEX`` (float.hex: bit for bit), each resume as ``resumed SOURCE
STEP``. The model has dropout, so the device RNG stream's state is part of the checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings

import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd.distributed_checkpoint import (
    CheckpointManager,
    SPMDLoadPlanner,
    SPMDSavePlanner,
    prime_optimizer,
)

SAVE_AT = 3
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer, xs.Mesh]:
    torch.manual_seed(0)
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    model = torch.nn.Sequential(
        torch.nn.Linear(12, 40), torch.nn.GELU(), torch.nn.Dropout(0.25), torch.nn.Linear(40, 6)
    ).to("pjrt")
    xs.mark_sharding(model[0].weight, mesh, ("model", None))  # 40 rows over 4: even
    xs.mark_sharding(model[0].bias, mesh, ("model",))
    xs.mark_sharding(model[3].weight, mesh, (None, "model"))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    return model, optim, mesh


def batch(step: int, mesh: xs.Mesh) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)  # the data does not depend on any RNG state
    x = xs.mark_sharding(torch.randn(16, 12, generator=g).to("pjrt"), mesh, ("data", None))
    y = torch.randn(16, 6, generator=g).to("pjrt")
    return x, y


def state(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> dict:
    return {"model": model.state_dict(), "optim": optim.state_dict(), "step": step,
            "rng": {"cpu": torch.get_rng_state(), "pjrt": torch.pjrt.get_rng_state()}}


def train_step(model: torch.nn.Module, optim: torch.optim.Optimizer, mesh: xs.Mesh, step: int) -> None:
    x, y = batch(step, mesh)
    loss = F.mse_loss(model(x), y)
    loss.backward()
    optim.step()
    optim.zero_grad()
    xs.sync()
    print(f"loss {step} {loss.item().hex()}", flush=True)


def train(root: str, steps: int) -> None:
    model, optim, mesh = build()
    manager = CheckpointManager(os.path.join(root, "manager"), save_interval=2, chkpt_on_preemption=False)
    model.train()
    for step in range(1, steps + 1):
        train_step(model, optim, mesh, step)
        if step == SAVE_AT:
            dcp.save(state(model, optim, step), checkpoint_id=os.path.join(root, "dcp"), planner=SPMDSavePlanner(),
                     no_dist=True)
        manager.save_async(step, state(model, optim, step))
    os.kill(os.getpid(), signal.SIGKILL)  # no join, no clean exit


def resume(root: str, steps: int, source: str) -> None:
    model, optim, mesh = build()
    prime_optimizer(optim)
    restored = state(model, optim, 0)
    if source == "dcp":
        dcp.load(restored, checkpoint_id=os.path.join(root, "dcp"), planner=SPMDLoadPlanner(), no_dist=True)
    else:
        manager = CheckpointManager(os.path.join(root, "manager"), save_interval=2, chkpt_on_preemption=False)
        manager.restore(max(manager.all_steps()), restored)
    model.load_state_dict(restored["model"])
    optim.load_state_dict(restored["optim"])
    torch.set_rng_state(restored["rng"]["cpu"])
    torch.pjrt.set_rng_state(restored["rng"]["pjrt"])
    print(f"resumed {source} {restored['step']}", flush=True)
    model.train()
    for step in range(restored["step"] + 1, steps + 1):
        train_step(model, optim, mesh, step)


def main(mode: str, root: str, steps: int) -> None:
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    if mode == "train":
        train(root, steps)
    else:
        resume(root, steps, "dcp")
        resume(root, steps, "manager")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
