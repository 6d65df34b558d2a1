"""Fixtures for the tests of models built from transformers and timm: the CPU plugin's 8 devices, no downloads."""

from __future__ import annotations

import os

# Models are built from configs with random weights: nothing may reach for the Hugging Face hub. Set before
# transformers is imported (it reads the variable once).
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

import pjrt_plugins.spmd as xs  # noqa: E402

NUM_DEVICES = 8


@pytest.fixture
def cpu8():
    """pjrt:0 over the OpenXLA CPU plugin with 8 devices, metrics reset; the CPU fallback is on again afterwards
    (a test that wants it off turns it off itself)."""
    xs.set_plugin("cpu", options={"cpu_device_count": NUM_DEVICES})
    vd = xs.virtual_device()
    assert vd.spmd and vd.num_devices == NUM_DEVICES, f"expected SPMD over {NUM_DEVICES} CPU devices, got {vd}"
    xs.sync()
    xs.reset_metrics()
    yield vd
    xs.set_cpu_fallback(True)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: dynamo keeps compiled frames per code object (one ``forward`` for every
    model of a class), and the recompiles of earlier tests would count against its recompile limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
