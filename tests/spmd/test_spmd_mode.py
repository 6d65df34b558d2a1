"""SPMD on by default, XLA_USE_SPMD / use_spmd() for ported code, and the single-device mode."""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import SpmdDisabledError
from pjrt_plugins.spmd import devices

pytestmark = pytest.mark.usefixtures("fresh_device_state")


def test_spmd_is_on_by_default(monkeypatch):
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    assert xs.is_spmd()
    assert xs.virtual_device().num_devices == 8


@pytest.mark.parametrize("value, expected", [("1", True), ("true", True), ("0", False), ("off", False), (" ", True)])
def test_xla_use_spmd_is_read(monkeypatch, value, expected):
    monkeypatch.setenv("XLA_USE_SPMD", value)
    assert xs.is_spmd() is expected


def test_a_bad_xla_use_spmd_value_is_named(monkeypatch):
    monkeypatch.setenv("XLA_USE_SPMD", "maybe")
    with pytest.raises(ValueError, match="XLA_USE_SPMD='maybe' must be 1 or 0"):
        xs.is_spmd()


def test_without_spmd_the_virtual_device_is_one_device(monkeypatch):
    monkeypatch.setenv("XLA_USE_SPMD", "0")
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    vd = xs.virtual_device()
    assert not vd.spmd and vd.num_devices == 1
    t = torch.randn(4, 4)
    p = t.to("pjrt")
    with pytest.raises(SpmdDisabledError, match=r"use_spmd\(\).*XLA_USE_SPMD=1"):
        xs.mark_sharding(p, xs.Mesh(range(8), (8,)), (0, None))
    shards = p.local_shards  # uploads to the single device
    assert len(shards) == 1 and torch.equal(shards[0].data, t)
    assert xs.transfer_counters().uploaded == {0: t.nbytes}
    assert torch.equal(p.cpu(), t)


def test_use_spmd_turns_it_on_for_ported_code(monkeypatch):
    monkeypatch.setenv("XLA_USE_SPMD", "0")
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    assert xs.virtual_device().num_devices == 1
    with pytest.warns(UserWarning, match="SPMD mode switched"):
        xs.use_spmd()
    assert xs.is_spmd() and xs.virtual_device().num_devices == 8
    p = torch.randn(8).to("pjrt")
    xs.mark_sharding(p, xs.get_1d_mesh(), (0,))
    assert p.sharding_spec == "{devices=[8]0,1,2,3,4,5,6,7}"
    with pytest.raises(NotImplementedError, match="automatic sharding"):
        xs.use_spmd(auto=True)


def test_default_plugin_is_used_when_none_is_chosen(monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    monkeypatch.setenv("CPU_NUM_DEVICES", "8")
    vd = xs.virtual_device()
    assert vd.plugin.name == "cpu" and vd.num_devices == 8
    assert vd.device_assignment == list(range(8))
    assert xs.virtual_device() is vd  # one shared client per process
    assert "plugin='cpu'" in repr(vd)
    assert devices.peek_virtual_device() is vd
