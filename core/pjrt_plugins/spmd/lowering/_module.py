"""Turn a torch.fx Graph of ATen ops into one StableHLO module and its portable artifact.

Inputs carry sharding argument attributes and marked intermediates a sharding constraint: Shardy's
(``sdy.sharding``, ``sdy.sharding_constraint`` on one ``sdy.mesh``) or GSPMD's (``mhlo.sharding``, a
``@Sharding`` custom call), see ``_sdy``. Outputs carry none, so the partitioner chooses them. Never compiles.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
from jaxlib.mlir import ir, passmanager
from jaxlib.mlir.dialects import func
from jaxlib.mlir.dialects import stablehlo as hlo
from torch.utils import _pytree as pytree

from ...errors import LoweringError, UnsupportedOpError
from ..sharding import OpSharding
from ._collectives import COLLECTIVES, FULL_TO_SHARD, SHARD_TO_FULL, refuse_mark_in_region
from ._decompose import decomposition_for, expand_graph, trace_decomposition, writes_an_input
from ._emitter import Emitter, LoweringOptions, TensorValue
from ._mlir import dense_attr, make_context, tensor_type
from ._sdy import ShardyUnavailable, add_mesh, argument_attrs, plan_program
from ._table import LOWERINGS, RANDOM_OPS, REBINDING_OPS, is_random, op_name, refuse_generator

logger = logging.getLogger(__name__)

#: Ops of manual-sharding regions: their lowerings write GSPMD's annotations, so such programs keep GSPMD.
_MANUAL_OPS = frozenset({FULL_TO_SHARD, SHARD_TO_FULL, *COLLECTIVES})

#: Dtype of the RNG keys: ``uint64[n, 2]``, one row (a ``rng_bit_generator`` state) per random op.
RNG_KEY_DTYPE = torch.uint64


@dataclass
class LoweredModule:
    """A lowered graph: what to compile and how to call it.

    ``input_shardings[i]`` is the HLO sharding string of argument ``i`` (``None`` when
    the module is not partitioned). Random ops start from one row each of a ``uint64[n, 2]``
    table of RNG keys: the placeholder marked ``meta["rng_keys"]`` (the tracer's, its rows
    drawn when the ops were recorded, each node naming its row in ``meta["rng_key"]``), or,
    when the graph has none, an argument appended after the placeholders (``uses_rng``, with
    ``rng_keys`` rows, replicated) that the executor fills at each execution.
    """

    text: str
    artifact: bytes
    target_version: str
    num_partitions: int
    input_shardings: list[str | None]
    output_shapes: list[tuple[int, ...]]
    output_dtypes: list[torch.dtype]
    uses_rng: bool
    #: Random ops lowered (each starts from its own row of RNG keys).
    random_ops: int = 0
    #: Rows of the appended RNG key argument when ``uses_rng``.
    rng_keys: int = 0
    #: Position of the float64 run-time scalar argument among the inputs, or None.
    scalars_input: int | None = None
    #: The annotations the module carries: ``"shardy"`` (compile with the Shardy partitioner) or ``"gspmd"``.
    partitioner: str = "gspmd"
    ops: dict[str, int] = field(default_factory=dict)
    #: Outputs whose sharding the module fixes (a donated input's, see ``_pin_aliased_results``): the partitioner
    #: must keep it rather than choose another.
    pinned_outputs: tuple[int, ...] = ()


def sharding_string(spec: OpSharding | str | None) -> str | None:
    """The HLO sharding string of a OpSharding (a string passes through, None for unannotated)."""
    if spec is None or isinstance(spec, str):
        return spec
    return spec.to_hlo()


def node_value_meta(node: fx.Node) -> Any:
    val = node.meta.get("val")
    if val is None and "tensor_meta" in node.meta:
        tm = node.meta["tensor_meta"]
        return torch.empty(tuple(tm.shape), dtype=tm.dtype, device="meta")
    return val


def target_version(plugin_version: str | None) -> str:
    """The StableHLO version to serialize for: the older of the plugin's and jaxlib's."""
    ours = hlo.get_current_version()
    if not plugin_version:
        return ours
    minimum = hlo.get_minimum_version()
    if hlo.get_smaller_version(plugin_version, minimum) == plugin_version and plugin_version != minimum:
        raise LoweringError(f"the plugin supports StableHLO {plugin_version}, older than the oldest version "
                            f"jaxlib can write ({minimum}); upgrade the plugin")
    return hlo.get_smaller_version(plugin_version, ours)


def lower_graph(graph: fx.Graph, options: LoweringOptions) -> LoweredModule:
    """Lower ``graph`` (placeholders = inputs, output = results) to a StableHLO module.

    Raises :class:`UnsupportedOpError` naming the first operator with neither a lowering
    nor a torch decomposition, and :class:`LoweringError` for inconsistent graphs. A Shardy
    lowering that meets a sharding Shardy cannot express is done again for GSPMD (logged).
    """
    try:
        return _lower_graph(graph, options)
    except ShardyUnavailable as exc:
        logger.info("this program keeps GSPMD shardings: %s", exc)
        return _lower_graph(graph, dataclasses.replace(options, partitioner="gspmd"))


def _lower_graph(graph: fx.Graph, options: LoweringOptions) -> LoweredModule:
    graph = expand_graph(graph)
    version = target_version(options.target_version)
    partitioned = options.num_partitions > 1
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        i32 = ir.IntegerType.get_signless(32)
        module.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(i32, options.num_partitions)
        module.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(i32, 1)

        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        key_table = next((i for i, n in enumerate(placeholders) if n.meta.get("rng_keys")), None)
        rng_rows = _rng_rows(graph, key_table is not None)
        uses_rng = key_table is None and bool(rng_rows)
        arg_metas = [node_value_meta(n) for n in placeholders]
        for n, m in zip(placeholders, arg_metas):
            if not isinstance(m, torch.Tensor):
                raise LoweringError(f"graph input {n.name!r} has no tensor metadata (node.meta['val'])")
        arg_types = [tensor_type(tuple(m.shape), m.dtype) for m in arg_metas]
        shardings: list[str | None] = []
        for n in placeholders:
            s = sharding_string(n.meta.get("sharding"))
            shardings.append((s or "{replicated}") if partitioned else None)
        if uses_rng:
            arg_types.append(tensor_type((len(rng_rows), 2), RNG_KEY_DTYPE))
            shardings.append("{replicated}" if partitioned else None)

        output_node = next(n for n in graph.nodes if n.op == "output")
        out_leaves = pytree.tree_leaves(output_node.args[0])
        for leaf in out_leaves:
            if not isinstance(leaf, fx.Node):
                raise LoweringError(f"graph outputs must be tensors, got {type(leaf).__name__}")

        plan = None
        manual = next((n for n in graph.nodes if n.op == "call_function" and n.target in _MANUAL_OPS), None)
        if partitioned and options.partitioner == "shardy" and manual is not None:
            logger.info("this program keeps GSPMD shardings: it has a manual-sharding region (%s)",
                        op_name(manual.target))
        elif partitioned and options.partitioner == "shardy":
            plan = plan_program(_program_shardings(graph, shardings, arg_types), options.num_partitions,
                                _user_meshes(graph))
        with ir.InsertionPoint(module.body):
            # Result types are known only after the body is built; start with none and fix up.
            fn = func.FuncOp("main", ir.FunctionType.get(arg_types, []))
            fn.attributes["sym_visibility"] = ir.StringAttr.get("public")
            if partitioned:
                ranks = [len(ir.RankedTensorType(t).shape) for t in arg_types]
                fn.arg_attrs = argument_attrs(plan, [s or "{replicated}" for s in shardings], ranks)
            _add_aliases(fn, [n.meta.get("aliasing_output") for n in placeholders], len(arg_types), partitioned)
            block = fn.body.blocks.append(*arg_types)
        if plan is not None:
            add_mesh(module, plan)
        keys_arg = len(placeholders) if uses_rng else key_table
        em = Emitter(options)
        em.sdy_plan = plan
        em.has_manual_regions = partitioned and manual is not None
        if keys_arg is not None:
            keys = block.arguments[keys_arg]
            em.rng_keys = TensorValue(keys, tuple(ir.RankedTensorType(keys.type).shape), RNG_KEY_DTYPE)
        env: dict[fx.Node, Any] = {}
        counts: dict[str, int] = {}
        scalars_input = None
        with ir.InsertionPoint(block):
            for i, n in enumerate(placeholders):
                env[n] = TensorValue(block.arguments[i], tuple(arg_metas[i].shape), arg_metas[i].dtype)
                if n.meta.get("scalar_pool"):
                    em.scalars, scalars_input = env[n], i
            for node in graph.nodes:
                if node.op in ("placeholder", "output"):
                    continue
                em.rng_row = rng_rows.get(node)
                with ir.Location.name(node.name):
                    env[node] = _lower_node(em, node, env, counts, partitioned)
                _rebind(node, env)
            results = [env[leaf] for leaf in out_leaves]
            for leaf, r in zip(out_leaves, results):
                if not isinstance(r, TensorValue):
                    raise LoweringError(f"graph output {leaf.name!r} is not a single tensor")
            func.ReturnOp([r.value for r in results])
        em.erase_unused_merges()
        fn.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(arg_types, [r.value.type for r in results])
        )
        aliases = [n.meta.get("aliasing_output") for n in placeholders]
        pinned = tuple(sorted(a for a in aliases if a is not None)) if partitioned else ()
        if pinned:
            _pin_aliased_results(fn, aliases, len(results))
        _legalize(module)
        if not module.operation.verify():
            raise LoweringError("internal: the lowered module does not verify")
        text = str(module)
        # Shardy's mesh and shardings are no StableHLO: the artifact carries them as they are.
        artifact = hlo.serialize_portable_artifact(module, version, allow_other_dialects=plan is not None)
    if plan is not None and "mhlo.sharding" in text:  # a lowering wrote GSPMD annotations of its own
        raise ShardyUnavailable("a lowering annotated a value with mhlo.sharding")
    logger.debug("lowered %d ops to StableHLO %s (%d bytes)", sum(counts.values()), version, len(artifact))
    return LoweredModule(
        text=text,
        artifact=artifact,
        target_version=version,
        num_partitions=options.num_partitions,
        input_shardings=shardings,
        output_shapes=[r.shape for r in results],
        output_dtypes=[r.dtype for r in results],
        uses_rng=uses_rng,
        random_ops=len(rng_rows),
        rng_keys=len(rng_rows) if uses_rng else 0,
        ops=counts,
        scalars_input=scalars_input,
        partitioner="shardy" if plan is not None else "gspmd",
        pinned_outputs=pinned,
    )


def _program_shardings(graph: fx.Graph, arguments: list[str | None],
                       arg_types: list[ir.RankedTensorType]) -> list[tuple[Any, tuple[int, ...] | None]]:
    """Every sharding the module will name, with the shape it splits: its arguments', its constraints' and the
    replicated pins of lowerings."""
    found: list[tuple[Any, tuple[int, ...] | None]] = [
        (s, tuple(ir.RankedTensorType(t).shape)) for s, t in zip(arguments, arg_types) if s is not None]
    for n in graph.nodes:
        if n.op != "placeholder" and n.meta.get("sharding") is not None:
            val = node_value_meta(n)
            found.append((n.meta["sharding"], tuple(val.shape) if isinstance(val, torch.Tensor) else None))
    found.append(("{replicated}", None))
    return found


def _user_meshes(graph: fx.Graph) -> list[tuple[Any, Any, Any]]:
    """The meshes the inputs were marked on (``meta["mesh"]``: ``(mesh_shape, axis_names, device_ids)``), so the
    Shardy mesh keeps the user's axis names."""
    meshes: list[tuple[Any, Any, Any]] = []
    for n in graph.nodes:
        mesh = n.meta.get("mesh")
        if mesh is not None and mesh not in meshes:
            meshes.append(mesh)
    return meshes


