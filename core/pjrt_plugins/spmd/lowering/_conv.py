"""Lowerings of convolutions (1-3 d, strided, padded, dilated, grouped, transposed) and their backward.

Everything is one ``stablehlo.convolution``: a transposed convolution and both gradients are
convolutions with swapped dimension numbers, dilations and paddings (the standard adjoint
identities), so the SPMD partitioner sees convolutions it knows how to split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxlib.mlir.dialects import stablehlo as hlo

from ._emitter import Emitter, TensorValue
from ._mlir import padding_attr, tensor_type
from ._promotion import Promotion
from ._table import lowers

aten = torch.ops.aten

#: A dimension layout: (batch, feature, *spatial) for images, (out feature, in feature, *spatial) for kernels.
Spec = tuple[int, ...]


def _dilated(size: int, dilation: int) -> int:
    return 0 if size == 0 else 1 + dilation * (size - 1)


@dataclass(frozen=True)
class ConvGeometry:
    """Everything about a convolution except its operands (StableHLO's attributes, spatial dims in order)."""

    strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    lhs_dilation: tuple[int, ...]
    rhs_dilation: tuple[int, ...]
    specs: tuple[Spec, Spec, Spec]  # lhs, rhs, out
    feature_groups: int = 1
    batch_groups: int = 1


def conv_general(em: Emitter, lhs: TensorValue, rhs: TensorValue, g: ConvGeometry) -> TensorValue:
    """One ``stablehlo.convolution``; the result shape follows StableHLO's shape rule."""
    lhs_spec, rhs_spec, out_spec = g.specs
    spatial = []
    for i, (ld, rd) in enumerate(zip(lhs_spec[2:], rhs_spec[2:])):
        size = _dilated(lhs.shape[ld], g.lhs_dilation[i]) + g.padding[i][0] + g.padding[i][1]
        window = _dilated(rhs.shape[rd], g.rhs_dilation[i])
        spatial.append(0 if size < window or window == 0 else (size - window) // g.strides[i] + 1)
    shape = [0] * lhs.rank
    shape[out_spec[0]] = lhs.shape[lhs_spec[0]] // g.batch_groups
    shape[out_spec[1]] = rhs.shape[rhs_spec[0]]
    for d, s in zip(out_spec[2:], spatial):
        shape[d] = s
    dnums = hlo.ConvDimensionNumbers.get(
        input_batch_dimension=lhs_spec[0], input_feature_dimension=lhs_spec[1],
        input_spatial_dimensions=list(lhs_spec[2:]),
        kernel_output_feature_dimension=rhs_spec[0], kernel_input_feature_dimension=rhs_spec[1],
        kernel_spatial_dimensions=list(rhs_spec[2:]),
        output_batch_dimension=out_spec[0], output_feature_dimension=out_spec[1],
        output_spatial_dimensions=list(out_spec[2:]),
    )
    if 0 in shape or lhs.numel == 0 or rhs.numel == 0:
        return em.constant(0, lhs.dtype, shape)  # empty operands sum nothing (XLA may refuse zero sizes)
    padding = padding_attr(g.padding)
    v = hlo.convolution(tensor_type(shape, lhs.dtype), lhs.value, rhs.value, dnums, g.feature_groups, g.batch_groups,
                        window_strides=list(g.strides), padding=padding, lhs_dilation=list(g.lhs_dilation),
                        rhs_dilation=list(g.rhs_dilation), precision_config=em.options.precision_config())
    return TensorValue(v, tuple(shape), lhs.dtype)


def _swap_first(spec: Spec) -> Spec:
    return (spec[1], spec[0], *spec[2:])


def _group_kernel_for_transpose(em: Emitter, rhs: TensorValue, rhs_spec: Spec, groups: int) -> TensorValue:
    """Kernel [O, I, ...] of a grouped convolution as [O/G, G*I, ...] (its transpose has G groups of I outputs)."""
    o, i = rhs.shape[rhs_spec[0]], rhs.shape[rhs_spec[1]]
    assert rhs_spec[:2] == (0, 1), "kernels are laid out (O, I, spatial...)"
    rest = rhs.shape[2:]
    x = em.reshape(rhs, (groups, o // groups, i) + rest)
    x = em.transpose(x, [1, 0, 2] + list(range(3, 3 + len(rest))))
    return em.reshape(x, (o // groups, groups * i) + rest)


def conv_transpose_lhs(em: Emitter, cotangent: TensorValue, lhs_shape: Sequence[int], rhs: TensorValue,
                       g: ConvGeometry) -> TensorValue:
    """The adjoint of ``conv_general(·, rhs, g)`` applied to ``cotangent``: an array of ``lhs_shape``."""
    lhs_spec, rhs_spec, out_spec = g.specs
    nsp = len(lhs_spec) - 2
    if g.feature_groups > 1:
        rhs = _group_kernel_for_transpose(em, rhs, rhs_spec, g.feature_groups)
    kernel = [rhs.shape[d] for d in rhs_spec[2:]]
    padding = []
    for i in range(nsp):
        lhs_d = _dilated(lhs_shape[lhs_spec[2 + i]], g.lhs_dilation[i])
        rhs_d = _dilated(kernel[i], g.rhs_dilation[i])
        out_d = _dilated(cotangent.shape[out_spec[2 + i]], g.strides[i])
        before = rhs_d - g.padding[i][0] - 1
        padding.append((before, lhs_d + rhs_d - 1 - out_d - before))
    flipped = TensorValue(hlo.reverse(rhs.value, list(rhs_spec[2:])), rhs.shape, rhs.dtype) if nsp else rhs
    t = ConvGeometry(strides=g.lhs_dilation, padding=tuple(padding), lhs_dilation=g.strides,
                     rhs_dilation=g.rhs_dilation, specs=(out_spec, _swap_first(rhs_spec), lhs_spec),
                     feature_groups=g.feature_groups)
    return conv_general(em, cotangent, flipped, t)


def conv_transpose_rhs(em: Emitter, cotangent: TensorValue, lhs: TensorValue, rhs_shape: Sequence[int],
                       g: ConvGeometry) -> TensorValue:
    """The gradient of ``<cotangent, conv_general(lhs, w, g)>`` with respect to ``w`` (of ``rhs_shape``)."""
    lhs_spec, rhs_spec, out_spec = g.specs
    nsp = len(lhs_spec) - 2
    padding = []
    for i in range(nsp):
        lhs_d = _dilated(lhs.shape[lhs_spec[2 + i]], g.lhs_dilation[i])
        rhs_d = _dilated(rhs_shape[rhs_spec[2 + i]], g.rhs_dilation[i])
        out_d = _dilated(cotangent.shape[out_spec[2 + i]], g.strides[i])
        lo = g.padding[i][0]
        padding.append((lo, out_d - lhs_d + rhs_d - lo - 1))
    t = ConvGeometry(strides=g.rhs_dilation, padding=tuple(padding), lhs_dilation=g.lhs_dilation,
                     rhs_dilation=g.strides, specs=(_swap_first(lhs_spec), _swap_first(out_spec), _swap_first(rhs_spec)),
                     feature_groups=g.batch_groups, batch_groups=g.feature_groups)
    r = conv_general(em, lhs, cotangent, t)
    return em.reshape(r, tuple(rhs_shape))


def _geometry(rank: int, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int) -> ConvGeometry:
    """torch's convolution arguments (NC* images, OI* kernels) as a geometry; one value stands for every dim."""
    nsp = rank - 2

    def per_dim(values: Sequence[int]) -> tuple[int, ...]:
        values = [int(v) for v in values]
        return tuple(values * nsp) if len(values) == 1 else tuple(values)

    spec = tuple(range(rank))
    return ConvGeometry(strides=per_dim(stride), padding=tuple((p, p) for p in per_dim(padding)),
                        lhs_dilation=(1,) * nsp, rhs_dilation=per_dim(dilation), specs=(spec, spec, spec),
                        feature_groups=int(groups))


def _add_bias(em: Emitter, y: TensorValue, bias: TensorValue | None) -> TensorValue:
    if bias is None:
        return y
    b = em.broadcast_in_dim(em.convert(bias, y.dtype), y.shape, [1])
    return em.add(y, b)


@lowers(aten.convolution.default, promotion=Promotion.COMPUTE)
def _convolution(em: Emitter, out: torch.Tensor, x: TensorValue, weight: TensorValue, bias: TensorValue | None,
                 stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                 output_padding: Sequence[int], groups: int) -> TensorValue:
    g = _geometry(x.rank, stride, padding, dilation, groups)
    if transposed:
        # torch's transposed convolution is the adjoint of the convolution with the same arguments,
        # whose kernel is ``weight`` read as (in, out / groups) -> [N, C_in] from [N, C_out].
        y = conv_transpose_lhs(em, x, tuple(out.shape), weight, g)
    else:
        y = conv_general(em, x, weight, g)
    return _add_bias(em, y, bias)


@lowers(aten.convolution_backward.default, promotion=Promotion.COMPUTE)
def _convolution_backward(em: Emitter, out: tuple, grad: TensorValue, x: TensorValue, weight: TensorValue,
                          bias_sizes: Sequence[int] | None, stride: Sequence[int], padding: Sequence[int],
                          dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int,
                          output_mask: Sequence[bool]) -> tuple:
    g = _geometry(x.rank, stride, padding, dilation, groups)
    results: list[Any] = [None, None, None]
    if output_mask[0]:
        # A transposed convolution's input gradient is the plain convolution, and vice versa.
        if transposed:
            # output_padding made the output longer than the convolution of the input needs: the
            # convolution back gives those extra positions, which no input element produced.
            gi = conv_general(em, grad, weight, g)
            gi = em.slice(gi, [0] * gi.rank, list(x.shape), [1] * gi.rank)
        else:
            gi = conv_transpose_lhs(em, grad, x.shape, weight, g)
        results[0] = gi
    if output_mask[1]:
        # For a transposed convolution the roles of its input and output swap in the kernel's gradient.
        gw = conv_transpose_rhs(em, x, grad, weight.shape, g) if transposed else \
            conv_transpose_rhs(em, grad, x, weight.shape, g)
        results[1] = gw
    if output_mask[2]:
        dims = [d for d in range(grad.rank) if d != 1]
        results[2] = em.reduce_simple(grad, dims, "sum")
    return tuple(results)  # None where output_mask asked for nothing (torch gives no tensor there either)
