"""The emitter: typed StableHLO building blocks shared by every op lowering.

Op lowerings receive an :class:`Emitter` and :class:`TensorValue` arguments and build
ops with it; they never touch torch state or devices.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as hlo

from ...errors import LoweringError
from ..sharding import OpSharding, SdyPlan
from ._mlir import is_unsigned, padding_attr, splat_attr, tensor_type
from ._sdy import constrain

RNG_ALGORITHMS = {"default": "DEFAULT", "three_fry": "THREE_FRY", "philox": "PHILOX"}
#: torch.get_float32_matmul_precision() -> the StableHLO precision of matrix products and
#: convolutions. The same three levels: full float32, then TF32 or bfloat16x3, then bfloat16.
MATMUL_PRECISIONS = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}


@dataclass(frozen=True)
class LoweringOptions:
    """What a lowering depends on besides the graph (all of it is part of the cache key).

    ``dense_gather_factor``: the active plugin's factor (0 = always sparse gathers).
    ``rng_algorithm``: ``"default"``, ``"three_fry"`` or ``"philox"`` (the plugin's rng_default).
    ``target_version``: the StableHLO version of the portable artifact (None = jaxlib's own).
    ``matmul_precision``: torch's float32 matmul precision (``torch.get_float32_matmul_precision()``);
    ``"highest"``, torch's default, keeps GPUs from computing float32 products in TF32.
    ``partitioner``: the sharding annotations to emit, ``"shardy"`` (``sdy``) or ``"gspmd"`` (``mhlo.sharding``);
    a program whose shardings Shardy cannot express keeps GSPMD's (``LoweredModule.partitioner`` says which).
    """

    num_partitions: int = 1
    dense_gather_factor: int = 0
    rng_algorithm: str = "default"
    target_version: str | None = None
    matmul_precision: str = "highest"
    partitioner: str = "gspmd"

    def __post_init__(self) -> None:
        if self.partitioner not in ("shardy", "gspmd"):
            raise ValueError(f"unknown partitioner {self.partitioner!r}; use 'shardy' or 'gspmd'")
        if self.rng_algorithm not in RNG_ALGORITHMS:
            raise ValueError(f"unknown RNG algorithm {self.rng_algorithm!r}; use one of {sorted(RNG_ALGORITHMS)}")
        if self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(f"unknown matmul precision {self.matmul_precision!r}; "
                             f"use one of {sorted(MATMUL_PRECISIONS)}")
        if self.num_partitions < 1:
            raise ValueError(f"num_partitions must be >= 1, got {self.num_partitions}")

    def precision_config(self) -> ir.ArrayAttr:
        """The ``precision_config`` of a dot_general or convolution (one entry per operand)."""
        level = hlo.PrecisionAttr.get(MATMUL_PRECISIONS[self.matmul_precision])
        return ir.ArrayAttr.get([level, level])

    def use_dense_gather(self, gathered_dim: int) -> bool:
        """Seed 001's rule: dense unless the gathered dimension exceeds factor * 10; 0 = always sparse."""
        return self.dense_gather_factor > 0 and gathered_dim <= self.dense_gather_factor * 10


@dataclass(frozen=True)
class TensorValue:
    """An SSA value with the torch shape and dtype it stands for."""

    value: ir.Value
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class ScalarSlot(float):
    """A Python float passed to the module at run time (entry ``index`` of its scalar argument).

    It compares and computes like its value, so lowerings treat it as a number; only values
    that no lowering special-cases are made slots (see ``_lazy``), so the program does not
    depend on the value and a changing learning rate or bias correction reuses it.
    """

    index: int

    def __new__(cls, value: float, index: int) -> ScalarSlot:
        slot = super().__new__(cls, value)
        slot.index = int(index)
        return slot

    def __repr__(self) -> str:
        return f"ScalarSlot({float(self)!r}, index={self.index})"

    def __reduce__(self) -> tuple:
        return (ScalarSlot, (float(self), self.index))


Scalar = bool | int | float
Operand = TensorValue | Scalar


class Emitter:
    """Builds StableHLO ops at the current insertion point, keeping torch dtypes alongside."""

    def __init__(self, options: LoweringOptions, scalars: TensorValue | None = None):
        self.options = options
        #: The module's ``uint64[n, 2]`` RNG keys, and the row the node being lowered starts from.
        self.rng_keys: TensorValue | None = None
        self.rng_row: int | None = None
        self._rng_states: dict[int, ir.Value] = {}
        #: The module's float64 vector of run-time scalars (read by :class:`ScalarSlot` constants).
        self.scalars = scalars
        self._slot_reads: dict[tuple[int, torch.dtype], TensorValue] = {}
        #: The fx node being lowered (for lowerings that need their inputs' strides).
        self.node: Any = None
        # Matrix products by result value, so a transpose of one becomes the swapped product.
        self._products: dict[ir.Value, tuple[TensorValue, TensorValue, int, int]] = {}
        #: Shard groups (``{unknown shard_as N}``) numbered so far in this module.
        self.shard_groups = 0
        #: The program's Shardy plan (its mesh and shardings), or None for GSPMD annotations.
        self.sdy_plan: SdyPlan | None = None
        #: Whether the program has a manual-sharding region (then it has GSPMD annotations): only then can a value
        #: be a region's, which some lowerings must not pin (``_collectives.in_manual_region``).
        self.has_manual_regions = False
        #: Reshapes that merged a tensor's leading dimensions into one, by result: the tensor before the merge.
        #: torch's matmul of 4-D tensors views them as 3-D for bmm; see :meth:`batched_matmul`.
        self._merged: dict[ir.Value, TensorValue] = {}

    def constrain(self, x: TensorValue, spec: OpSharding | str) -> TensorValue:
        """``x`` pinned to the sharding ``spec`` (in the program's annotation kind)."""
        return TensorValue(constrain(self.sdy_plan, x.value, spec), x.shape, x.dtype)

    # -- values -------------------------------------------------------------------

    def wrap(self, value: ir.Value, dtype: torch.dtype) -> TensorValue:
        shape = tuple(ir.RankedTensorType(value.type).shape)
        return TensorValue(value, shape, dtype)

    def constant(self, value: Scalar, dtype: torch.dtype, shape: Sequence[int] = ()) -> TensorValue:
        """``value`` as a ``dtype`` tensor of ``shape``; a :class:`ScalarSlot` is read from the scalar argument."""
        shape = tuple(int(s) for s in shape)
        if isinstance(value, ScalarSlot):
            tv = self._read_slot(value, dtype)
        else:
            tv = TensorValue(hlo.constant(splat_attr(value, (), dtype)), (), dtype)
        return self.broadcast_to(tv, shape) if shape else tv

    def _read_slot(self, slot: ScalarSlot, dtype: torch.dtype) -> TensorValue:
        if self.scalars is None:
            raise LoweringError("internal: a run-time scalar was lowered without the module's scalar argument")
        key = (slot.index, dtype)
        tv = self._slot_reads.get(key)
        if tv is None:
            one = self.slice(self.scalars, [slot.index], [slot.index + 1], [1])
            tv = self.convert(self.reshape(one, ()), dtype)
            self._slot_reads[key] = tv
        return tv

    def as_tensor(self, x: Operand, dtype: torch.dtype, shape: Sequence[int] | None = None) -> TensorValue:
        """``x`` (a value or a Python scalar) converted to ``dtype`` and broadcast to ``shape``."""
        if isinstance(x, TensorValue):
            t = self.convert(x, dtype)
        elif isinstance(x, (bool, int, float)):
            t = self.constant(x, dtype)
        else:
            raise LoweringError(f"expected a tensor or a number, got {type(x).__name__}")
        if shape is not None and tuple(shape) != t.shape:
            t = self.broadcast_to(t, tuple(shape))
        return t

    def convert(self, x: TensorValue, dtype: torch.dtype) -> TensorValue:
        if x.dtype == dtype:
            return x
        if dtype == torch.bool:  # torch: nonzero -> True (a plain convert truncates integers)
            return self.compare(x, self.constant(0, x.dtype, x.shape), "NE")
        return TensorValue(hlo.convert(tensor_type(x.shape, dtype), x.value), x.shape, dtype)

    def bitcast(self, x: TensorValue, dtype: torch.dtype) -> TensorValue:
        return TensorValue(hlo.bitcast_convert(tensor_type(x.shape, dtype), x.value), x.shape, dtype)

    # -- shapes -------------------------------------------------------------------

    def broadcast_to(self, x: TensorValue, shape: tuple[int, ...]) -> TensorValue:
        """Numpy-style broadcast (trailing dimensions aligned)."""
        shape = tuple(shape)
        if x.shape == shape:
            return x
        offset = len(shape) - x.rank
        if offset < 0:
            raise LoweringError(f"cannot broadcast shape {x.shape} to {shape}")
        for i, d in enumerate(x.shape):
            if d != 1 and d != shape[offset + i]:
                raise LoweringError(f"cannot broadcast shape {x.shape} to {shape}")
        return self.broadcast_in_dim(x, shape, list(range(offset, len(shape))))

    def broadcast_in_dim(self, x: TensorValue, shape: Sequence[int], dims: Sequence[int]) -> TensorValue:
        shape = tuple(int(s) for s in shape)
        v = hlo.broadcast_in_dim(tensor_type(shape, x.dtype), x.value, list(dims))
        return TensorValue(v, shape, x.dtype)

    def reshape(self, x: TensorValue, shape: Sequence[int]) -> TensorValue:
        shape = tuple(int(s) for s in shape)
        if shape == x.shape:
            return x
        if math.prod(shape) != x.numel:
            raise LoweringError(f"cannot reshape {x.shape} to {shape}")
        before = self._merged.get(x.value)
        if before is not None and before.shape == shape:
            return before  # undoes a merge of leading dimensions
        y = TensorValue(hlo.reshape(tensor_type(shape, x.dtype), x.value), shape, x.dtype)
        lead = x.rank - len(shape) + 1
        if lead >= 2 and shape[1:] == x.shape[lead:]:
            self._merged[y.value] = x
        return y

    def batched_matmul(self, a: TensorValue, b: TensorValue) -> TensorValue:
        """``a @ b`` for ``(batch, m, k)`` and ``(batch, k, n)`` operands.

        When both are merges of the same leading dimensions (torch's matmul of ``(b, h, t, d)``
        tensors reshapes them to ``(b*h, t, d)`` for bmm), one dot_general keeps those dimensions
        as batch dimensions: a partitioner can keep them split on different mesh axes (batch on
        one, heads on another), which no sharding of the merged dimension expresses. The merged
        result's reshape back to them is then no op at all.
        """
        lhs, rhs = self._merged.get(a.value), self._merged.get(b.value)
        if lhs is not None and rhs is not None and lhs.rank == rhs.rank and lhs.shape[:-2] == rhs.shape[:-2]:
            lead = list(range(lhs.rank - 2))
            product = self.dot_general(lhs, rhs, ((lhs.rank - 1,), (rhs.rank - 2,)), (lead, lead))
            return self.reshape(product, (a.shape[0], a.shape[1], b.shape[2]))
        return self.dot_general(a, b, ((2,), (1,)), ((0,), (0,)))

    def erase_unused_merges(self) -> None:
        """Erase the merging reshapes :meth:`batched_matmul` left without users (call once the body is built)."""
        for value in reversed(list(self._merged)):
            if next(iter(value.uses), None) is None:
                value.owner.erase()
        self._merged.clear()

    def transpose(self, x: TensorValue, perm: Sequence[int]) -> TensorValue:
        perm = [int(p) for p in perm]
        if perm == list(range(x.rank)):
            return x
        before = self._merged.get(x.value)
        if before is not None and perm[0] == 0:  # transpose the unmerged tensor, keeping its leading dimensions
            lead = before.rank - x.rank + 1
            inner = list(range(lead)) + [lead - 1 + p for p in perm[1:]]
            return self.reshape(self.transpose(before, inner), tuple(x.shape[p] for p in perm))
        product = self._products.get(x.value) if perm == [1, 0] else None
        if product is not None:
            # (a @ b)^T = b^T @ a^T: swapping the operands avoids materializing a transposed copy
            # (autograd's weight gradients are transposed matrix products).
            lhs, rhs, lc, rc = product
            return self.dot_general(rhs, lhs, ((rc,), (lc,)))
        shape = tuple(x.shape[p] for p in perm)
        v = hlo.transpose(x.value, perm, results=[tensor_type(shape, x.dtype)])
        return TensorValue(v, shape, x.dtype)

    def slice(self, x: TensorValue, starts: Sequence[int], limits: Sequence[int], strides: Sequence[int]) -> TensorValue:
        shape = tuple(max(0, -(-(lim - s) // st)) for s, lim, st in zip(starts, limits, strides))
        v = hlo.slice(x.value, list(starts), list(limits), list(strides), results=[tensor_type(shape, x.dtype)])
        return TensorValue(v, shape, x.dtype)

    def concatenate(self, xs: Sequence[TensorValue], dim: int) -> TensorValue:
        shape = list(xs[0].shape)
        shape[dim] = sum(x.shape[dim] for x in xs)
        v = hlo.concatenate([x.value for x in xs], dim, results=[tensor_type(shape, xs[0].dtype)])
        return TensorValue(v, tuple(shape), xs[0].dtype)

    def iota(self, shape: Sequence[int], dim: int, dtype: torch.dtype) -> TensorValue:
        shape = tuple(int(s) for s in shape)
        return TensorValue(hlo.iota(tensor_type(shape, dtype), dim), shape, dtype)

    # -- arithmetic -----------------------------------------------------------------

    def binary(self, op: Callable[..., ir.Value], a: TensorValue, b: TensorValue) -> TensorValue:
        shape = tuple(torch.broadcast_shapes(a.shape, b.shape))
        a, b = self.broadcast_to(a, shape), self.broadcast_to(b, shape)
        if a.dtype != b.dtype:
            raise LoweringError(f"internal: binary op on {a.dtype} and {b.dtype}")
        return TensorValue(op(a.value, b.value), shape, a.dtype)

    def unary(self, op: Callable[..., ir.Value], x: TensorValue) -> TensorValue:
        return TensorValue(op(x.value), x.shape, x.dtype)

    def add(self, a: TensorValue, b: TensorValue) -> TensorValue:
        return self.binary(hlo.add, a, b)

    def sub(self, a: TensorValue, b: TensorValue) -> TensorValue:
        return self.binary(hlo.subtract, a, b)

    def mul(self, a: TensorValue, b: TensorValue) -> TensorValue:
        return self.binary(hlo.multiply, a, b)

    def div(self, a: TensorValue, b: TensorValue) -> TensorValue:
        return self.binary(hlo.divide, a, b)

    def maximum(self, a: TensorValue, b: TensorValue) -> TensorValue:
        return self._nan_propagating(hlo.maximum, a, b)

    def minimum(self, a: TensorValue, b: TensorValue) -> TensorValue:
        return self._nan_propagating(hlo.minimum, a, b)

    def _nan_propagating(self, op: Callable[..., ir.Value], a: TensorValue, b: TensorValue) -> TensorValue:
        """max/min where a NaN operand wins, as in torch (XLA's CPU max/min may drop NaNs)."""
        r = self.binary(op, a, b)
        if not a.dtype.is_floating_point:
            return r
        a, b = self.broadcast_to(a, r.shape), self.broadcast_to(b, r.shape)
        r = self.select(self.compare(b, b, "NE"), b, r)
        return self.select(self.compare(a, a, "NE"), a, r)

    def compare(self, a: TensorValue, b: TensorValue, direction: str) -> TensorValue:
        """Elementwise comparison (``EQ``, ``NE``, ``LT``, ``LE``, ``GT``, ``GE``) giving a bool tensor."""
        shape = tuple(torch.broadcast_shapes(a.shape, b.shape))
        a, b = self.broadcast_to(a, shape), self.broadcast_to(b, shape)
        if a.dtype.is_floating_point:
            kind = "FLOAT"
        elif is_unsigned(a.dtype) or a.dtype == torch.bool:
            kind = "UNSIGNED"
        else:
            kind = "SIGNED"
        v = hlo.compare(
            a.value,
            b.value,
            hlo.ComparisonDirectionAttr.get(direction),
            compare_type=hlo.ComparisonTypeAttr.get(kind),
        )
        return TensorValue(v, shape, torch.bool)

    def select(self, pred: TensorValue, on_true: TensorValue, on_false: TensorValue) -> TensorValue:
        shape = tuple(torch.broadcast_shapes(pred.shape, on_true.shape, on_false.shape))
        pred = self.broadcast_to(pred, shape)
        on_true, on_false = self.broadcast_to(on_true, shape), self.broadcast_to(on_false, shape)
        return TensorValue(hlo.select(pred.value, on_true.value, on_false.value), shape, on_true.dtype)

    def floor(self, x: TensorValue) -> TensorValue:
        return self.unary(hlo.floor, x)

    def trunc(self, x: TensorValue) -> TensorValue:
        """Round toward zero (StableHLO has floor and ceil, not trunc)."""
        negative = self.compare(x, self.constant(0, x.dtype, x.shape), "LT")
        return self.select(negative, self.unary(hlo.ceil, x), self.unary(hlo.floor, x))

    # -- reductions -------------------------------------------------------------------

    def reduce(
        self,
        inputs: Sequence[TensorValue],
        inits: Sequence[TensorValue],
        dims: Sequence[int],
        body: Callable[[Emitter, list[TensorValue], list[TensorValue]], list[TensorValue]],
    ) -> list[TensorValue]:
        """``stablehlo.reduce`` over ``dims``; ``body(em, accumulators, elements)`` returns new accumulators."""
        dims = sorted(set(int(d) for d in dims))
        out_shape = tuple(s for i, s in enumerate(inputs[0].shape) if i not in dims)
        result_types = [tensor_type(out_shape, x.dtype) for x in inputs]
        op = hlo.ReduceOp(result_types, [x.value for x in inputs], [i.value for i in inits], dims)
        scalar_types = [tensor_type((), x.dtype) for x in inputs]
        block = op.regions[0].blocks.append(*(scalar_types + scalar_types))
        with ir.InsertionPoint(block):
            n = len(inputs)
            args = [TensorValue(block.arguments[i], (), inputs[i % n].dtype) for i in range(2 * n)]
            outs = body(self, args[:n], args[n:])
            hlo.return_([o.value for o in outs])
        return [TensorValue(op.results[i], out_shape, inputs[i].dtype) for i in range(len(inputs))]

    def reduce_simple(self, x: TensorValue, dims: Sequence[int], kind: str, *, nan_propagate: bool = True) -> TensorValue:
        """Reduce with ``sum``, ``prod``, ``max``, ``min``, ``and`` or ``or``.

        Float max/min propagate NaN like torch unless ``nan_propagate`` is false (softmax's
        stabilizing max, where a NaN reaches the result anyway).
        """
        dtype = x.dtype
        init: Scalar
        if kind == "sum":
            init, fn = 0, hlo.add
        elif kind == "prod":
            init, fn = 1, hlo.multiply
        elif kind == "max":
            init, fn = lowest(dtype), hlo.maximum
        elif kind == "min":
            init, fn = highest(dtype), hlo.minimum
        elif kind == "and":
            init, fn = True, hlo.and_
        elif kind == "or":
            init, fn = False, hlo.or_
        else:
            raise LoweringError(f"internal: unknown reduction {kind}")
        init_value = self.constant(init, dtype)

        def body(em: Emitter, acc: list[TensorValue], elem: list[TensorValue]) -> list[TensorValue]:
            return [TensorValue(fn(acc[0].value, elem[0].value), (), dtype)]

        # Keep the reduction body a single op: the SPMD partitioner turns only such bodies into
        # cross-device reductions.
        r = self.reduce([x], [init_value], dims, body)[0]
        if kind in ("max", "min") and dtype.is_floating_point and nan_propagate:
            # torch's max/min propagate NaN; XLA's CPU reductions may not.
            has_nan = self.reduce_simple(self.compare(x, x, "NE"), dims, "or")
            r = self.select(has_nan, self.constant(float("nan"), dtype, r.shape), r)
        return r

    def reduce_window(self, x: TensorValue, kind: str, window: Sequence[int], *, strides: Sequence[int] | None = None,
                      padding: Sequence[tuple[int, int]] | None = None, init: Scalar | None = None) -> TensorValue:
        """``stablehlo.reduce_window`` with ``sum``, ``prod``, ``max`` or ``min``; padding holds the identity (or ``init``).

        The result has StableHLO's shape: ``(padded - window) // stride + 1`` per dimension.
        """
        fns = {"sum": (hlo.add, 0), "prod": (hlo.multiply, 1), "max": (hlo.maximum, lowest(x.dtype)),
               "min": (hlo.minimum, highest(x.dtype))}
        fn, identity = fns[kind]
        window = [int(w) for w in window]
        strides = [1] * x.rank if strides is None else [int(s) for s in strides]
        padding = [(0, 0)] * x.rank if padding is None else [(int(lo), int(hi)) for lo, hi in padding]
        shape = tuple(max(0, (s + lo + hi - w) // st + 1) if s + lo + hi >= w else 0
                      for s, w, st, (lo, hi) in zip(x.shape, window, strides, padding))
        init_value = self.constant(identity if init is None else init, x.dtype)
        if 0 in shape or x.numel == 0:
            return self.constant(identity if init is None else init, x.dtype, shape)
        op = hlo.ReduceWindowOp(
            [tensor_type(shape, x.dtype)], [x.value], [init_value.value], window_dimensions=window,
            window_strides=strides,
            padding=padding_attr(padding),
        )
        block = op.regions[0].blocks.append(tensor_type((), x.dtype), tensor_type((), x.dtype))
        with ir.InsertionPoint(block):
            hlo.return_([fn(block.arguments[0], block.arguments[1])])
        return TensorValue(op.results[0], shape, x.dtype)

    def scan(self, inputs: Sequence[TensorValue], inits: Sequence[TensorValue], dim: int,
             body: Callable[[Emitter, list[TensorValue], list[TensorValue]], list[TensorValue]]) -> list[TensorValue]:
        """Inclusive scans along ``dim`` with an associative, commutative ``body`` (a variadic reduce_window
        whose window covers the dimension, padded in front with ``inits``)."""
        x = inputs[0]
        n = x.shape[dim]
        if x.numel == 0:
            return list(inputs)
        window = [n if i == dim else 1 for i in range(x.rank)]
        padding = [(n - 1, 0) if i == dim else (0, 0) for i in range(x.rank)]
        op = hlo.ReduceWindowOp([tensor_type(t.shape, t.dtype) for t in inputs], [t.value for t in inputs],
                                [i.value for i in inits], window_dimensions=window,
                                padding=padding_attr(padding))
        scalar_types = [tensor_type((), t.dtype) for t in inputs]
        block = op.regions[0].blocks.append(*(scalar_types + scalar_types))
        with ir.InsertionPoint(block):
            k = len(inputs)
            args = [TensorValue(block.arguments[i], (), inputs[i % k].dtype) for i in range(2 * k)]
            hlo.return_([o.value for o in body(self, args[:k], args[k:])])
        return [TensorValue(op.results[i], t.shape, t.dtype) for i, t in enumerate(inputs)]

    def fori_loop(self, count: int, values: Sequence[TensorValue],
                  body: Callable[[Emitter, TensorValue, list[TensorValue]], list[TensorValue]]) -> list[TensorValue]:
        """``values = body(em, i, values)`` for i in 0..count-1 (an int64 scalar), as one ``stablehlo.while``."""
        i0 = self.constant(0, torch.int64)
        carried = [i0, *values]
        types = [tensor_type(v.shape, v.dtype) for v in carried]
        op = hlo.WhileOp(types, [v.value for v in carried])
        cond = op.regions[0].blocks.append(*types)
        with ir.InsertionPoint(cond):
            i = TensorValue(cond.arguments[0], (), torch.int64)
            hlo.return_([self.compare(i, self.constant(int(count), torch.int64), "LT").value])
        step = op.regions[1].blocks.append(*types)
        outer_reads, self._slot_reads = self._slot_reads, {}  # values made inside the loop stay inside it
        try:
            with ir.InsertionPoint(step):
                args = [TensorValue(step.arguments[j], v.shape, v.dtype) for j, v in enumerate(carried)]
                new = body(self, args[0], args[1:])
                nxt = self.add(args[0], self.constant(1, torch.int64))
                hlo.return_([nxt.value] + [self.convert(n, v.dtype).value for n, v in zip(new, values)])
        finally:
            self._slot_reads = outer_reads
        return [TensorValue(op.results[j + 1], v.shape, v.dtype) for j, v in enumerate(values)]

    # -- linear algebra -----------------------------------------------------------------

    def dot_general(
        self,
        lhs: TensorValue,
        rhs: TensorValue,
        contracting: tuple[Sequence[int], Sequence[int]],
        batch: tuple[Sequence[int], Sequence[int]] = ((), ()),
    ) -> TensorValue:
        """Result dims: batch dims, then lhs free dims, then rhs free dims (StableHLO's order)."""
        lc, rc = [int(d) for d in contracting[0]], [int(d) for d in contracting[1]]
        lb, rb = [int(d) for d in batch[0]], [int(d) for d in batch[1]]
        shape = [lhs.shape[d] for d in lb]
        shape += [s for i, s in enumerate(lhs.shape) if i not in lc and i not in lb]
        shape += [s for i, s in enumerate(rhs.shape) if i not in rc and i not in rb]
        dnums = hlo.DotDimensionNumbers.get(
            lhs_batching_dimensions=lb,
            rhs_batching_dimensions=rb,
            lhs_contracting_dimensions=lc,
            rhs_contracting_dimensions=rc,
        )
        v = hlo.dot_general(tensor_type(shape, lhs.dtype), lhs.value, rhs.value, dnums,
                            precision_config=self.options.precision_config())
        if not lb and lhs.rank == 2 and rhs.rank == 2 and len(lc) == 1:
            self._products[v] = (lhs, rhs, lc[0], rc[0])
        return TensorValue(v, tuple(shape), lhs.dtype)

    # -- random bits -----------------------------------------------------------------------

    def random_bits(self, shape: Sequence[int], bits: int) -> TensorValue:
        """Uniform random bits from ``rng_bit_generator`` with the plugin's algorithm.

        Each random op starts from its own row of the module's RNG keys (``rng_row``, drawn
        from the device RNG state when the op was recorded); several draws of one op thread
        the generator state from one to the next.
        """
        row = self.rng_row
        if self.rng_keys is None or row is None:
            raise LoweringError("internal: a random op was lowered without an RNG key")
        dtype = {32: torch.uint32, 64: torch.uint64}[bits]
        shape = tuple(int(s) for s in shape)
        state = self._rng_states.get(row)
        if state is None:
            state = self.reshape(self.slice(self.rng_keys, [row, 0], [row + 1, 2], [1, 1]), (2,)).value
        algorithm = hlo.RngAlgorithmAttr.get(RNG_ALGORITHMS[self.options.rng_algorithm])
        new_state, out = hlo.rng_bit_generator(state.type, tensor_type(shape, dtype), algorithm, state)
        self._rng_states[row] = new_state
        return TensorValue(out, shape, dtype)

    def uniform(self, shape: Sequence[int], dtype: torch.dtype) -> TensorValue:
        """Uniform floats in [0, 1): random mantissa bits under the exponent of 1.0, minus 1."""
        if dtype == torch.float64:
            bits, mant, one_bits, fdt = 64, 52, 0x3FF0000000000000, torch.float64
        else:
            bits, mant, one_bits, fdt = 32, 23, 0x3F800000, torch.float32
        udt = torch.uint64 if bits == 64 else torch.uint32
        raw = self.random_bits(shape, bits)
        shifted = TensorValue(hlo.shift_right_logical(raw.value, self.constant(bits - mant, udt, raw.shape).value),
                              raw.shape, udt)
        with_exp = TensorValue(hlo.or_(shifted.value, self.constant(one_bits, udt, raw.shape).value), raw.shape, udt)
        floats = self.bitcast(with_exp, fdt)
        u = self.sub(floats, self.constant(1.0, fdt, raw.shape))
        return self.convert(u, dtype)


def lowest(dtype: torch.dtype) -> Scalar:
    """The identity of max for ``dtype`` (-inf, or the smallest integer)."""
    if dtype.is_floating_point:
        return float("-inf")
    if dtype == torch.bool:
        return False
    return int(torch.iinfo(dtype).min)


def highest(dtype: torch.dtype) -> Scalar:
    """The identity of min for ``dtype`` (+inf, or the largest integer)."""
    if dtype.is_floating_point:
        return float("inf")
    if dtype == torch.bool:
        return True
    return int(torch.iinfo(dtype).max)