def _rng_rows(graph: fx.Graph, traced: bool) -> dict[fx.Node, int]:
    """The row of RNG keys each random node starts from: the one the tracer gave it (``traced``), else
    one per node in graph order."""
    rows: dict[fx.Node, int] = {}
    for node in graph.nodes:
        if node.op != "call_function" or not is_random(node.target):
            continue
        if not traced:
            rows[node] = len(rows)
        elif "rng_key" in node.meta:
            rows[node] = node.meta["rng_key"]
        elif node.target in RANDOM_OPS:
            raise LoweringError(f"internal: random op {op_name(node.target)} ({node.name}) was not given an RNG "
                                "key when it was recorded")
    return rows


def lowered_decomposition_outputs(op: Any, args: tuple, kwargs: dict) -> Any | None:
    """The outputs (meta tensors) of ``op``'s decomposition on these arguments (meta tensors and constants)
    when that decomposition lowers, else None.

    A tracer may then record ``op`` as one node with these output shapes and leave the
    decomposition to :func:`lower_graph`; an op whose decomposition needs the data, a CPU
    fallback or a captured tensor does not lower (found by lowering it once), and one that
    writes into an argument or draws random numbers is refused (a node of its own has no
    such effect, and takes no key of the RNG stream when it is recorded).
    """
    decomp = decomposition_for(op)
    if decomp is None:
        return None
    try:
        traced = trace_decomposition(op, decomp, args, kwargs).graph
        if writes_an_input(traced):  # native_batch_norm's running stats: one node could not say so
            return None
        if any(n.op == "call_function" and is_random(n.target) for n in traced.nodes):  # dropout
            return None
        graph = expand_graph(traced)
        output = next(n for n in graph.nodes if n.op == "output")
        # Results the op was told not to compute (output_mask) are None: lower the others.
        output.args = (tuple(a for a in pytree.tree_leaves(output.args[0]) if isinstance(a, fx.Node)),)
        lower_graph(graph, LoweringOptions())
    except Exception as exc:  # noqa: BLE001 - any failure: the caller decomposes it piece by piece instead
        logger.debug("%s does not lower whole here: %s: %s", op_name(op), type(exc).__name__, exc)
        return None
    return decomp(*args, **kwargs)  # on meta tensors: the outputs' shapes and structure


