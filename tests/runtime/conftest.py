"""Fixtures for the runtime tests: a shared CPU client and a fresh interpreter for paths that could crash.

The gcc-built test plugins (``build_shim``, ``build_c_library``) are in tests/conftest.py: the
client-creation tests of tests/core use them too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from runtime_support import CPU_OPTION_SCHEMA


@pytest.fixture(scope="session")
def client8(cpu_library_path: Path):
    """One shared 8-device CPU client for read-mostly tests (do not close it)."""
    from pjrt_plugins.runtime import Client

    client = Client(cpu_library_path, {"cpu_device_count": 8}, schema=CPU_OPTION_SCHEMA, plugin_name="cpu")
    yield client
    client.close()


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (for paths that could kill the process)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def python_subprocess():
    return run_python
