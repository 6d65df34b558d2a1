"""Reduce a graph to lowered operators with torch's own decompositions.

Each node whose operator has no hand lowering is replaced, in place of the node, by the
graph torch's decomposition traces to (recursively). In-place overloads (``add_``) map to
their functional form. An operator with neither raises :class:`UnsupportedOpError`.
"""

from __future__ import annotations

import functools
import logging
import operator
from typing import Any

import torch
import torch.fx as fx
from torch._decomp import core_aten_decompositions, decomposition_table
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.immutable_collections import immutable_dict, immutable_list
from torch.utils import _pytree as pytree

from ...errors import LoweringError, UnsupportedOpError
from ._composites import COMPOSITES
from ._emitter import ScalarSlot
from ._foreach import foreach_plan, split_foreach
from ._table import LOWERINGS, is_random, op_name

logger = logging.getLogger(__name__)
aten = torch.ops.aten

_MAX_DEPTH = 16


@functools.cache
def _core_table() -> dict[Any, Any]:
    return dict(core_aten_decompositions())


@functools.cache
def _expansion_table() -> dict[Any, Any]:
    """The core table without the ops lowered by hand: a traced decomposition keeps those as calls, as the
    tracer's own decomposition at dispatch time does (same graph, same numbers)."""
    return {op: fn for op, fn in _core_table().items() if op not in LOWERINGS}


@functools.cache
def _full_table() -> dict[Any, Any]:
    return dict(decomposition_table)


# In-place overloads whose functional twin has a different overload name.
_FUNCTIONAL_RENAMES = {
    "aten::bernoulli_.float": "aten::bernoulli.p",
    "aten::bernoulli_.Tensor": "aten::bernoulli.Tensor",
    "aten::uniform_": "aten::uniform",
    "aten::normal_": "aten::normal_functional",
    "aten::copy_": "aten::copy",
    "aten::fill_.Scalar": "aten::fill.Scalar",
    "aten::fill_.Tensor": "aten::fill.Tensor",
    "aten::zero_": "aten::zero",
    "aten::pow_.Scalar": "aten::pow.Tensor_Scalar",  # aten::pow.Scalar is (Scalar self, Tensor exponent)
    "aten::pow_.Tensor": "aten::pow.Tensor_Tensor",
    "aten::float_power_.Scalar": "aten::float_power.Tensor_Scalar",
    "aten::float_power_.Tensor": "aten::float_power.Tensor_Tensor",
    "aten::ldexp_": "aten::ldexp.Tensor",
    "aten::floor_divide_.Tensor": "aten::floor_divide.default",
    "aten::transpose_": "aten::transpose.int",
    "aten::__iand__.Tensor": "aten::bitwise_and.Tensor",
    "aten::__iand__.Scalar": "aten::bitwise_and.Scalar",
    "aten::__ior__.Tensor": "aten::bitwise_or.Tensor",
    "aten::__ior__.Scalar": "aten::bitwise_or.Scalar",
    "aten::__ixor__.Tensor": "aten::bitwise_xor.Tensor",
    "aten::__ixor__.Scalar": "aten::bitwise_xor.Scalar",
    "aten::__ilshift__.Tensor": "aten::bitwise_left_shift.Tensor",
    "aten::__ilshift__.Scalar": "aten::bitwise_left_shift.Tensor_Scalar",
    "aten::__irshift__.Tensor": "aten::bitwise_right_shift.Tensor",
    "aten::__irshift__.Scalar": "aten::bitwise_right_shift.Tensor_Scalar",
    # torch's reference decompositions write results with copy_to (same element count, same shape here).
    "prims::copy_to": "aten::copy",
}


@functools.cache
def is_inplace(op: Any) -> bool:
    """True for overloads that write into their first argument (``add_``, ``copy_``, ...), not ``out=`` forms."""
    if not isinstance(op, torch._ops.OpOverload):
        return False
    args = op._schema.arguments
    if not args or args[0].alias_info is None or not args[0].alias_info.is_write:
        return False
    return not any(a.kwarg_only and a.name == "out" for a in args)