def lower_subgraph(em: Emitter, graph: fx.Graph, inputs: list[TensorValue],
                   rng: tuple[TensorValue, dict[fx.Node, int]] | None = None) -> list[TensorValue]:
    """Lower ``graph`` (every call lowerable, see ``expand_graph``) inline, its placeholders bound to ``inputs``;
    returns its results (a torch.compile region, see ``_region``). ``rng``: the key table its random nodes draw
    from, and each one's row."""
    env: dict[fx.Node, Any] = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise LoweringError(f"internal: a region of {len(placeholders)} inputs was given {len(inputs)}")
    env.update(zip(placeholders, inputs))
    outer = em.node, em.rng_keys, em.rng_row
    keys, rows = rng if rng is not None else (None, {})
    counts: dict[str, int] = {}
    partitioned = em.options.num_partitions > 1
    try:
        for node in graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            if rng is not None:
                em.rng_keys, em.rng_row = keys, rows.get(node)
            with ir.Location.name(node.name):
                env[node] = _lower_node(em, node, env, counts, partitioned)
            _rebind(node, env)
    finally:
        em.node, em.rng_keys, em.rng_row = outer
    output = next(n for n in graph.nodes if n.op == "output")
    return [env[leaf] for leaf in pytree.tree_leaves(output.args[0])]


