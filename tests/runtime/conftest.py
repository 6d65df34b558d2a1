"""Fixtures for the runtime tests: the real CPU plugin, its header, and gcc-built test plugins."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_support import CPU_OPTION_SCHEMA

HERE = Path(__file__).resolve().parent
SHIM_SOURCE = HERE / "shim_plugin.c"


@pytest.fixture(scope="session")
def cpu_header_dir(pjrt_header: Path) -> Path:
    return pjrt_header.parent


@pytest.fixture(scope="session")
def client8(cpu_library_path: Path):
    """One shared 8-device CPU client for read-mostly tests (do not close it)."""
    from pjrt_plugins.runtime import Client

    client = Client(cpu_library_path, {"cpu_device_count": 8}, schema=CPU_OPTION_SCHEMA, plugin_name="cpu")
    yield client
    client.close()


@pytest.fixture(scope="session")
def build_c_library(tmp_path_factory: pytest.TempPathFactory, gcc: str):
    """Compile C source into a shared library (cached by source and flags)."""
    out_dir = tmp_path_factory.mktemp("clibs")
    cache: dict[str, Path] = {}

    def build(source: str, *flags: str, name: str = "lib") -> Path:
        digest = hashlib.sha256((source + "\0".join(flags)).encode()).hexdigest()[:16]
        if digest in cache:
            return cache[digest]
        src = out_dir / f"{name}-{digest}.c"
        src.write_text(source)
        lib = out_dir / f"{name}-{digest}.so"
        cmd = [gcc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src), *flags, "-ldl"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"gcc failed: {' '.join(cmd)}\n{result.stderr}")
        cache[digest] = lib
        return lib

    return build


@pytest.fixture(scope="session")
def build_shim(build_c_library, cpu_library_path: Path, cpu_header_dir: Path):
    """``build_shim(SHIM_MINOR=60, ...)``: a test plugin forwarding to the CPU plugin."""

    def build(**defines: object) -> Path:
        flags = [f"-I{cpu_header_dir}", f'-DSHIM_TARGET="{cpu_library_path}"']
        for key, value in sorted(defines.items()):
            flags.append(f"-D{key}" if value is True else f"-D{key}={value}")
        return build_c_library(SHIM_SOURCE.read_text(), *flags, name="shim")

    return build


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (for paths that could kill the process)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def python_subprocess():
    return run_python
