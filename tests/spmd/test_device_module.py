"""``torch.pjrt``, the device module: what torch's RNG forking, checkpointing and autocast ask of it."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import VirtualDeviceError

from _exec_support import assert_close, engine  # noqa: F401


def test_fork_rng_restores_the_device_stream(engine):
    torch.manual_seed(7)
    x = torch.zeros(16).to("pjrt")
    with torch.random.fork_rng(device_type="pjrt"):
        inside = (x + torch.rand_like(x)).cpu()
    after = (x + torch.rand_like(x)).cpu()
    assert torch.equal(inside, after), "the draw after fork_rng must be the one fork_rng undid"


def test_fork_rng_with_the_default_device_type_works_once_pjrt_is_imported():
    with torch.random.fork_rng():
        torch.manual_seed(1)


def test_rng_state_round_trips(engine):
    torch.manual_seed(3)
    state = torch.pjrt.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu" and state.numel() == 16
    x = torch.zeros(8).to("pjrt")
    first = torch.rand_like(x).cpu()
    torch.pjrt.set_rng_state(state)
    assert torch.equal(torch.rand_like(x).cpu(), first)
    torch.pjrt.set_rng_state_all(torch.pjrt.get_rng_state_all())
    assert torch.pjrt.initial_seed() == 3


def test_a_bad_rng_state_is_refused():
    with pytest.raises(ValueError, match="16-byte uint8"):
        torch.pjrt.set_rng_state(torch.zeros(3))


def test_the_device_has_one_stream_always_in_step():
    # torch.distributed.checkpoint's file writer copies to the host on the device's current stream
    stream = torch.pjrt.current_stream()
    assert stream is torch.pjrt.current_stream() is torch.pjrt.default_stream(0)
    assert stream.device_type == "pjrt" and stream.query()
    stream.wait_stream(stream)
    stream.synchronize()
    with torch.pjrt.stream(stream):
        pass
    with pytest.raises(VirtualDeviceError, match="not a stream of the pjrt device"):
        torch.pjrt.stream(object())


def test_device_selection_accepts_only_the_one_device():
    with torch.pjrt.device(0):
        pass
    torch.pjrt.set_device("pjrt:0")
    with pytest.raises(VirtualDeviceError):
        torch.pjrt.device(1)
    with pytest.raises(VirtualDeviceError):
        torch.pjrt.set_device("pjrt:2")


def test_autocast_runs_matmuls_in_bfloat16_and_sensitive_ops_in_float32(engine):
    torch.manual_seed(0)
    ref = nn.Linear(16, 8)
    model = nn.Linear(16, 8).to("pjrt")
    model.load_state_dict(ref.state_dict())
    x = torch.randn(4, 16)
    with torch.autocast("pjrt", dtype=torch.bfloat16):
        y = model(x.to("pjrt"))
        p = F.softmax(y, dim=-1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_ref = ref(x)
    assert y.dtype == torch.bfloat16 and p.dtype == torch.float32
    assert_close("autocast linear", y.cpu().float(), y_ref.float(), rtol=2e-2, atol=2e-2)
    # Outside the block, float32 again.
    assert model(x.to("pjrt")).dtype == torch.float32


def test_autocast_float16_is_supported_and_other_dtypes_disable_it(engine):
    x = torch.randn(4, 4).to("pjrt")
    with torch.autocast("pjrt", dtype=torch.float16):
        assert (x @ x).dtype == torch.float16
    with pytest.warns(UserWarning, match="not supported"):
        with torch.autocast("pjrt", dtype=torch.float64):
            assert (x @ x).dtype == torch.float32
