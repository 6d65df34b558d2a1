"""What the tracer knows of each ATen operator (:class:`OpInfo`), worked out once per process from its schema
and the lowering's tables: whether it is recorded, lifted, in place, a view, random, foreach, an ``out=`` form.

Classification only: nothing here records or runs an op.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import torch

from ...errors import UnsupportedOpError
from ..lowering import (
    decomposition_for,
    foreach_plan,
    functional_variant,
    has_lowering,
    is_foreach,
    is_inplace,
    is_random,
    op_name,
)
from ._state import ENGINE

__all__ = [
    "FILL_OPS",
    "LIFTED_OPS",
    "SPECIAL_VALUES",
    "OpInfo",
    "data_dependent",
    "functional_of_out",
    "is_out_variant",
    "op_info",
    "refuse_strided_view",
    "with_defaults",
]

aten = torch.ops.aten

#: Ops whose Python float arguments are plain arithmetic operands: those become run-time scalars
#: (``ScalarSlot``), so a learning rate or an Adam bias correction that changes every step does not
#: change the program. Values some lowering special-cases stay constants.
LIFTED_OPS = frozenset({"add", "sub", "rsub", "mul", "div", "pow", "clamp", "clamp_min", "clamp_max", "masked_fill",
                        "where", "full", "full_like", "fill", "new_full", "lerp", "addcmul", "addcdiv", "adam_step",
                        "sgd_step"})
#: Floats that stay constants in the program even for lifting ops (lowerings special-case them).
SPECIAL_VALUES = frozenset({0.0, 1.0, -1.0, 2.0, 3.0, 0.5, -0.5})
#: Ops that fill their result with one value, converted to the result's dtype: their int and bool fill values
#: become run-time scalars too (``torch.full((B,), is_done)``, a step counter), except the ints 0 and 1 that
#: ``torch.zeros``/``torch.ones`` fill with (constants XLA folds).
FILL_OPS = frozenset({"full", "full_like", "new_full", "fill"})
_FOREACH_PREFIX = "_foreach_"
_CAMEL_HUMP = re.compile(r"(?<=[a-z])([A-Z])")
_MASK_PROBE = torch.empty(0, dtype=torch.bool)
#: Ops whose strides and storage offset index the storage of their first argument.
_STRIDED_OPS = frozenset({aten.as_strided.default, aten.as_strided_copy.default, aten.as_strided_.default,
                          aten.as_strided_scatter.default})
#: View ops whose result, from a tensor that owns its storage, is contiguous at offset 0 on the CPU too.
_CONTIGUOUS_VIEWS = frozenset({"view", "_unsafe_view", "reshape", "alias", "flatten", "view_as", "squeeze",
                               "unsqueeze"})
#: Index ops whose output shape (index) or meaning (index_put) depends on the data when an index is a mask.
_MASKABLE = frozenset({aten.index.Tensor, aten.index_put.default, aten._index_put_impl_.default,
                       aten.index_put_.default, aten._unsafe_index_put.default})


class OpInfo:
    """What the tracer needs to know about one operator, worked out once per process (see :func:`op_info`)."""

    __slots__ = ("func", "id", "name", "node_name", "inplace", "functional", "recordable", "lifts", "fills", "is_view",
                 "foreach", "is_overload", "out_variant", "maskable", "inplace_view", "defaults", "random",
                 "decomposition", "whole", "strided")

    def __init__(self, func: Any, op_id: int) -> None:
        self.func = func
        self.id = op_id
        self.name = op_name(func)
        self.node_name = _CAMEL_HUMP.sub(r"_\1", getattr(func, "__name__", "op")).lower()
        self.is_overload = isinstance(func, torch._ops.OpOverload)
        self.inplace = is_inplace(func)
        self.functional = functional_variant(func) if self.inplace else None
        self.inplace_view = self.inplace and torch.Tag.inplace_view in func.tags
        self.defaults = _missing_defaults(func, self.functional) if self.functional is not None else ()
        self.foreach = is_foreach(func)
        self.random = is_random(func)
        packet = getattr(func, "overloadpacket", None)
        base = packet.__name__ if packet is not None else ""
        self.lifts = base.removeprefix(_FOREACH_PREFIX) in LIFTED_OPS
        self.fills = base in FILL_OPS
        self.is_view = bool(getattr(func, "is_view", False))
        self.out_variant = is_out_variant(func)
        # Indexing that a boolean mask makes data-dependent (asked once, with a mask).
        self.maskable = data_dependent(func, (None, [_MASK_PROBE]))
        plan = foreach_plan(func) if self.foreach else None
        # A foreach op is recorded whole when its per-tensor op is: one with run-time scalars
        # only when that op is lowered by hand (a traced decomposition would bake the values).
        self.recordable = has_lowering(func) or (
            plan is not None and (has_lowering(plan.element) or (not self.lifts and decomposition_for(plan.element))))
        self.decomposition = decomposition_for(func) if self.is_overload else None
        # An op with a decomposition is recorded whole where that decomposition lowers (checked once per
        # argument shapes): the decomposition then runs once, when its graph is lowered, not every step.
        # Not an op that writes an argument (native_batch_norm's running stats) or returns a view of one,
        # nor one whose floats would be run-time scalars (a decomposition cannot take those).
        self.whole = (self.decomposition is not None and not self.recordable and not self.foreach
                      and not self.lifts and not self.is_view and not _aliases_arguments(func))
        self.strided = func in _STRIDED_OPS


def op_info(func: Any) -> OpInfo:
    """The :class:`OpInfo` of ``func``, made on first use (kept in ``ENGINE.op_infos``; the info keeps the operator
    alive, so ids are never reused)."""
    info = ENGINE.op_infos.get(id(func))
    if info is None:
        with ENGINE.lock:
            info = ENGINE.op_infos.get(id(func))
            if info is None:
                info = OpInfo(func, len(ENGINE.ops_by_id))
                ENGINE.ops_by_id.append(info)
                ENGINE.op_infos[id(func)] = info
    return info


def _aliases_arguments(func: Any) -> bool:
    """Whether the op writes into one of its arguments or returns a view of one (per its schema)."""
    schema = getattr(func, "_schema", None)
    return schema is None or any(a.alias_info is not None for a in (*schema.arguments, *schema.returns))


def _missing_defaults(func: Any, functional: Any) -> tuple[tuple[int, Any], ...]:
    """``(position, argument)`` of the in-place op's arguments with a default that its functional twin lacks
    (``bernoulli_()``'s ``p=0.5``, ``bernoulli.p``): a call that leaves them out must pass them to the twin."""
    twin = functional._schema.arguments
    return tuple((i, arg) for i, arg in enumerate(func._schema.arguments)
                 if arg.has_default_value() and not (i < len(twin) and twin[i].has_default_value()))


def with_defaults(info: OpInfo, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call with the arguments of ``info.defaults`` that torch left out because they had their default."""
    new_args, new_kwargs = list(args), dict(kwargs)
    for i, arg in info.defaults:
        if i < len(new_args) or arg.name in new_kwargs:
            continue
        if arg.kwarg_only:
            new_kwargs[arg.name] = arg.default_value
        elif i == len(new_args):
            new_args.append(arg.default_value)
    return tuple(new_args), new_kwargs


def _writes_kwargs(schema: Any) -> bool:
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


@functools.cache
def is_out_variant(func: Any) -> bool:
    """True for overloads that write their results into keyword arguments (``out=``, ``max=``/``max_values=``)."""
    schema = getattr(func, "_schema", None)
    return schema is not None and _writes_kwargs(schema)


@functools.cache
def functional_of_out(func: Any) -> Any | None:
    """The overload of ``func``'s packet taking the same arguments without the written ones, or None."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    wanted = [(a.name, str(a.type)) for a in schema.arguments if not (a.kwarg_only and a.alias_info is not None
                                                                      and a.alias_info.is_write)]
    packet = func.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        args = candidate._schema.arguments
        if any(a.alias_info is not None and a.alias_info.is_write for a in args):
            continue
        if [(a.name, str(a.type)) for a in args] == wanted:
            return candidate
    return None


def data_dependent(func: Any, args: tuple) -> bool:
    """True for indexing with a boolean mask (its result's shape or positions depend on the mask's values)."""
    if func not in _MASKABLE or len(args) < 2:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1] or ())


def refuse_strided_view(info: OpInfo, args: tuple) -> None:
    """``as_strided`` of a view indexes the viewed tensor's storage on the CPU; a pjrt view reports contiguous
    strides and offset 0 and has no such storage, so the same call would read other elements: refuse it
    (the CPU fallback would copy the view alone and give the same wrong values)."""
    data = getattr(args[0], "_pjrt_data", None) if args else None
    if data is None or data.view_of is None:
        return
    _, chain = data.view_of
    for view_op, _ in chain:
        if view_op is None or view_op.overloadpacket.__name__ not in _CONTIGUOUS_VIEWS:
            raise UnsupportedOpError(info.name, f"{info.name} of a view ({op_name(view_op)} of another tensor) is "
                                     "not supported on the pjrt device: pjrt tensors report contiguous strides and "
                                     "no storage offset, so its strides would index other elements than on the "
                                     "CPU. Call it on the tensor that owns the storage, or on a .clone() of the "
                                     "view.")
