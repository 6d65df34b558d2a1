"""Convolutions, pools and reducing scatters on sharded pjrt tensors, forward and backward, against torch on the CPU.

Each test records all of its cases lazily and materializes them together: one compile per test.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import pjrt_plugins.spmd as xs

from _exec_support import assert_close, engine  # noqa: F401

Case = tuple[str, Callable[..., Any], Sequence[torch.Tensor], Sequence[Any]]


def _on_pjrt(t: torch.Tensor, partition: Any, mesh: xs.Mesh) -> torch.Tensor:
    d = t.detach().to("pjrt")
    if partition is not None:
        xs.mark_sharding(d, mesh, partition)
    return d.requires_grad_(t.is_floating_point())


def _check(cases: Sequence[Case], *, grad: bool = True, tol: float = 1e-4) -> None:
    """Run every case on pjrt (inputs sharded as given) and on the CPU; outputs and input gradients must agree."""
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    results = []
    for name, fn, args, partitions in cases:
        cpu_args = [a.clone().requires_grad_(grad and a.is_floating_point()) for a in args]
        dev_args = [_on_pjrt(a, p, mesh).requires_grad_(grad and a.is_floating_point()) for a, p in zip(args, partitions)]
        pairs = []
        for fargs in (cpu_args, dev_args):
            out = fn(*fargs)
            outs = list(out) if isinstance(out, tuple) else [out]
            grads: list[Any] = []
            wrt = [a for a in fargs if a.requires_grad]
            if grad and wrt:
                weight = torch.linspace(-1, 1, outs[0].numel()).reshape(outs[0].shape)
                if fargs is dev_args:
                    weight = weight.to("pjrt")
                grads = list(torch.autograd.grad(outs[0], wrt, weight))
            pairs.append(outs + grads)
        results.append((name, pairs))
    for name, (ref, got) in results:
        for i, (r, g) in enumerate(zip(ref, got)):
            assert_close(f"{name}[{i}]", g.cpu(), r, rtol=tol, atol=tol)


def test_convolutions_1d_to_3d_strided_dilated_grouped_transposed_and_their_gradients_match_torch(engine):
    torch.manual_seed(0)
    x1, x2, x3 = torch.randn(4, 4, 11), torch.randn(4, 4, 9, 10), torch.randn(2, 4, 5, 6, 7)
    batch = ("data", None, None)
    cases: list[Case] = [
        ("conv1d", lambda x, w, b: F.conv1d(x, w, b, 2, 1), [x1, torch.randn(6, 4, 3), torch.randn(6)], [batch, None, None]),
        ("conv1d_grouped_dilated", lambda x, w: F.conv1d(x, w, None, 1, 2, 2, 2), [x1, torch.randn(6, 2, 3)],
         [batch, None]),
        ("conv2d_depthwise", lambda x, w, b: F.conv2d(x, w, b, (2, 1), (1, 0), 1, 4),
         [x2, torch.randn(8, 1, 3, 2), torch.randn(8)], [("data", None, None, None), None, None]),
        ("conv2d_spatially_sharded", lambda x, w: F.conv2d(x, w, padding=1), [x2, torch.randn(5, 4, 3, 3)],
         [(None, None, "model", None), None]),
        ("conv2d_same", lambda x, w: F.conv2d(x, w, padding="same", dilation=2), [x2, torch.randn(3, 4, 2, 3)],
         [None, None]),
        ("conv3d", lambda x, w: F.conv3d(x, w, None, (1, 2, 1), 1, (2, 1, 1), 2), [x3, torch.randn(4, 2, 2, 3, 2)],
         [("data", None, None, None, None), None]),
        ("conv_transpose1d_output_padding", lambda x, w, b: F.conv_transpose1d(x, w, b, 3, 1, 1, 2, 2),
         [x1, torch.randn(4, 3, 3), torch.randn(6)], [batch, None, None]),
        ("conv_transpose2d_grouped", lambda x, w: F.conv_transpose2d(x, w, None, 2, 1, (1, 0), 2),
         [x2, torch.randn(4, 3, 3, 2)], [("data", None, None, None), None]),
        ("conv_transpose3d", lambda x, w: F.conv_transpose3d(x, w, None, 1, 0, 0, 1, (1, 2, 1)),
         [x3, torch.randn(4, 2, 2, 2, 3)], [None, None]),
    ]
    _check(cases)


def test_pools_with_ceil_mode_padding_counts_divisors_and_uneven_adaptive_windows_match_torch(engine):
    torch.manual_seed(1)
    x1, x2, x3 = torch.randn(2, 3, 11), torch.randn(4, 3, 9, 10), torch.randn(2, 2, 5, 6, 7)
    ties = torch.randint(0, 3, (4, 3, 9, 10)).float()  # the first maximum wins, as on the CPU
    b4 = ("data", None, None, None)
    cases: list[Case] = [
        ("avg_pool1d_ceil", lambda x: F.avg_pool1d(x, 4, 3, 2, True, False), [x1], [None]),
        ("avg_pool2d", lambda x: F.avg_pool2d(x, 3, 2, 1), [x2], [b4]),
        ("avg_pool2d_ceil_exclude_pad", lambda x: F.avg_pool2d(x, 3, 2, 1, True, False), [x2], [b4]),
        ("avg_pool2d_ceil_include_pad", lambda x: F.avg_pool2d(x, 4, 3, 2, True, True), [x2], [None]),
        ("avg_pool2d_divisor", lambda x: F.avg_pool2d(x, 3, 1, 1, divisor_override=5), [x2], [(None, None, "model", None)]),
        ("avg_pool3d", lambda x: F.avg_pool3d(x, (2, 3, 3), 2, (1, 1, 1), True, False), [x3], [None]),
        ("adaptive_avg_pool1d", lambda x: F.adaptive_avg_pool1d(x, 4), [x1], [None]),
        ("adaptive_avg_pool2d_uneven", lambda x: F.adaptive_avg_pool2d(x, (4, 7)), [x2], [b4]),
        ("adaptive_avg_pool3d_uneven", lambda x: F.adaptive_avg_pool3d(x, (2, 4, 3)), [x3], [None]),
        ("adaptive_max_pool1d", lambda x: F.adaptive_max_pool1d(x, 4, True), [x1], [None]),
        ("adaptive_max_pool2d_uneven", lambda x: F.adaptive_max_pool2d(x, (4, 7), True), [x2], [b4]),
        ("adaptive_max_pool2d_ties", lambda x: F.adaptive_max_pool2d(x, (5, 3), True), [ties], [None]),
        ("adaptive_max_pool3d", lambda x: F.adaptive_max_pool3d(x, (3, 4, 5), True), [x3], [None]),
        ("max_pool2d_ties", lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), [ties], [b4]),
        ("max_pool3d_ceil_dilated", lambda x: F.max_pool3d(x, 2, 2, 0, 2, True, True), [x3], [None]),
    ]
    _check(cases)


@pytest.mark.filterwarnings("ignore:index_reduce:UserWarning", "ignore:The reduce argument:UserWarning")
def test_scatter_reduce_index_reduce_and_scatter_with_reduce_match_torch(engine):
    torch.manual_seed(2)
    x, src = torch.randn(4, 5), torch.randn(3, 5)
    index = torch.randint(0, 4, (3, 5))
    rows = torch.tensor([0, 2, 0])
    ints, int_src = torch.randint(-5, 5, (4, 5)), torch.randint(-5, 5, (3, 5))
    cases: list[Case] = []
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            cases.append((f"scatter_reduce_{reduce}_{include_self}",
                          lambda x, s, r=reduce, i=include_self: x.scatter_reduce(0, index, s, r, include_self=i),
                          [x, src], [("data", None), None]))
            if reduce != "sum":
                cases.append((f"index_reduce_{reduce}_{include_self}",
                              lambda x, s, r=reduce, i=include_self: x.index_reduce(0, rows, s, r, include_self=i),
                              [x, src], [None, None]))
        cases.append((f"scatter_reduce_int_{reduce}", lambda x, s, r=reduce: x.scatter_reduce(1, index, s, r),
                      [ints, int_src], [None, None]))
    nan = x.clone()
    nan[1, 2] = float("nan")
    cases += [
        ("scatter_reduce_amax_nan", lambda x, s: x.scatter_reduce(0, index, s, "amax"), [nan, src], [None, None]),
        ("scatter_add_reduce", lambda x, s: x.scatter(0, index, s, reduce="add"), [x, src], [None, None]),
        ("scatter_multiply_value", lambda x: x.scatter(0, index, 2.5, reduce="multiply"), [x], [None]),
    ]
    _check(cases, grad=False)
    _check([(name, fn, args, parts) for name, fn, args, parts in cases
            if name.startswith(("scatter_reduce_sum", "scatter_reduce_mean", "scatter_reduce_prod_True"))])


def test_cumprod_and_its_gradient_with_zeros_match_torch(engine):
    torch.manual_seed(3)
    with_zeros = torch.tensor([[1.0, 2.0, 0.0, 3.0, 0.5], [0.0, 0.0, 2.0, 1.0, -1.0]])
    _check([("cumprod", lambda x: x.cumprod(1), [torch.randn(4, 6)], [("data", None)]),
            ("cumprod_zeros", lambda x: x.cumprod(1), [with_zeros], [None])])


def test_interpolation_and_replication_padding_gradients_match_torch(engine):
    """Their backward (and the antialiased forward) are torch's own per-dimension matrices, applied on the devices."""
    torch.manual_seed(4)
    x, x1, x3 = torch.randn(4, 3, 6, 7), torch.randn(2, 3, 9), torch.randn(2, 2, 4, 5, 3)
    b4 = ("data", None, None, None)
    cases: list[Case] = [
        ("nearest2d", lambda t: F.interpolate(t, scale_factor=2, mode="nearest"), [x], [b4]),
        ("nearest_exact2d", lambda t: F.interpolate(t, size=(4, 9), mode="nearest-exact"), [x], [None]),
        ("nearest3d", lambda t: F.interpolate(t, size=(3, 7, 5), mode="nearest"), [x3], [None]),
        ("linear1d", lambda t: F.interpolate(t, scale_factor=1.5, mode="linear"), [x1], [None]),
        ("bilinear_scale", lambda t: F.interpolate(t, scale_factor=1.7, mode="bilinear"), [x], [b4]),
        ("bilinear_align_corners", lambda t: F.interpolate(t, size=(9, 5), mode="bilinear", align_corners=True),
         [x], [None]),
        ("bicubic", lambda t: F.interpolate(t, size=(9, 5), mode="bicubic"), [x], [None]),
        ("trilinear", lambda t: F.interpolate(t, scale_factor=1.5, mode="trilinear"), [x3], [None]),
        ("bilinear_antialias", lambda t: F.interpolate(t, size=(3, 4), mode="bilinear", antialias=True), [x], [b4]),
        ("bicubic_antialias", lambda t: F.interpolate(t, size=(4, 3), mode="bicubic", antialias=True), [x], [None]),
        ("replicate_pad1d", lambda t: F.pad(t, (2, 3), mode="replicate"), [x1], [None]),
        ("replicate_pad2d", lambda t: F.pad(t, (1, 2, 2, 1), mode="replicate"), [x], [b4]),
        ("replicate_pad3d_cropping", lambda t: F.pad(t, (1, -1, 2, 0, 0, 1), mode="replicate"), [x3], [None]),
    ]
    _check(cases)
    assert xs.metrics().fallbacks == 0
