"""Fixtures every test area shares (an area's own conftest.py may add to them or override them).

Nothing here is autouse: each area scrubs its own environment.
"""

from __future__ import annotations

import os
import shutil
import site
from pathlib import Path

import pytest
from _support import package_file, session_site_dirs

# The gpu backend's CUDA wheels live out of JAX's sight (see _support.CUDA_SITE): this session and
# the interpreters it starts see them, before anything here imports pjrt_plugins.
for _directory in session_site_dirs():
    site.addsitedir(_directory)
if session_site_dirs():
    os.environ["PYTHONPATH"] = os.pathsep.join([*session_site_dirs(), *filter(None, [os.environ.get("PYTHONPATH")])])


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
