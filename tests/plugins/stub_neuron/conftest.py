"""Fixtures for the stub_neuron tests: a Neuron-free environment, the installed library, the header, gcc.

The stub must be installed (``pip install --no-build-isolation plugins/stub_neuron``);
the tests exercise the library that installation compiled.
"""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
from pathlib import Path

import pytest
from stub_neuron_testkit import NEURON_ENV_VARS

import pjrt_plugin_stub_neuron
from pjrt_plugin_stub_neuron import StubNeuronPlugin, _topology


@pytest.fixture(autouse=True)
def clean_neuron_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Neuron or launcher variable from the developer's shell, and no memory of an earlier configure."""
    for name in NEURON_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_topology, "_narrowing", {})


@pytest.fixture
def stub() -> StubNeuronPlugin:
    plugin = StubNeuronPlugin()
    plugin.name = "stub_neuron"
    return plugin


@pytest.fixture(scope="session")
def stub_library() -> Path:
    path = pjrt_plugin_stub_neuron.stub_library_path()
    assert path.is_file(), (
        f"{path} is missing: install the stub first "
        "(pip install --no-build-isolation plugins/stub_neuron)"
    )
    return path


@pytest.fixture(scope="session")
def live_objects(stub_library: Path):
    """``live_objects()``: heap objects the stub library holds now (its debug counter)."""
    library = ctypes.CDLL(str(stub_library))  # the same mapping the runtime dlopen'ed
    counter = library.StubNeuron_LiveObjectCount
    counter.restype = ctypes.c_int64
    return counter


@pytest.fixture(scope="session")
def pjrt_header() -> Path:
    """The official pjrt_c_api.h shipped in the installed xla-cpu-pjrt wheel."""
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    assert spec is not None, "xla-cpu-pjrt is not installed (it is the stub's build requirement)"
    for folder in spec.submodule_search_locations or []:
        header = Path(folder) / "include" / "pjrt_c_api.h"
        if header.is_file():
            return header
    pytest.fail("xla-cpu-pjrt is installed without include/pjrt_c_api.h")


@pytest.fixture(scope="session")
def gcc() -> str:
    compiler = shutil.which("gcc")
    if compiler is None:
        pytest.skip("gcc is not installed here (the stub's build and these C tests need it)")
    return compiler