def _lower_node(em: Emitter, node: fx.Node, env: dict[fx.Node, Any], counts: dict[str, int], partitioned: bool) -> Any:
    if node.op == "get_attr":
        value = fetch_attr(node)
        if not isinstance(value, torch.Tensor):
            raise LoweringError(f"graph attribute {node.target!r} is not a tensor")
        c = hlo.constant(dense_attr(value.detach().cpu()))
        return TensorValue(c, tuple(value.shape), value.dtype)
    if node.op != "call_function":
        raise LoweringError(f"unsupported graph node kind {node.op!r} ({node.name})")
    target = node.target
    args: Any = fx.node.map_arg(node.args, lambda n: env[n])
    kwargs: Any = fx.node.map_arg(node.kwargs, lambda n: env[n])
    if target is operator.getitem:
        return args[0][args[1]]
    fn: Callable[..., Any] | None = LOWERINGS.get(target)
    name = op_name(target)
    if fn is None:
        raise UnsupportedOpError(name)
    refuse_generator(target, kwargs)
    out = node_value_meta(node)
    em.node = node
    empty = _empty_result(em, out)
    if empty is not None:  # no values to compute; lowerings need not handle zero-size operands (gathers cannot)
        return empty
    try:
        result = fn(em, out, *args, **kwargs)
    except (UnsupportedOpError, NotImplementedError, ShardyUnavailable):
        raise
    except Exception as exc:
        raise LoweringError(f"lowering {name} (node {node.name}) failed: {type(exc).__name__}: {exc}") from exc
    counts[name] = counts.get(name, 0) + 1
    _check_result(name, node, out, result)
    spec = sharding_string(node.meta.get("sharding"))
    if spec is not None and partitioned and isinstance(result, TensorValue):
        refuse_mark_in_region(em, result, spec)
        result = em.constrain(result, spec)
    return result


