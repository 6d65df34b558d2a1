"""``torch.compile(..., backend="pjrt")``: torch traces the Python once; a cache hit records one op per graph.

Why: the engine records every ATen operator a step dispatches, and torch's own dispatcher and
autograd cost more per operator than the engine's own recording (``benchmarks/tracing_floor.py``). Under
``torch.compile``, dynamo guards the Python (a changed learning rate or shape retraces) and
AOTAutograd gives forward and backward as graphs of ATen ops; each becomes a ``pjrt::region``
op (``lowering/_region.py``), so a step records a handful of ops, and the engine still runs the
regions with the eager ops around them (the optimizer) as one program.

How torch traces a pjrt tensor is ``_tracing_tensors``' part (inner meta tensors linked to the data,
and tracing pjrt tensors, on the meta device, so factories such as ``torch.arange(n, device=x.device)``
trace there too). At run time AOTAutograd hands the compiled function the linked meta tensors; it
records the region on the pjrt tensors behind them and returns meta tensors linked to the results,
which ``__tensor_unflatten__`` turns back into pjrt tensors.

A graph with dynamic shapes (``dynamic=True``, or dynamo's automatic dynamic shapes after a size
changed) becomes a region per concrete signature, made on the first call with it: the sizes are
computed on meta tensors and written into a copy of the graph (:func:`_specialize`). A graph that does
not lower whole (an operator without a lowering, a tensor constant of more than ``MAX_CONSTANT_ELEMENTS``)
runs op by op through the engine instead: correct, at eager speed. Random ops (dropout) lower in a region: each call
draws its keys of the device RNG stream, as eager ops do.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._dynamo import trace_rules  # noqa: F401  (loaded for configure_dynamo)
from torch._dynamo.backends.common import aot_autograd
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils import _pytree as pytree
from torch.utils._pytree import tree_map_only

from ...errors import UnsupportedOpError
from ..devices import next_rng_keys, rng_keys_tensor
from ..lowering import REGION, expand_graph, region, register_region
from ..trace import record_data
from ._torch_device import DEVICE_TYPE, TORCH_DEVICE
from ._tracing_tensors import configure_dynamo, linked
from .tensor import XLAShardedTensor, unwrap, wrap

logger = logging.getLogger(__name__)

__all__ = ["pjrt_backend"]

_META = torch.device("meta")


# Dynamo must not trace into pjrt_plugins (mark_sharding, transfers: devices and cffi calls): a call from a
# compiled function breaks the graph there and runs eagerly, but for the sharding hints that
# ``_tracing_tensors.trace_through`` lists. torch.compile imports this module for ``backend="pjrt"``;
# ``_tracing_tensors`` does the same the first time dynamo looks inside a pjrt tensor.
configure_dynamo()


# -- the backend ---------------------------------------------------------------------------------


def pjrt_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable[..., Any]:
    """The ``torch.compile`` backend for pjrt tensors (``backend="pjrt"``): AOTAutograd, each graph a region."""
    return aot_autograd(fw_compiler=_compile_graph, bw_compiler=_compile_graph)(gm, example_inputs, **kwargs)


def _compile_graph(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """A graph of AOTAutograd (forward, backward or inference) as a function of the linked meta tensors."""
    if any(isinstance(x, torch.SymFloat | torch.SymBool) for x in example_inputs):
        # A float that changes per call (not a size): a region per value would compile per value.
        logger.info("torch.compile graph of %d nodes runs op by op on the pjrt device: it takes a symbolic float",
                    len(gm.graph.nodes))
        return _run_op_by_op(gm)
    if any(_is_symbolic(x) for x in example_inputs):
        return _run_specialized(gm)
    try:
        plan = _region_plan(gm, example_inputs)
    except (UnsupportedOpError, NotImplementedError) as exc:
        logger.info("torch.compile graph of %d nodes runs op by op on the pjrt device: %s", len(gm.graph.nodes), exc)
        return _run_op_by_op(gm)
    run_region = _region_runner(plan)

    def run(args: list[Any]) -> list[Any]:  # boxed: AOTAutograd hands over its list, which is emptied
        inputs: list[Any] = [_data_of(a) for a in args]
        args.clear()
        return run_region(inputs)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


@dataclass
class _RegionPlan:
    """A graph made a region: what to register, and where its results go among the graph's outputs."""

    graph: fx.Graph  # meta values, every call lowerable
    inputs: tuple  # the inputs' meta tensors
    outputs: tuple  # the meta tensors of the outputs the region computes
    positions: list[int]  # where each of those goes among the graph's outputs
    num_outputs: int  # how many the graph has (the others are None, or a constant)
    plain: list[bool]  # which are plain tensors (see _output_devices)
    constants: dict[int, Any]  # outputs that are numbers (a size saved for the backward, made concrete)


