"""The core's tests on Python 3.12 and 3.13 with jax/jaxlib 0.12, through ``scripts/test-matrix``.

jax 0.11 dropped Python 3.11, so the newest jax runs only on 3.12 and newer; this suite's own
interpreter is CI's 3.11. Each test builds (or reuses) the matrix's ``.venv-3.X`` and runs a
part of the suite there that touches every layer without torch: the discovery and registry
tests, the ABI test, the CPU backend, and the stub as a JAX 0.12 platform. The whole suite on
every Python is ``scripts/test-matrix`` itself (docs/releasing.md). A test skips, saying so,
where its interpreter is not installed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MATRIX = REPO / "scripts" / "test-matrix"
#: One test file or folder per layer, quick enough for every CI run.
QUICK_SUITE = ("tests/core/test_registry.py tests/core/test_discovery.py tests/runtime/test_abi.py "
               "tests/plugins/test_cpu.py tests/plugins/stub_neuron/test_stub_neuron_frameworks.py")


@pytest.mark.parametrize("version", ["3.12", "3.13"])
def test_the_core_suite_passes_on_python_with_jax_0_12(version):
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(PYTHONS=version, TESTS=QUICK_SUITE)
    # one stream, in order: a failure's tail is pytest's report, not pip's warnings printed before it
    result = subprocess.run([str(MATRIX), "-x"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=1500, env=env)
    output = result.stdout
    if f"==> Python {version}: not found" in output:
        pytest.skip(f"Python {version} is not installed (no python{version} on PATH, no pyenv version {version}.x)")
    assert result.returncode == 0, f"scripts/test-matrix on Python {version} failed:\n{output[-6000:]}"
    assert f"==> Python {version}: {version}" in output and "jax 0.12" in output, output[-3000:]
    assert " passed" in output and " failed" not in output, output[-3000:]