def _rebind(node: fx.Node, env: dict[fx.Node, Any]) -> None:
    """After a ``REBINDING_OPS`` node, the nodes that follow read its first argument as the node's value."""
    if node.target in REBINDING_OPS and isinstance(node.args[0], fx.Node):
        env[node.args[0]] = env[node]


def _empty_result(em: Emitter, out: Any) -> Any:
    """The result of an op whose outputs all have zero elements (constants of their shapes), or None."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    if not outs or not all(isinstance(o, torch.Tensor) and o.numel() == 0 and not o.dtype.is_complex for o in outs):
        return None
    values = tuple(em.constant(0, o.dtype, tuple(o.shape)) for o in outs)
    return values if isinstance(out, (tuple, list)) else values[0]


def _check_result(name: str, node: fx.Node, out: Any, result: Any) -> None:
    outs = out if isinstance(out, (tuple, list)) else (out,)
    res = result if isinstance(result, tuple) else (result,)
    for o, r in zip(outs, res):
        if isinstance(o, torch.Tensor) and isinstance(r, TensorValue):
            if tuple(o.shape) != r.shape or o.dtype != r.dtype:
                raise LoweringError(f"internal: lowering of {name} (node {node.name}) produced {r.dtype}{list(r.shape)}, "
                                    f"torch says {o.dtype}{list(o.shape)}")


def fetch_attr(node: fx.Node) -> Any:
    """The value a ``get_attr`` node names, read from the graph's owning module."""
    owner = node.graph.owning_module
    if owner is None:
        raise LoweringError(f"graph attribute {node.target!r} has no owning module to read it from")
    obj: Any = owner
    for part in str(node.target).split("."):
        obj = getattr(obj, part)
    return obj


def _legalize(module: ir.Module) -> None:
    """Rewrite CHLO ops (erf, erf_inv, asin, ...) into StableHLO so the artifact is portable."""
    pm = passmanager.PassManager.parse("builtin.module(func.func(chlo-legalize-to-stablehlo))")
    pm.run(module.operation)


def _add_aliases(fn: Any, aliases: list[int | None], num_args: int, partitioned: bool) -> None:
    """Mark each argument with an ``aliasing_output`` (a donated input, see the trace's ``_donation``) as
    ``tf.aliasing_output = j``, as jax does: XLA then writes output ``j`` into that argument's buffer."""
    if all(a is None for a in aliases):
        return
    i32 = ir.IntegerType.get_signless(32)
    old = list(ir.ArrayAttr(fn.arg_attrs)) if partitioned else []
    dicts = []
    for i in range(num_args):
        entries = {named.name: named.attr for named in ir.DictAttr(old[i])} if i < len(old) else {}
        alias = aliases[i] if i < len(aliases) else None
        if alias is not None:
            entries["tf.aliasing_output"] = ir.IntegerAttr.get(i32, alias)
        dicts.append(ir.DictAttr.get(entries))
    fn.arg_attrs = ir.ArrayAttr.get(dicts)


def _pin_aliased_results(fn: Any, aliases: list[int | None], num_results: int) -> None:
    """Give each result an argument donates its buffer to that argument's sharding as a result attribute
    (``mhlo.sharding`` or ``sdy.sharding``, as jax does for donated outputs): XLA may otherwise lay the result
    out another way than the argument, and then refuses the alias."""
    if all(a is None for a in aliases):
        return
    args = list(ir.ArrayAttr(fn.arg_attrs))
    results: list[dict[str, Any]] = [{} for _ in range(num_results)]
    for i, j in enumerate(aliases):
        if j is None or i >= len(args) or j >= num_results:
            continue
        entries = {named.name: named.attr for named in ir.DictAttr(args[i])}
        for name in ("mhlo.sharding", "sdy.sharding"):
            if name in entries:
                results[j][name] = entries[name]
    fn.attributes["res_attrs"] = ir.ArrayAttr.get([ir.DictAttr.get(r) for r in results])