def _region_runner(plan: _RegionPlan) -> Callable[[list[Any]], list[Any]]:
    """Register ``plan``'s region; the function that records it on a call's input data."""
    region_id = register_region(plan.graph, plan.inputs, plan.outputs)
    random_ops = len(region(region_id).random_rows)

    def run(inputs: list[Any]) -> list[Any]:
        if random_ops:  # this call's keys of the device RNG stream, as the engine draws one per random op
            inputs.append(rng_keys_tensor(next_rng_keys(random_ops)))
        results = record_data(REGION, (region_id, inputs))  # no tensor made for what torch gets as inner
        out: list[Any] = [None] * plan.num_outputs
        for position, value in plan.constants.items():
            out[position] = value
        for position, data, is_plain, traced in zip(plan.positions, results, plan.plain, plan.outputs):
            out[position] = wrap(data) if is_plain else linked(data, traced.storage_offset())
        return out

    return run


def _region_plan(gm: fx.GraphModule, example_inputs: Sequence[Any], devices: list[str | None] | None = None,
                 ) -> _RegionPlan:
    """``gm`` as a region (raises NotImplementedError or UnsupportedOpError when it is not one). ``devices``: the
    device type of each output as traced (default: read from ``gm``)."""
    inputs = tuple(_as_meta(x, "input") for x in example_inputs)
    devices = _output_devices(gm) if devices is None else devices
    refused = [d for d in devices if d not in (None, "meta", DEVICE_TYPE)]
    if refused:  # .cpu() inside: a CPU tensor, not a pjrt one
        raise NotImplementedError(f"a graph output is a tensor on {refused[0]}")
    constants = torch.nn.Module()  # owns the graph: holds the tensor constants its get_attr nodes read
    graph = fx.Graph(owning_module=constants)  # type: ignore[arg-type]
    graph.output(graph.graph_copy(gm.graph, {}))  # graph_copy returns what the graph outputs
    for node in list(graph.nodes):
        if node.op == "get_attr":
            _inline_constant(graph, node, getattr(gm, node.target), constants)
        elif "val" in node.meta:
            as_meta = functools.partial(_as_meta, what=node.name)
            node.meta["val"] = tree_map_only(torch.Tensor, as_meta, node.meta["val"])
    output, leaves = _output_leaves(graph)
    positions, kept, constants = [], [], {}
    for position, leaf in enumerate(leaves):
        if leaf is None:
            continue
        if isinstance(leaf, (int, float, bool)):
            constants[position] = leaf
            continue
        if not isinstance(leaf, fx.Node) or not isinstance(leaf.meta.get("val"), torch.Tensor):
            raise NotImplementedError(f"a graph output is {type(leaf).__name__}, not a tensor")
        positions.append(position)
        kept.append(leaf)
    output.args = (tuple(kept),)
    graph.eliminate_dead_code()
    expanded = expand_graph(graph)
    outputs = tuple(leaf.meta["val"] for leaf in kept)
    plain = [devices[p] == DEVICE_TYPE for p in positions]
    return _RegionPlan(expanded, inputs, outputs, positions, len(leaves), plain, constants)


