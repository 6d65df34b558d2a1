"""Factory functions with device="pjrt" (arange, eye, linspace, full, rand, randint, ...) against plain torch."""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import UnsupportedOpError, VirtualDeviceError
from pjrt_plugins.spmd.transport import TensorState
from pjrt_plugins.spmd.frontend import unwrap

# name -> factory taking a device; each is compared with the same call on the CPU.
HOST_BUILT = {
    "arange(end)": lambda d: torch.arange(10, device=d),
    "arange(start, end, step)": lambda d: torch.arange(1, 10, 3, device=d),
    "arange(float step)": lambda d: torch.arange(0, 1, 0.1, device=d),
    "arange(dtype)": lambda d: torch.arange(-3, 5, device=d, dtype=torch.float16),
    "arange(empty)": lambda d: torch.arange(0, device=d),
    "eye(n)": lambda d: torch.eye(3, device=d),
    "eye(n, m, dtype)": lambda d: torch.eye(3, 5, device=d, dtype=torch.int32),
    "linspace": lambda d: torch.linspace(0, 1, 5, device=d),
    "linspace(tensor start)": lambda d: torch.linspace(torch.tensor(-2.0), 2, 9, device=d),
    "linspace(steps=1)": lambda d: torch.linspace(3, 7, 1, device=d, dtype=torch.float64),
    "logspace": lambda d: torch.logspace(0, 2, 5, device=d),
    "logspace(base)": lambda d: torch.logspace(0, 4, 5, base=2, device=d),
    "tril_indices": lambda d: torch.tril_indices(4, 3, device=d),
    "triu_indices": lambda d: torch.triu_indices(3, 3, offset=1, device=d),
    "full": lambda d: torch.full((2, 3), 7.5, device=d),
    "full(int)": lambda d: torch.full((4,), 3, device=d),
    "zeros": lambda d: torch.zeros(2, 3, device=d, dtype=torch.bfloat16),
    "ones": lambda d: torch.ones(5, device=d, dtype=torch.int64),
    "scalar_tensor": lambda d: torch.scalar_tensor(2.5, device=d),
}


@pytest.mark.parametrize("name", sorted(HOST_BUILT))
def test_factory_matches_torch_and_moves_nothing(cpu8, name):
    make = HOST_BUILT[name]
    t = make("pjrt")
    ref = make("cpu")
    assert isinstance(t, xs.XLAShardedTensor) and t.device == xs.device()
    assert (t.shape, t.dtype) == (ref.shape, ref.dtype)
    assert xs.transfer_counters().uploads == 0  # deferred host data, like t.to("pjrt")
    assert torch.equal(t.cpu(), ref)


def test_factory_results_compute_and_shard(cpu8):
    x = torch.arange(16, device="pjrt", dtype=torch.float32).reshape(4, 4)
    eye = torch.eye(4, device="pjrt")
    xs.mark_sharding(x, xs.Mesh(range(8), (2, 4)), (0, None))
    steps = torch.linspace(0, 1, 4, device="pjrt")
    out = (x @ eye + steps).cpu()
    ref = torch.arange(16.0).reshape(4, 4) @ torch.eye(4) + torch.linspace(0, 1, 4)
    assert torch.allclose(out, ref)
    assert x.sharding_spec == "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"


def test_factory_with_requires_grad_is_a_leaf(cpu8):
    w = torch.arange(1.0, 5.0, device="pjrt", requires_grad=True)
    assert w.is_leaf and w.requires_grad
    (w * w).sum().backward()
    assert torch.equal(w.grad.cpu(), 2 * torch.arange(1.0, 5.0))


def test_linspace_takes_its_ends_from_pjrt_tensors(cpu8):
    start = torch.tensor(-1.0).to("pjrt")
    t = torch.linspace(start, 1, 5, device="pjrt")
    assert torch.equal(t.cpu(), torch.linspace(-1, 1, 5))


