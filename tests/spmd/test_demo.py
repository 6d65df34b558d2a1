"""examples/demo.py, the project's main demo: it runs, shows what it promises, and fails loudly when wrong."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.py"


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PJRT_DEVICE", "XLA_USE_SPMD", "CPU_NUM_DEVICES", "PJRT_PLUGINS_CACHE_DIR"):
        env.pop(name, None)
    return env


def test_demo_runs_and_matches_plain_torch():
    proc = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True, timeout=180, env=_clean_env())
    out = proc.stdout
    assert proc.returncode == 0, f"demo failed ({proc.returncode}):\n{out[-3000:]}\n{proc.stderr[-3000:]}"
    # (a) the plugin table, from the CLI itself
    assert re.search(r"^NAME\s+DISTRIBUTION\s+LIBRARY\s+PRIORITY\s+STATUS$", out, re.M)
    assert re.search(r"^cpu \*?\s+pjrt-plugin-cpu .* available$", out, re.M)
    # (b) the CPU plugin's 8 devices
    assert "ordinal 7: <pjrt Device id=7 kind='cpu'" in out and "ordinal 8:" not in out
    # (c) the sharded step: marks, shards, the partitioner's choices, counters, metrics
    assert "mark_sharding(fc1.weight, mesh, ('model', None))" in out
    assert "cpu:5: rows 64:128, cols 0:64, shard shape (64, 64), replica 1" in out
    marked = re.search(r"^  fc1\.weight\s+\(256, 64\)\s+mark_sharding\s+(\{.*\})$", out, re.M)
    assert marked and marked.group(1) == "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    for name in ("hidden", "out", "loss", "fc2.bias", "fc1.weight.grad"):
        assert re.search(rf"^  {re.escape(name)}\s+\(.*\)\s+partitioner\s+\{{.+\}}$", out, re.M), name
    uploaded = re.search(r"uploaded to each device: ([\d,]+) bytes of the ([\d,]+)", out)
    assert uploaded and int(uploaded.group(1).replace(",", "")) < int(uploaded.group(2).replace(",", ""))
    assert re.search(r"^\s+7\s+[\d,]+\s+[\d,]+$", out, re.M)  # the per-device transfer table
    assert re.search(r"^compiles:\s+1$", out, re.M) and re.search(r"^executions:\s+3$", out, re.M)
    # (d) the check against plain torch
    assert re.search(r"^OK: largest difference from plain torch \S+ \(within 0\.0001\)$", out, re.M)


def test_demo_exits_non_zero_when_results_differ(capsys, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))  # restored afterwards
    spec = importlib.util.spec_from_file_location("pjrt_demo", DEMO)
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    demo.TOLERANCE = -1.0  # no result can be this close: the check must fail
    assert demo.main() == 1
    assert "FAILED: largest difference from plain torch" in capsys.readouterr().out