#: The most elements a tensor constant of a graph may have to be written into its program (a lookup table the
#: code builds with ``torch.tensor(list)``); a bigger one keeps the graph op by op.
MAX_CONSTANT_ELEMENTS = 1 << 16


def _inline_constant(graph: fx.Graph, node: fx.Node, value: Any, constants: torch.nn.Module) -> None:
    """A tensor the graph holds as a constant (``torch.tensor(2.5)`` or ``torch.tensor([1, 2])`` in the compiled
    code, which dynamo lifts into ``_tensor_constant<N>`` attributes) made part of the program, uploaded never:
    a number or an empty tensor as a ``full`` node, other values as a StableHLO constant (the ``get_attr``
    node stays, reading ``constants``, which owns the region's graph)."""
    # Only the constants dynamo lifts out of the code: a module's own tensor could be changed in place between
    # calls, and a value written into the program would not follow. Dynamo guards the Python values it made
    # them from, so a new value is a new graph.
    if not (str(node.target).startswith("_tensor_constant") and isinstance(value, torch.Tensor)
            and value.device.type == "cpu" and not value.dtype.is_complex
            and value.numel() <= MAX_CONSTANT_ELEMENTS):
        raise NotImplementedError(f"graphs holding a tensor constant other than a small CPU tensor ({node.target}) "
                                  "are not regions yet")
    with unset_fake_temporarily():  # the backend runs under dynamo's fake mode; the constant is real
        if value.dim() == 0 or value.numel() == 0:
            fill: Any = value.item() if value.numel() else 0
        else:
            setattr(constants, str(node.target), value.detach().clone())
            node.meta["val"] = torch.empty(value.shape, dtype=value.dtype, device=_META)
            return
    with graph.inserting_before(node):
        full = graph.call_function(torch.ops.aten.full.default, (list(value.shape), fill),
                                   {"dtype": value.dtype, "device": _META})
    full.meta["val"] = torch.empty(value.shape, dtype=value.dtype, device=_META)
    node.replace_all_uses_with(full)
    graph.erase_node(node)


# -- graphs with dynamic shapes ------------------------------------------------------------------


#: Regions one graph with dynamic shapes may make (they are kept for the process); later signatures run
#: op by op. Sizes rarely take more values, but an integer that is no size (a step counter) takes one per
#: call. Like eager code, both ways compile a program per integer value.
MAX_SIGNATURES = 32


def _is_symbolic(x: Any) -> bool:
    if isinstance(x, torch.SymInt):
        return True
    return isinstance(x, torch.Tensor) and any(not isinstance(s, int) for s in x.shape)