def test_factories_refuse_other_devices_and_layouts(cpu8):
    with pytest.raises(VirtualDeviceError, match="pjrt:0"):
        torch.arange(3, device="pjrt:1")
    with pytest.raises(VirtualDeviceError, match="pjrt:0"):
        torch.eye(3, device="pjrt:2")


def test_out_overloads_fill_their_out_tensor_and_refuse_resizing(cpu8):
    out = torch.empty(5, device="pjrt")
    torch.arange(5, out=out)
    assert torch.equal(out.cpu(), torch.arange(5.0))
    with pytest.raises(RuntimeError, match="cannot be resized"):
        torch.arange(5, out=torch.empty(3, device="pjrt"))


def test_random_factories_draw_on_the_devices_without_uploading_garbage(cpu8):
    torch.manual_seed(7)
    u = torch.rand(64, 256, device="pjrt")
    n = torch.randn(64, 256, device="pjrt", dtype=torch.float64)
    xs.sync()
    # torch.empty + uniform_/normal_: the empty contents are never uploaded, only the RNG key is
    assert xs.transfer_counters().total_uploaded < u.nelement()
    assert unwrap(u).state is TensorState.DEVICE
    cu, cn = u.cpu(), n.cpu()
    assert (u.shape, u.dtype, n.dtype) == ((64, 256), torch.float32, torch.float64)
    assert 0.0 <= cu.min() and cu.max() < 1.0 and abs(cu.mean().item() - 0.5) < 0.02
    assert abs(cn.mean().item()) < 0.03 and abs(cn.std().item() - 1.0) < 0.03
    torch.manual_seed(7)
    assert torch.equal(torch.rand(64, 256, device="pjrt").cpu(), cu)  # a fixed seed reproduces


def test_randint_and_random_(cpu8):
    r = torch.randint(3, 7, (4000,), device="pjrt")
    values = r.cpu()
    assert r.dtype == torch.int64 and set(values.unique().tolist()) == {3, 4, 5, 6}
    assert set(torch.randint(5, (1000,), device="pjrt", dtype=torch.int32).cpu().unique().tolist()) == set(range(5))
    t = torch.zeros(2000, dtype=torch.int32, device="pjrt")
    t.random_(10, 12)
    assert set(t.cpu().unique().tolist()) == {10, 11}
    t.random_(3)
    assert set(t.cpu().unique().tolist()) == {0, 1, 2}
    with pytest.raises(UnsupportedOpError, match="upper bound"):
        torch.zeros(3, device="pjrt").random_(2, None).cpu()


def test_empty_read_before_written_uploads_nothing(cpu8):
    e = torch.empty(1000, device="pjrt")
    y = e * 0 + 1  # empty's contents are undefined; nothing of them moves
    assert torch.equal(y.cpu(), torch.ones(1000))
    assert xs.transfer_counters().total_uploaded == 0


def test_autograds_zero_tensors_are_zeros_on_the_device(cpu8):
    """Backward formulas make ZeroTensors (sgn's, for a real input): torch.ops.aten._efficientzerotensor had no
    pjrt kernel, so the backward raised NotImplementedError."""
    zeros = torch._efficientzerotensor((2, 3), device="pjrt")
    assert zeros.device == xs.device() and torch.equal((zeros + 1).cpu(), torch.ones(2, 3))
    x = torch.randn(5).to("pjrt").requires_grad_()
    (grad,) = torch.autograd.grad(torch.sgn(x).sum(), [x])
    assert grad.device == xs.device() and torch.equal(grad.cpu(), torch.zeros(5))


def test_resize_keeps_the_shape_or_says_what_to_do_instead(cpu8):
    """resize_ reached the backend with no kernel (an opaque NotImplementedError)."""
    y = torch.ones(2, 3).to("pjrt")
    y.resize_(2, 3)
    y.resize_as_(torch.empty(2, 3))
    assert torch.equal(y.cpu(), torch.ones(2, 3))
    with pytest.raises(RuntimeError, match=r"cannot change its shape .*torch\.empty"):
        y.resize_(6)
