"""examples/fsdpv2_checkpoint.py at a small size: it runs as a script, and a second run resumes where the first
stopped and computes what an uninterrupted run does."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pjrt_plugins.spmd.distributed_checkpoint import _manager

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fsdpv2_checkpoint.py"
SMALL = ["--save-every", "2", "--keep", "2", "--batch", "16"]


def _losses(text: str) -> dict[int, str]:
    return {int(step): loss for step, loss in re.findall(r"^step +(\d+) +loss (\S+)$", text, re.M)}


@pytest.fixture
def example(monkeypatch):
    """The example as a module, run in this process; SIGTERM's handling is put back afterwards (the
    example's CheckpointManager watches for preemption)."""
    spec = importlib.util.spec_from_file_location("fsdpv2_checkpoint", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    previous = signal.getsignal(signal.SIGTERM)
    yield module
    signal.signal(signal.SIGTERM, previous)
    _manager._preempted.clear()
    _manager._sigterm_installed = False


def test_the_example_resumes_from_its_latest_checkpoint_as_if_never_stopped(cpu8, tmp_path, example, capsys):
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_DEVICE", "XLA_USE_SPMD", "CPU_NUM_DEVICES")}
    first = subprocess.run([sys.executable, str(EXAMPLE), "--steps", "4", "--ckpt-dir", str(tmp_path / "a"), *SMALL],
                           capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert sorted(_losses(first.stdout)) == [1, 2, 3, 4]
    assert "checkpoint being written to" in first.stdout and "checkpoints kept: steps [2, 4]" in first.stdout
    assert "torch.distributed is disabled" not in first.stderr  # the manager's own choice, not worth a warning

    assert example.main(["--steps", "6", "--ckpt-dir", str(tmp_path / "a"), *SMALL]) == 0
    resumed = capsys.readouterr().out
    assert f"resumed from step 4 ({tmp_path / 'a'}/4)" in resumed
    assert sorted(_losses(resumed)) == [5, 6] and "checkpoints kept: steps [4, 6]" in resumed

    assert example.main(["--steps", "6", "--ckpt-dir", str(tmp_path / "b"), *SMALL]) == 0
    straight = _losses(capsys.readouterr().out)
    assert straight == {**_losses(first.stdout), **_losses(resumed)}
