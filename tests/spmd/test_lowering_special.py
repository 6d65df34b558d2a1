"""Special functions, torch's prims and the view scatters on pjrt tensors against torch on the CPU.

Inputs include the edges (0, -0, large, inf, NaN); every output of a test comes from one compile.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import pjrt_plugins.spmd as xs

from _exec_support import assert_close, engine  # noqa: F401

EDGES = [0.0, -0.0, 1e-3, -1e-3, 8.0, -8.0, 20.0, 20.5, -30.0, 50.0, 100.0, float("inf"), float("-inf"), float("nan")]


def _inputs(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.cat([torch.randn(18) * 3, torch.tensor(EDGES)])


def _compare(cases, args, *, tol: float = 1e-5, shard: bool = True) -> None:
    mesh = xs.Mesh(range(8), (8,), ("x",))
    dev = []
    for a in args:
        d = a.to("pjrt")
        if shard and a.dim() == 1 and a.shape[0] % 8 == 0:
            xs.mark_sharding(d, mesh, ("x",))
        dev.append(d)
    got = [(name, fn(*dev)) for name, fn in cases]
    for (name, fn), (_, out) in zip(cases, got):
        ref = fn(*args)
        refs, outs = (ref, out) if isinstance(ref, tuple) else ((ref,), (out,))
        for i, (r, o) in enumerate(zip(refs, outs)):
            assert_close(f"{name}[{i}]", o.cpu(), r, rtol=tol, atol=tol)


UNARY = [
    ("erfc", torch.erfc),
    ("erfcx", torch.special.erfcx),
    ("log_ndtr", torch.special.log_ndtr),
    ("ndtr", torch.special.ndtr),
    ("i0", torch.i0),
    ("i0e", torch.special.i0e),
    ("i1", torch.special.i1),
    ("i1e", torch.special.i1e),
    ("spherical_bessel_j0", torch.special.spherical_bessel_j0),
    ("signbit", torch.signbit),
    ("frexp", torch.frexp),
    ("copysign", lambda x: torch.copysign(torch.ones_like(x), x)),
    ("trigamma", lambda x: torch.polygamma(1, x.abs() + 0.1)),
]


def test_special_functions_match_torch_in_float32_and_float64_including_edge_values(engine):
    x = _inputs(0)
    _compare(UNARY, [x])
    _compare(UNARY, [x.double()], tol=1e-9)
    p = torch.rand(32, dtype=torch.float64).clamp(1e-6, 1 - 1e-6)
    _compare([("ndtri", torch.special.ndtri)], [p], tol=1e-9)
    _compare([("ndtri32", torch.special.ndtri)], [p.float()])


def test_binary_special_functions_match_torch_with_nan_and_infinities(engine):
    x = _inputs(1)
    y = torch.cat([torch.randn(18), torch.tensor([float("nan"), 1.0, float("inf"), float("nan"), 0.0, -0.0, 3.0,
                                                   float("-inf"), 2.0, float("nan"), 1.0, 1.0, 2.0, 5.0])])
    _compare([("hypot", torch.hypot), ("fmax", torch.fmax), ("fmin", torch.fmin), ("nextafter", torch.nextafter),
              ("zeta", lambda a, b: torch.special.zeta(a.abs() + 1.1, b.abs() + 0.1))], [x, y])


def test_diagonal_and_as_strided_gradients_are_written_into_the_right_elements(engine):
    """The backward of diag/diagonal/as_strided writes through a view (torch's reference used copy_to)."""
    torch.manual_seed(2)
    x = torch.randn(5, 6)
    cases = [
        ("diag", lambda t: t.diag(1)),
        ("diagonal_neg_offset", lambda t: t.diagonal(-2)),
        ("diagonal_3d", lambda t: t.reshape(5, 2, 3).diagonal(0, 0, 2)),
        ("as_strided", lambda t: t.as_strided((3, 2), (1, 6), 2)),
        ("diagonal_scatter", lambda t: torch.diagonal_scatter(t, t[0, :4] * 2, -1)),
        ("vector_norm_ord3", lambda t: torch.linalg.vector_norm(t, 3, dim=1)),
        ("dist", lambda t: torch.dist(t, t.flip(0), 3)),
    ]
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    dev_x = xs.mark_sharding(x.to("pjrt"), mesh, (None, "model")).requires_grad_()
    cpu_x = x.clone().requires_grad_()
    results = []
    for name, fn in cases:
        ref = fn(cpu_x)
        weight = torch.linspace(-1, 1, ref.numel()).reshape(ref.shape)
        (ref_grad,) = torch.autograd.grad(ref, cpu_x, weight)
        out = fn(dev_x)
        (grad,) = torch.autograd.grad(out, dev_x, weight.to("pjrt"))
        results.append((name, out, grad, ref, ref_grad))
    for name, out, grad, ref, ref_grad in results:
        assert_close(name, out.cpu(), ref.detach(), rtol=1e-5, atol=1e-5)
        assert_close(f"{name} grad", grad.cpu(), ref_grad, rtol=1e-5, atol=1e-5)


def test_in_place_ops_whose_functional_twin_has_another_overload_name(engine):
    """pow_(scalar), float_power_, ldexp_, floor_divide_, &=, <<= and transpose_ run as their functional forms."""
    torch.manual_seed(3)
    x = torch.rand(4, 6) + 0.5
    n = torch.randint(1, 9, (4, 6))

    def run(t: torch.Tensor, i: torch.Tensor) -> list[torch.Tensor]:
        a = t.clone()
        a.pow_(2.5)
        b = t.double()
        b.float_power_(1.5)
        c = t.clone()
        c.ldexp_(i)
        d = t.clone()
        d.floor_divide_(t * 0.3)
        e = i.clone()
        e &= 5
        e <<= 1
        f = t[:, :4].clone()  # square: an in-place op cannot change a pjrt tensor's shape
        f.transpose_(0, 1)
        return [a, b, c, d, e, f, F.normalize(t, p=3)]

    outs = run(x.to("pjrt"), n.to("pjrt"))
    for k, (o, r) in enumerate(zip(outs, run(x, n))):
        assert_close(f"op{k}", o.cpu(), r, rtol=1e-5, atol=1e-6)


def test_polygamma_and_digamma_match_torch_below_zero_and_at_the_poles(engine):
    """CHLO's zeta is wrong for negative arguments: polygamma there comes from the reflection formula."""
    torch.manual_seed(1)
    x = torch.cat([torch.randn(22) * 6, torch.tensor([-8.478, -0.999, -1e-3, -100.3, 0.0, -0.0, float("inf"),
                                                      float("-inf"), float("nan"), 0.3])])
    poles = torch.tensor([-1.0, -2.0, -7.0, 0.0, float("-inf"), 1.5, -2.5, 3.0])
    cases = [(f"polygamma({n})", lambda t, n=n: torch.polygamma(n, t)) for n in range(5)]
    _compare(cases + [("digamma", torch.digamma)], [x], tol=1e-4)
    # torch's trigamma gives a huge finite value at the poles (a rounded sin(pi x)); the higher orders +-inf.
    _compare(cases[2:] + [("digamma", torch.digamma)], [poles], tol=1e-4)


def test_as_strided_of_a_view_or_past_the_last_element_raises_instead_of_reading_other_elements(engine):
    """pjrt views report contiguous strides and offset 0: as_strided on one would index other elements than on
    the CPU, and a gather past the end would clamp; both raise. A view that keeps the CPU's layout is fine."""
    import pytest

    from pjrt_plugins.errors import UnsupportedOpError

    c = torch.arange(12.0).view(3, 4)
    p = c.to("pjrt")
    with pytest.raises(UnsupportedOpError, match="as_strided.default of a view .*aten.t.default"):
        p.t().as_strided((4, 2), (1, 4))
    with pytest.raises(UnsupportedOpError, match="of a view .*aten.slice.Tensor"):
        p[1:].as_strided((2, 2), (4, 1), 0)
    with pytest.raises(RuntimeError, match="reach element 13 of a pjrt tensor of 12 elements"):
        p.as_strided((2, 2), (1, 2), 10)
    assert_close("as_strided of a reshape", p.view(4, 3).as_strided((2, 2), (1, 4), 1).cpu(),
                 c.view(4, 3).as_strided((2, 2), (1, 4), 1))
