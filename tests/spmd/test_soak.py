"""Hundreds of sharded training steps on the CPU plugin's 8 devices, in a child process.

Issue 17: this MLP (the benchmark's, made smaller) deadlocked in an all-reduce within a few
steps, and XLA aborted the process 40 s later. The child runs the steps under a timeout, so a
hang or an abort fails the test instead of the suite (docs/notes/backends.md, "The all-reduce
deadlock").
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

#: Sizes that deadlocked within 1-16 steps in 5 of 5 runs before the fix (batch, width, hidden).
BATCH, WIDTH, HIDDEN = 128, 512, 2048
STEPS = 200

TRAIN = f"""
import json, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F
import pjrt_plugins.spmd as xs
from pjrt_plugins import ExecutionStuckError

steps = int(sys.argv[1])
xs.set_plugin("cpu", options={{"cpu_device_count": 8}})
torch.manual_seed(0)
mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
model = nn.Sequential(nn.Linear({WIDTH}, {HIDDEN}), nn.ReLU(), nn.Linear({HIDDEN}, {WIDTH})).to("pjrt")
xs.mark_sharding(model[0].weight, mesh, ("model", None))
xs.mark_sharding(model[0].bias, mesh, ("model",))
xs.mark_sharding(model[2].weight, mesh, (None, "model"))
x = xs.mark_sharding(torch.randn({BATCH}, {WIDTH}).to("pjrt"), mesh, ("data", None))
y = xs.mark_sharding(torch.randn({BATCH}, {WIDTH}).to("pjrt"), mesh, ("data", None))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
losses, start = [], time.monotonic()
try:
    for step in range(1, steps + 1):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        xs.sync()
        if step % 5 == 0:
            losses.append(loss.item())
except ExecutionStuckError as exc:
    print(json.dumps({{"stuck_at": step, "reason": exc.reason, "devices": exc.devices, "notes": exc.__notes__}}))
    sys.exit(0)
print(json.dumps({{"steps": step, "first": losses[0], "last": losses[-1], "seconds": time.monotonic() - start}}))
"""


def run_training(steps: int, env: dict[str, str] | None = None, timeout: float = 300) -> dict:
    import os

    environment = {**os.environ, **(env or {})}
    try:
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(TRAIN), str(steps)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=environment,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"training hung: no result within {timeout} s\n{(exc.stderr or '')[-3000:]}")
    assert result.returncode == 0, f"the training process died (status {result.returncode}):\n{result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_hundreds_of_sharded_training_steps_complete():
    report = run_training(STEPS)
    assert report.get("steps") == STEPS, report
    assert report["last"] < report["first"]


def test_a_deadlock_the_user_brings_back_is_reported_not_fatal():
    """With the backend's XLA settings overridden (XNNPACK on, one thread per device), the
    deadlock may come back; it must surface as ExecutionStuckError within the stall timeout,
    long before XLA's 40 s abort, and the process must exit cleanly."""
    env = {"XLA_FLAGS": "--xla_cpu_use_xnnpack=true", "PJRT_NPROC": "8", "PJRT_CPU_STALL_TIMEOUT": "3"}
    report = run_training(60, env)
    if "steps" in report:  # no deadlock this time
        assert report["steps"] == 60
    else:
        assert report["reason"] == "stalled" and report["devices"] == list(range(8)), report
        assert report["notes"][0].startswith("in the SPMD program") and "aten." in report["notes"][0], report