def writes_an_input(graph: fx.Graph) -> bool:
    """Whether a traced graph writes in place into one of its placeholders (directly or through a view of it)."""
    for node in graph.nodes:
        if node.op != "call_function" or not is_inplace(node.target):
            continue
        written = node.args[0] if node.args else None
        while isinstance(written, fx.Node) and written.op == "call_function" and getattr(written.target, "is_view",
                                                                                          False):
            written = written.args[0]
        if isinstance(written, fx.Node) and written.op == "placeholder":
            return True
    return False


@functools.cache
def functional_variant(op: Any) -> Any | None:
    """The out-of-place overload computing what an in-place overload writes, or None."""
    if not is_inplace(op):
        return None
    schema = op._schema
    full = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
    target = _FUNCTIONAL_RENAMES.get(full) or _FUNCTIONAL_RENAMES.get(schema.name)
    if target is None:
        base = schema.name.split("::", 1)[1].rstrip("_")
        target = f"aten::{base}" + (f".{schema.overload_name}" if schema.overload_name else "")
    ns, rest = target.split("::", 1)
    name, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), name, None)
    if packet is None:
        return None
    return getattr(packet, overload or "default", None)


def decomposition_for(op: Any) -> Any | None:
    """The decomposition of ``op``: ours for ops torch has none for (``_composites``), then torch's core
    table, then its full one."""
    return COMPOSITES.get(op) or _core_table().get(op) or _full_table().get(op)


def can_lower(op: Any) -> bool:
    return op in LOWERINGS or op is operator.getitem