def _run_specialized(gm: fx.GraphModule) -> Callable[..., Any]:
    """A graph with dynamic shapes: a region per concrete signature (the sizes and strides of the tensors and
    the values of the sizes this call passes), made on the first call with it. The engine compiles one
    program per shape in any case; dynamo keeps one graph for all of them. A signature whose graph does not
    lower whole runs op by op."""
    devices = _output_devices(gm)
    runners: dict[tuple, Callable[[list[Any]], list[Any]]] = {}
    op_by_op: list[Callable[..., Any]] = []

    def run_op_by_op(args: list[Any]) -> list[Any]:
        if not op_by_op:
            op_by_op.append(_run_op_by_op(gm))
        return op_by_op[0](args)

    def run(args: list[Any]) -> list[Any]:
        signature = tuple((tuple(a.shape), a.stride(), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        runner = runners.get(signature)
        if runner is None:
            if len(runners) == MAX_SIGNATURES:  # not kept: a counter would fill the dict
                if not op_by_op:
                    logger.warning("torch.compile graph of %d nodes met more than %d signatures (sizes or integers "
                                   "that keep changing); new ones run op by op on the pjrt device",
                                   len(gm.graph.nodes), MAX_SIGNATURES)
                return run_op_by_op(args)
            runner = runners[signature] = _specialized_runner(gm, args, devices, run_op_by_op)
        return runner(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _specialized_runner(gm: fx.GraphModule, args: list[Any], devices: list[str | None],
                        run_op_by_op: Callable[[list[Any]], list[Any]]) -> Callable[[list[Any]], list[Any]]:
    """The function that runs ``gm`` on calls with the signature of ``args``: a region, else op by op."""
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    try:
        graph = _specialize(gm, args)
        plan = _region_plan(fx.GraphModule(gm, graph), [args[i] for i in tensors], devices)
        run_region = _region_runner(plan)
        logger.debug("torch.compile graph with dynamic shapes: a region for the sizes %s",
                     [tuple(args[i].shape) for i in tensors])
    except Exception as exc:  # noqa: BLE001 - any failure to specialize: the graph still runs, op by op
        logger.info("torch.compile graph of %d nodes runs op by op on the pjrt device for these shapes: %s: %s",
                    len(gm.graph.nodes), type(exc).__name__, exc)
        return run_op_by_op

    def run(args: list[Any]) -> list[Any]:
        inputs = [_data_of(args[i]) for i in tensors]
        args.clear()
        return run_region(inputs)

    return run


def _specialize(gm: fx.GraphModule, args: Sequence[Any]) -> fx.Graph:
    """A copy of ``gm``'s graph with this call's sizes: each node is computed on meta tensors, and every value
    that is not a tensor (a size, a product of sizes) is written into its users as a constant, so the size
    inputs go away and each tensor node's ``val`` is concrete."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    values: dict[fx.Node, Any] = {}
    placeholders = iter(args)
    for node in graph.nodes:
        if node.op == "placeholder":
            a = next(placeholders)
            values[node] = _as_meta(a, node.name) if isinstance(a, torch.Tensor) else a
        elif node.op == "call_function":
            device = node.kwargs.get("device")
            if isinstance(device, torch.device) and device.type == DEVICE_TYPE:
                node.kwargs = {**node.kwargs, "device": _META}  # a factory made on pjrt: its meta stand-in
            call_args, call_kwargs = fx.node.map_arg((node.args, node.kwargs), values.__getitem__)
            values[node] = node.target(*call_args, **call_kwargs)
        elif node.op == "get_attr":
            values[node] = getattr(gm, node.target)  # a constant: _region_plan inlines it
        elif node.op != "output":
            raise NotImplementedError(f"a graph with a {node.op} node ({node.name}) is not a region yet")
    for node in reversed(list(graph.nodes)):
        if node.op == "output":
            continue
        value = values[node]
        if any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(value)):
            node.meta["val"] = value
            continue
        for user in list(node.users):
            user.args, user.kwargs = fx.node.map_arg(  # type: ignore[assignment]
                (user.args, user.kwargs), functools.partial(_constant_for, node=node, value=value))
        graph.erase_node(node)
    return graph


def _constant_for(n: fx.Node, node: fx.Node, value: Any) -> Any:
    """``value`` where ``n`` is ``node`` (a size written into its users), else ``n``."""
    return value if n is node else n


def _output_devices(gm: fx.GraphModule) -> list[str | None]:
    """The device type each output of ``gm`` was traced on: ``meta`` for the inner tensor of a pjrt tensor,
    ``pjrt`` for a plain tensor a factory made there (``torch.arange(n, device=x.device)``), which the
    compiled function returns as the pjrt tensor itself; None for what is not a tensor."""
    devices = []
    for leaf in _output_leaves(gm.graph)[1]:
        value = leaf.meta.get("val") if isinstance(leaf, fx.Node) else None
        devices.append(value.device.type if isinstance(value, torch.Tensor) else None)
    return devices


def _output_offsets(gm: fx.GraphModule) -> Callable[[Sequence[Any]], list[int]]:
    """The storage offset torch traced for each output of ``gm`` (0 for what is not a tensor), as a function of
    a call's arguments (an offset may depend on a dynamic size: ``x[n // 2:]``). Why: AOTAutograd makes an output
    that is a view of an input (``x[1]``) again from that input with ``as_strided`` and the layout the compiled
    function reports for it, so the results must report the traced offset (see ``outer_of``)."""
    offsets: list[Any] = []
    for leaf in _output_leaves(gm.graph)[1]:
        value = leaf.meta.get("val") if isinstance(leaf, fx.Node) else None
        offsets.append(value.storage_offset() if isinstance(value, torch.Tensor) else 0)
    if all(isinstance(o, int) for o in offsets):
        return lambda args: offsets
    placeholders = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]

    def concrete(args: Sequence[Any]) -> list[int]:
        sizes: dict[Any, int] = {}  # each symbol of a traced size or integer argument: its value in this call
        for traced, a in zip(placeholders, args):
            pairs = zip(traced.shape, a.shape) if isinstance(traced, torch.Tensor) else [(traced, a)]
            for t, n in pairs:
                if isinstance(t, torch.SymInt):
                    sizes[t.node.expr] = n
        return [o if isinstance(o, int) else int(o.node.expr.xreplace(sizes)) for o in offsets]

    return concrete


def _output_leaves(graph: fx.Graph) -> tuple[fx.Node, list[Any]]:
    """The output node of an AOTAutograd graph and what it returns, one entry per output."""
    output = next(n for n in graph.nodes if n.op == "output")
    values = output.args[0]
    return output, list(values) if isinstance(values, (tuple, list)) else [values]


def _as_meta(value: Any, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise NotImplementedError(f"{what} is a {type(value).__name__}, not a tensor (dynamic shapes are not "
                                  "regions yet)")
    if any(not isinstance(s, int) for s in value.shape):
        raise NotImplementedError(f"{what} has a dynamic shape, which regions do not have yet")
    meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=_META)
    offset = value.storage_offset()
    return meta if offset == 0 else meta.as_strided(value.shape, value.stride(), offset)


def _data_of(x: Any) -> Any:
    """The data (TensorData) a region's argument stands for."""
    data = getattr(x, "_pjrt_linked", None)
    if data is not None:
        return data
    return unwrap(_pjrt_tensor(x))


def _pjrt_tensor(x: Any) -> Any:
    """The pjrt tensor a compiled function's argument stands for (a linked meta tensor, or a CPU tensor)."""
    if not isinstance(x, torch.Tensor):
        return x
    data = getattr(x, "_pjrt_linked", None)
    if data is not None:
        return wrap(data)
    if isinstance(x, XLAShardedTensor):
        return x
    if x.device.type == "cpu":
        return x.to(TORCH_DEVICE)
    raise RuntimeError(f"torch.compile on pjrt: an argument on {x.device} is neither a pjrt nor a CPU tensor")


def _run_op_by_op(gm: fx.GraphModule) -> Callable[..., Any]:
    """``gm`` run by the engine op by op (a graph that is not a region); what was traced on the meta device
    (the inner tensors) is made on pjrt."""
    devices = _output_devices(gm)
    offsets = _output_offsets(gm)
    for node in gm.graph.nodes:
        if node.kwargs.get("device") == _META:
            node.kwargs = {**node.kwargs, "device": TORCH_DEVICE}
    gm.recompile()

    def run(args: list[Any]) -> list[Any]:
        tensors = [_pjrt_tensor(a) for a in args]
        traced_offsets = offsets(args)
        args.clear()
        with torch.no_grad():
            results = gm(*tensors)
        return [linked(r._pjrt_data, offset) if device == "meta" else r
                for r, device, offset in zip(results, devices, traced_offsets)]

    run._boxed_call = True  # type: ignore[attr-defined]
    return run
