"""Fixtures for the SPMD tests: the virtual device on the real CPU plugin (8 devices) or the stub (4)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.spmd import devices

#: (plugin name, client options) for each device fixture.
DEVICE_SETUPS = {
    "cpu8": ("cpu", {"cpu_device_count": 8}),
    "stub4": ("stub_neuron", {"num_devices": 4}),
}


def _use(name: str) -> xs.VirtualDevice:
    plugin, options = DEVICE_SETUPS[name]
    devices.set_spmd(True)
    xs.set_plugin(plugin, options=options)
    vd = xs.virtual_device()
    xs.reset_transfer_counters()
    return vd


@pytest.fixture
def cpu8() -> xs.VirtualDevice:
    """pjrt:0 over the OpenXLA CPU plugin with 8 devices (SPMD on)."""
    return _use("cpu8")


@pytest.fixture
def stub4() -> Iterator[xs.VirtualDevice]:
    """pjrt:0 over the stub Neuron plugin with 4 devices: transfers only, no compiler.

    Afterwards the stub is forgotten: a later test that builds 8-device meshes without asking for a device
    (their size is checked against the virtual device when one exists) must not find a 4-device one.
    """
    yield _use("stub4")
    devices.reset_choices()


@pytest.fixture(params=sorted(DEVICE_SETUPS))
def any_device(request: pytest.FixtureRequest) -> Iterator[xs.VirtualDevice]:
    """Each of the device setups in turn (for transfer-only behaviour); the stub is forgotten afterwards."""
    yield _use(request.param)
    if request.param == "stub4":
        devices.reset_choices()


@pytest.fixture
def fresh_device_state(monkeypatch: pytest.MonkeyPatch):
    """Forget plugin / SPMD choices before and after the test (for tests that change the mode)."""
    monkeypatch.delenv(devices.USE_SPMD_ENV, raising=False)
    devices.reset_choices()
    xs.reset_transfer_counters()
    yield
    devices.reset_choices()


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Each test compiles from scratch (dynamo caches compiled frames by code object), and leaves no
    garbage of dynamo's behind for the tests that look for reference cycles."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    gc.collect()
