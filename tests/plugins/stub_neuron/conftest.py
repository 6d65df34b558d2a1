"""Fixtures for the stub_neuron tests: a Neuron-free environment, the installed library, the header (gcc: tests/conftest.py).

The stub must be installed (``pip install --no-build-isolation plugins/stub_neuron``);
the tests exercise the library that installation compiled.
"""

from __future__ import annotations

import ctypes
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
    """Overrides tests/conftest.py's: found through the package's own ``stub_library_path()``."""
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
    try:
        counter = library.StubNeuron_LiveObjectCount
    except AttributeError:
        pytest.fail(f"{stub_library} is a release build without the test counter: reinstall it with "
                    "STUB_NEURON_TEST_EXPORTS=1 (scripts/setup does)")
    counter.restype = ctypes.c_int64
    return counter


