"""Fixtures every test area shares (an area's own conftest.py may add to them or override them).

Nothing here is autouse: each area scrubs its own environment.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import site
import subprocess
from pathlib import Path

import pytest
from _support import package_file, session_site_dirs

# The gpu backend's CUDA wheels live out of JAX's sight (see _support.CUDA_SITE): this session and
# the interpreters it starts see them, before anything here imports pjrt_plugins.
for _directory in session_site_dirs():
    site.addsitedir(_directory)
if session_site_dirs():
    os.environ["PYTHONPATH"] = os.pathsep.join([*session_site_dirs(), *filter(None, [os.environ.get("PYTHONPATH")])])

#: The test plugin that forwards to the real CPU plugin and misbehaves on request (see its header).
SHIM_SOURCE = Path(__file__).resolve().parent / "runtime" / "shim_plugin.c"


@pytest.fixture(scope="session")
def gcc() -> str:
    """The C compiler that builds the test plugins and libraries (and the stub's own build)."""
    path = shutil.which("gcc")
    if path is None:
        pytest.skip("gcc is not installed (needed to build the test libraries and plugins)")
    return path


@pytest.fixture(scope="session")
def cpu_library_path() -> Path:
    """The real XLA CPU PJRT plugin that the xla-cpu-pjrt wheel installs (a dependency of pjrt-plugin-cpu)."""
    path = package_file("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so")
    if path is None:
        pytest.fail("the xla-cpu-pjrt wheel (the real CPU PJRT plugin) is not installed: run scripts/setup")
    return path


@pytest.fixture(scope="session")
def pjrt_header() -> Path:
    """The official pjrt_c_api.h shipped in the installed xla-cpu-pjrt wheel (API 0.81)."""
    header = package_file("xla_plugins.xla_cpu_pjrt", "include/pjrt_c_api.h")
    if header is None:
        pytest.fail("xla-cpu-pjrt is not installed, or lacks include/pjrt_c_api.h: run scripts/setup")
    return header


@pytest.fixture(scope="session")
def stub_library() -> Path:
    """The stub_neuron library that installing plugins/stub_neuron compiled."""
    path = package_file("pjrt_plugin_stub_neuron", "libpjrt_stub_neuron.so")
    if path is None:
        pytest.fail("pjrt-plugin-stub-neuron (with its built library) is not installed: "
                    "pip install --no-build-isolation plugins/stub_neuron")
    return path


@pytest.fixture(scope="session")
def cpu_header_dir(pjrt_header: Path) -> Path:
    return pjrt_header.parent


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
