"""The public surface of pjrt_plugins.spmd: engine functions reachable as xs.<name>, and only public runtime APIs used."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _exec_support import engine  # noqa: F401

import pjrt_plugins.spmd as xs


ENGINE_NAMES = {
    "sync": "pjrt_plugins.spmd.trace",
    "set_cpu_fallback": "pjrt_plugins.spmd.frontend._fallback",
    "metrics": "pjrt_plugins.spmd.devices",
    "metrics_report": "pjrt_plugins.spmd.devices",
    "reset_metrics": "pjrt_plugins.spmd.devices",
    "Metrics": "pjrt_plugins.spmd.devices",
    "set_cache_dir": "pjrt_plugins.spmd.execution",
    "clear_compile_cache": "pjrt_plugins.spmd.execution",
    "set_partitioner": "pjrt_plugins.spmd.execution",
    "get_partitioner": "pjrt_plugins.spmd.execution",
}
SPMD_DIR = Path(xs.__file__).parent


@pytest.mark.parametrize("name", sorted(ENGINE_NAMES))
def test_engine_functions_are_reachable_as_xs_attributes(name):
    value = getattr(xs, name)
    assert value is getattr(importlib.import_module(ENGINE_NAMES[name]), name)
    assert name in xs.__all__ and name in dir(xs)
    assert value.__doc__ and "Example" in value.__doc__  # the API reference is built from these


def test_every_name_in_all_exists_and_unknown_names_raise():
    assert [n for n in xs.__all__ if not hasattr(xs, n)] == []
    with pytest.raises(AttributeError, match="no attribute 'mark_step'"):
        xs.mark_step  # noqa: B018


def test_metrics_through_the_public_names(engine):
    xs.reset_metrics()
    before = xs.metrics()
    assert isinstance(before, xs.Metrics) and before.executions == 0
    x = torch.arange(16.0, device="pjrt").reshape(4, 4)
    y = (x @ x).relu()
    xs.sync()
    after = xs.metrics()
    assert after.executions == 1 and after.ops_recorded >= 2
    assert "executions:            1" in xs.metrics_report()
    xs.clear_compile_cache()
    (x @ x).relu().cpu()
    assert xs.metrics().compiles == after.compiles + 1  # the cache was emptied
    assert torch.equal(y.cpu(), (torch.arange(16.0).reshape(4, 4) @ torch.arange(16.0).reshape(4, 4)).relu())


def test_importing_spmd_does_not_load_the_engine():
    # torch.manual_seed reaches the pjrt device module too; it must not load the engine either.
    code = ("import sys, torch, pjrt_plugins.spmd; torch.manual_seed(0); torch.pjrt.synchronize(); "
            "print('jaxlib' in sys.modules, 'pjrt_plugins.spmd.trace' in sys.modules, "
            "'pjrt_plugins.spmd.frontend._engine' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.split() == ["False", "False", "False"]


def test_spmd_uses_only_the_public_runtime_api():
    offenders = []
    for path in sorted(SPMD_DIR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if "runtime" in parts and any(p.startswith("_") for p in parts[parts.index("runtime") + 1:]):
                    offenders.append(f"{path.relative_to(SPMD_DIR)}: from {'.' * node.level}{node.module}")
    assert offenders == []
