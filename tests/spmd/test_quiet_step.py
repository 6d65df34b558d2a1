"""A sharded training step prints nothing to stderr unless the user asks for the plugins' logs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from pjrt_plugins._native_logs import LOG_LEVEL_ENV, TPU_VARIABLES, XLA_VARIABLES

STEP = textwrap.dedent(
    """
    import torch
    import pjrt_plugins.spmd as xs

    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    mesh = xs.Mesh(list(range(8)), (2, 4), ("data", "model"))
    model = torch.nn.Linear(16, 32).to("pjrt")
    xs.mark_sharding(model.weight, mesh, ("model", None))
    x = xs.mark_sharding(torch.randn(8, 16).to("pjrt"), mesh, ("data", None))
    loss = (model(x).relu() @ torch.ones(32, 4, device="pjrt")).sum()
    loss.backward()
    print(tuple(model.weight.grad.cpu().shape), torch.isfinite(loss.cpu()).item())
    """
)


def run_step(**extra: str) -> subprocess.CompletedProcess[str]:
    # Without the logging variables this test process has itself (loading plugins here set them):
    # the child stands for a user's fresh process.
    env = {k: v for k, v in os.environ.items() if k not in (LOG_LEVEL_ENV, *XLA_VARIABLES, *TPU_VARIABLES)}
    env.update(extra)
    return subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True, text=True, timeout=300)


def test_a_sharded_step_leaves_stderr_empty():
    result = run_step()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "(32, 16) True"
    assert result.stderr == ""


def test_the_plugins_info_lines_come_back_when_asked_for():
    result = run_step(**{LOG_LEVEL_ENV: "info"})
    assert result.returncode == 0, result.stderr
    assert "cpu_device_count set via create_options: 8" in result.stderr
