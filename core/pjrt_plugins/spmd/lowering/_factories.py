"""Lowerings of tensor factories: full/zeros/ones/empty (and their _like/new_ forms), scalar_tensor, arange.

Device, layout and memory-format arguments are ignored: on the pjrt device a value has no layout.
``empty`` lowers to zeros, so uninitialized memory never leaks into results.
"""

from __future__ import annotations

from typing import Any

import torch

from ._emitter import Emitter, Operand, TensorValue
from ._table import lowers

aten = torch.ops.aten


def _fill(em: Emitter, out: torch.Tensor, value: Operand) -> TensorValue:
    return em.as_tensor(value, out.dtype, tuple(out.shape))


@lowers(aten.full.default)
def _full(em: Emitter, out: torch.Tensor, size: Any, fill_value: Operand, **kwargs: Any) -> TensorValue:
    return _fill(em, out, fill_value)


@lowers(aten.full_like.default)
def _full_like(em: Emitter, out: torch.Tensor, x: TensorValue, fill_value: Operand, **kwargs: Any) -> TensorValue:
    return _fill(em, out, fill_value)


@lowers(aten.new_full.default)
def _new_full(em: Emitter, out: torch.Tensor, x: TensorValue, size: Any, fill_value: Operand, **kwargs: Any) -> TensorValue:
    return _fill(em, out, fill_value)


@lowers(aten.scalar_tensor.default)
def _scalar_tensor(em: Emitter, out: torch.Tensor, value: Operand, **kwargs: Any) -> TensorValue:
    return _fill(em, out, value)


@lowers(aten.zeros.default, aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default,
        aten.zeros_like.default, aten.empty_like.default, aten.new_zeros.default, aten.new_empty.default,
        aten.new_empty_strided.default, aten.zero.default)
def _zeros(em: Emitter, out: torch.Tensor, *args: Any, **kwargs: Any) -> TensorValue:
    return _fill(em, out, 0)


@lowers(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(em: Emitter, out: torch.Tensor, *args: Any, **kwargs: Any) -> TensorValue:
    return _fill(em, out, 1)


def _arange(em: Emitter, out: torch.Tensor, start: Any, step: Any) -> TensorValue:
    n = int(out.shape[0])
    if out.dtype.is_floating_point:
        acc = torch.float64
    else:
        acc = torch.int64
        start, step = int(start), int(step)
    i = em.iota((n,), 0, acc)
    values = em.add(em.mul(i, em.constant(step, acc, (n,))), em.constant(start, acc, (n,)))
    return em.convert(values, out.dtype)


@lowers(aten.arange.start_step)
def _arange_start_step(em: Emitter, out: torch.Tensor, start: Any, end: Any, step: Any = 1, **kwargs: Any) -> TensorValue:
    return _arange(em, out, start, step)


@lowers(aten.arange.start)
def _arange_start(em: Emitter, out: torch.Tensor, start: Any, end: Any, **kwargs: Any) -> TensorValue:
    return _arange(em, out, start, 1)


@lowers(aten.arange.default)
def _arange_default(em: Emitter, out: torch.Tensor, end: Any, **kwargs: Any) -> TensorValue:
    return _arange(em, out, 0, 1)


@lowers(aten.fill.Scalar, aten.fill.Tensor)
def _fill_value(em: Emitter, out: torch.Tensor, x: TensorValue, value: Operand) -> TensorValue:
    if isinstance(value, TensorValue):
        return em.broadcast_to(em.convert(em.reshape(value, ()), out.dtype), tuple(out.shape))
    return _fill(em, out, value)
