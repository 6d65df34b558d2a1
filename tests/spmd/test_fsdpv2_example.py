"""examples/fsdpv2_train.py at a small size: it runs as a new user would run it, trains with FSDPv2 and sharded
input loading, follows plain CPU torch, and exits non-zero when it does not."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pjrt_plugins.spmd as xs

from _exec_support import engine  # noqa: F401

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fsdpv2_train.py"
SMALL = ["--steps", "3", "--layers", "1", "--dim", "32", "--seq-len", "8", "--vocab", "32"]


def test_the_example_trains_like_plain_torch_as_a_user_runs_it():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PJRT_DEVICE", "XLA_USE_SPMD", "CPU_NUM_DEVICES", "PJRT_PLUGINS_CACHE_DIR")}
    proc = subprocess.run([sys.executable, str(EXAMPLE), *SMALL, "--check"], capture_output=True, text=True,
                          timeout=600, env=env)
    out = proc.stdout
    assert proc.returncode == 0, f"example failed ({proc.returncode}):\n{out[-3000:]}\n{proc.stderr[-3000:]}"
    assert "CPU: 8 devices, mesh {'fsdp': 8, 'tensor': 1}" in out
    assert "each block wrapped: True; blocks.0.fc1.weight {devices=[8,1]0,1,2,3,4,5,6,7}" in out
    # 16 sequences of 8 tokens, input_ids and labels, int64: each device receives its 2 rows of each
    assert "a batch of 2,048 bytes: device 0 receives 256 (its rows)" in out
    assert re.search(r"^OK: largest relative difference from plain CPU torch over 3 steps \S+ \(within 0\.0001\)$",
                     out, re.M)


def test_the_example_exits_non_zero_when_it_differs_from_plain_torch(engine, monkeypatch, capsys):
    monkeypatch.setenv("XLA_USE_SPMD", "1")  # the example calls xr.use_spmd(), which sets it; restored afterwards
    spec = importlib.util.spec_from_file_location("fsdpv2_train", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.TOLERANCE = -1.0  # no run can be this close: the check must fail
    try:
        assert example.main([*SMALL[:1], "1", *SMALL[2:], "--check"]) == 1
    finally:
        xs.set_global_mesh(None)
    assert "FAILED: largest relative difference" in capsys.readouterr().out