def _meta_of(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(tuple(value.shape), tuple(value.stride()), dtype=value.dtype, device="meta")
    return value


def _plain_containers(value: Any) -> Any:
    """``value`` with fx's immutable lists and dicts (at any depth) as plain ones."""
    if isinstance(value, immutable_list):
        return [_plain_containers(v) for v in value]
    if isinstance(value, immutable_dict):
        return {k: _plain_containers(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_plain_containers(v) for v in value)
    if type(value) is dict:
        return {k: _plain_containers(v) for k, v in value.items()}
    return value


def trace_decomposition(op: Any, decomp: Any, args: tuple, kwargs: dict) -> fx.GraphModule:
    """The graph of ``decomp(*args, **kwargs)`` over meta tensors (one placeholder per tensor leaf)."""
    # A node's list arguments are fx's immutable lists; a decomposition may write into its list
    # arguments (``_unsafe_masked_index`` clamps ``indices`` in place), as it may into a call's own.
    flat, spec = pytree.tree_flatten(_plain_containers((args, kwargs)))
    tensor_pos = [i for i, v in enumerate(flat) if isinstance(v, torch.Tensor)]

    def run(*tensors: torch.Tensor) -> Any:
        leaves = list(flat)
        for i, t in zip(tensor_pos, tensors):
            leaves[i] = t
        a, k = pytree.tree_unflatten(leaves, spec)
        return decomp(*a, **k)

    metas = [_meta_of(flat[i]) for i in tensor_pos]
    return make_fx(run, decomposition_table=_expansion_table())(*metas)


def expand_graph(graph: fx.Graph, *, _depth: int = 0) -> fx.Graph:
    """A copy of ``graph`` whose every call is lowerable; in-place calls become functional."""
    if _depth > _MAX_DEPTH:
        raise UnsupportedOpError("<decomposition>", "torch decompositions recurse too deeply")
    if all(n.op != "call_function" or can_lower(n.target) for n in graph.nodes):
        return graph
    new = fx.Graph(owning_module=graph.owning_module)
    env: dict[fx.Node, Any] = {}
    # In-place writes: every node aliasing a storage maps to its root, the root to its newest value.
    roots: dict[fx.Node, fx.Node] = {}
    newest: dict[fx.Node, fx.Node] = {}

    def lookup(n: fx.Node) -> Any:
        root = roots.get(n, n)
        return env[newest.get(root, n)]

    for node in graph.nodes:
        if node.op != "call_function":
            env[node] = new.node_copy(node, lookup)
            continue
        target = node.target
        if target is operator.getitem and isinstance(lookup(node.args[0]), tuple):
            item = env[node] = lookup(node.args[0])[node.args[1]]
            sharding = node.meta.get("sharding")
            if sharding is not None and isinstance(item, fx.Node) and item.op == "call_function":
                item.meta["sharding"] = sharding  # a constraint on one result of an expanded op
            continue
        args = fx.node.map_arg(node.args, lookup)
        kwargs = fx.node.map_arg(node.kwargs, lookup)
        functional = functional_variant(target)
        if functional is not None:
            env[node] = _call_or_inline(new, functional, args, kwargs, node.meta, _depth)
            written = node.args[0]
            if isinstance(written, fx.Node):
                root = roots.get(written, written)
                roots[node] = root
                newest[root] = node
            continue
        env[node] = _call_or_inline(new, target, args, kwargs, node.meta, _depth)
    return new


def _call_or_inline(new: fx.Graph, target: Any, args: Any, kwargs: Any, meta: dict, depth: int) -> Any:
    """A call of ``target`` in ``new`` when it is lowerable, else its decomposition spliced in."""
    if isinstance(target, type) and issubclass(target, tuple):
        return tuple(args) + tuple(kwargs.values())  # a decomposition building its named result tuple
    plan = foreach_plan(target)
    if plan is not None:  # one call of the per-tensor op per list element
        vals = meta.get("val")
        return tuple(_call_or_inline(new, plan.element, a, k, {"val": vals[i]} if vals is not None else {}, depth)
                     for i, (a, k) in enumerate(split_foreach(plan, tuple(args), dict(kwargs))))
    if can_lower(target):
        call = new.call_function(target, tuple(args), dict(kwargs))
        call.meta = dict(meta)
        return call
    decomp = decomposition_for(target)
    if decomp is None:
        raise UnsupportedOpError(op_name(target))
    if any(isinstance(a, ScalarSlot) for a in pytree.tree_leaves((tuple(args), dict(kwargs)))):
        # Tracing the decomposition would bake the scalar's current value into the program.
        raise LoweringError(f"internal: {op_name(target)} takes a run-time scalar but has no lowering of its own")
    meta_args = fx.node.map_arg(args, lambda n: n.meta.get("val"))
    # Factories inside the decomposition build meta tensors, like the rest of the trace (the lowering
    # places every value on the module's devices anyway).
    meta_kwargs = {k: torch.device("meta") if isinstance(v, torch.device) else v
                   for k, v in fx.node.map_arg(kwargs, lambda n: n.meta.get("val")).items()}
    try:
        sub = trace_decomposition(target, decomp, tuple(meta_args), dict(meta_kwargs))
    except UnsupportedOpError:
        raise
    except Exception as exc:
        raise UnsupportedOpError(op_name(target), f"operator {op_name(target)} has no lowering and its torch "
                                 f"decomposition failed to trace: {type(exc).__name__}: {exc}") from exc
    sub_graph = expand_graph(sub.graph, _depth=depth + 1)
    inputs = [a for a in pytree.tree_leaves((tuple(args), dict(kwargs))) if isinstance(a, fx.Node)]
    placeholders = [n for n in sub_graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise UnsupportedOpError(op_name(target), f"internal: the decomposition of {op_name(target)} takes "
                                 f"{len(placeholders)} tensors, the call passes {len(inputs)}")
    val_map: dict[fx.Node, Any] = dict(zip(placeholders, inputs))
    for sn in sub_graph.nodes:
        if sn.op in ("placeholder", "output"):
            continue
        if sn.op == "get_attr":
            raise UnsupportedOpError(op_name(target), f"the decomposition of {op_name(target)} captures a tensor "
                                     "constant, which the lowering cannot inline")
        if sn.target is operator.getitem and isinstance(val_map[sn.args[0]], tuple):
            val_map[sn] = val_map[sn.args[0]][sn.args[1]]
            continue
        copied = val_map[sn] = new.node_copy(sn, lambda n: val_map[n])
        if "rng_key" in meta and copied.op == "call_function" and is_random(copied.target):
            copied.meta["rng_key"] = meta["rng_key"]  # the random op's key: its pieces draw from it in turn
    out_node = next(n for n in sub_graph.nodes if n.op == "output")
    result = fx.node.map_arg(out_node.args[0], lambda n: val_map[n])
    if isinstance(result, fx.Node) and meta.get("sharding") is not None:
        result.meta["sharding"] = meta["sharding"]
    return tuple(result) if isinstance(result, list) else result
