"""torch.fft on pjrt tensors against the CPU: the three FFT primitives are lowered to stablehlo.fft.

Real and complex inputs, 1-3 transformed dimensions in any position, every normalization, cropped
lengths; the transforms themselves must not take the CPU fallback (complex padding and arithmetic do).
"""

from __future__ import annotations

import pytest
import torch

import pjrt_plugins.spmd as xs
from pjrt_plugins.errors import UnsupportedOpError

from _exec_support import assert_close, engine  # noqa: F401

F = torch.fft

CASES = [
    ("fft", lambda t: F.fft(t)),
    ("ifft along dim 0", lambda t: F.ifft(t, dim=0)),
    ("fft2 ortho", lambda t: F.fft2(t, norm="ortho")),
    ("ifftn forward", lambda t: F.ifftn(t, dim=(0, 2), norm="forward")),
    ("fftn cropped", lambda t: F.fftn(t, s=(3, 4), dim=(0, 1))),
    ("irfft", lambda t: F.irfft(t)),
    ("irfft odd length", lambda t: F.irfft(t, n=7, dim=1)),
    ("irfftn ortho", lambda t: F.irfftn(t, norm="ortho")),
]
REAL_CASES = [
    ("rfft", lambda t: F.rfft(t)),
    ("rfft2 along 0 and 2", lambda t: F.rfft2(t, dim=(0, 2))),
    ("rfftn forward", lambda t: F.rfftn(t, norm="forward")),
    ("fft of a real tensor", lambda t: F.fft(t, dim=1)),
    ("rfft then irfft", lambda t: F.irfft(F.rfft(t, dim=1), n=t.shape[1], dim=1)),
]


@pytest.mark.parametrize("name, fn", CASES + REAL_CASES, ids=[c[0] for c in CASES + REAL_CASES])
def test_fft_matches_the_cpu_without_the_fallback(engine, name, fn):
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5, dtype=torch.float32 if (name, fn) in REAL_CASES else torch.complex64)
    xs.set_cpu_fallback(False)  # the transforms are lowered: strict mode must not refuse them
    try:
        out = fn(x.to("pjrt")).cpu()
    finally:
        xs.set_cpu_fallback(True)
    ref = fn(x)
    assert out.dtype == ref.dtype, name
    if ref.is_complex():
        out, ref = torch.view_as_real(out), torch.view_as_real(ref)
    assert_close(name, out, ref, rtol=1e-4, atol=1e-4)


def test_complex_arithmetic_around_an_fft_is_refused_when_strict(engine):
    xs.set_cpu_fallback(False)
    try:
        z = F.fft(torch.randn(8).to("pjrt"))
        with pytest.raises(UnsupportedOpError, match="complex numbers"):
            z * z
    finally:
        xs.set_cpu_fallback(True)


@pytest.mark.parametrize("spec", [("x", None), (None, "x")])
def test_fft_of_a_sharded_tensor_along_and_across_the_sharded_dimension(engine, spec):
    mesh = xs.Mesh(range(8), (8,), ("x",))
    torch.manual_seed(1)
    x = torch.randn(16, 24)
    p = x.to("pjrt")
    xs.mark_sharding(p, mesh, spec)
    for dim in (0, 1):
        out = torch.fft.rfft(p, dim=dim)
        assert_close(f"rfft along {dim} of {spec}", torch.view_as_real(out.cpu()),
                     torch.view_as_real(torch.fft.rfft(x, dim=dim)), rtol=1e-4, atol=1e-4)
