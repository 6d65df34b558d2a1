"""What a compiled program depends on: the lowering options, the plugin's identity, the graph's structure
(as one key), and the compile options.

Pure functions of their arguments: no cache, no compiling.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ...runtime import CompileOptions
from ..devices import VirtualDevice
from ..lowering import LoweringOptions, ScalarSlot, fetch_attr, op_name, sharding_string
from ..sharding import OpSharding
from ._partitioner import partitioner_for

logger = logging.getLogger(__name__)

__all__ = ["compile_options", "graph_signature", "lowering_options", "plugin_identity", "program_key"]


def lowering_options(vd: VirtualDevice) -> LoweringOptions:
    """What the lowering takes from the active plugin (its gather factor, RNG default and StableHLO
    version) and from torch (the float32 matmul precision)."""
    plugin = vd.plugin
    version = None
    try:
        attrs = vd.client.library.attributes
        v = attrs.get("stablehlo_current_version")
        if v is not None:
            version = ".".join(str(int(p)) for p in v)
    except Exception as exc:  # noqa: BLE001 - a plugin without attributes gets jaxlib's own version
        logger.debug("no StableHLO version from the plugin: %s", exc)
    return LoweringOptions(
        num_partitions=len(vd.devices),
        dense_gather_factor=int(plugin.dense_gather_factor()),
        rng_algorithm=plugin.rng_default(),
        target_version=version,
        matmul_precision=torch.get_float32_matmul_precision(),
        partitioner=partitioner_for(vd) if len(vd.devices) > 1 else "gspmd",
    )


def plugin_identity(vd: VirtualDevice) -> tuple:
    """Everything about the plugin a compiled program depends on."""
    plugin = vd.plugin
    client = vd.client
    return (
        getattr(plugin, "name", None) or type(plugin).__name__,
        getattr(plugin, "distribution", None),
        getattr(plugin, "distribution_version", None),
        getattr(client, "platform_name", None),
        getattr(client, "platform_version", None),
        str(getattr(client.library, "path", "")),
        tuple(vd.device_assignment),
    )


def _const_repr(value: Any) -> Any:
    if isinstance(value, ScalarSlot):
        return ("slot", value.index)  # its value is an input, not part of the program
    if isinstance(value, float):
        return ("f", value.hex()) if math.isfinite(value) else ("f", repr(value))
    if isinstance(value, (bool, int, str, type(None))):
        return value
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    if isinstance(value, OpSharding):
        return value.to_hlo()
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        return ("tensor", str(t.dtype), tuple(t.shape), hashlib.sha1(t.view(torch.uint8).numpy().tobytes()).hexdigest()
                if t.numel() else "")
    return repr(value)


def graph_signature(graph: fx.Graph) -> list:
    """The structure of ``graph``: ops, constants, shapes, dtypes and shardings, with nodes as positions."""
    index: dict[fx.Node, int] = {}
    parts: list = []
    for i, node in enumerate(graph.nodes):
        index[node] = i

        def ref(a: Any) -> Any:
            return ("%", index[a]) if isinstance(a, fx.Node) else _const_repr(a)

        val = node.meta.get("val")
        vals = pytree.tree_leaves(val) if val is not None else []
        meta = tuple((tuple(v.shape), str(v.dtype)) for v in vals if isinstance(v, torch.Tensor))
        sharding = sharding_string(node.meta.get("sharding"))
        if node.op == "get_attr":
            parts.append(("const", _const_repr(fetch_attr(node))))
            continue
        target = op_name(node.target) if node.op == "call_function" else str(node.op)
        args = pytree.tree_map(ref, (node.args, dict(sorted(node.kwargs.items()))))
        if node.op == "placeholder":
            args = None
        parts.append((node.op, target, args, meta, sharding))
    return parts


def program_key(graph: fx.Graph, options: LoweringOptions, identity: tuple, signature: Any = None) -> str:
    """A hex digest naming a compiled program (graph structure + lowering options + plugin).

    ``signature``, when given, stands for the graph's structure (the lazy tracer builds one
    while recording, which is cheaper than walking the graph).
    """
    structure = graph_signature(graph) if signature is None else ("recorded", signature)
    text = repr((structure, options, identity))
    return hashlib.sha256(text.encode()).hexdigest()


def compile_options(num_partitions: int, device_assignment: Sequence[int], shardy: bool = False,
                    pinned_outputs: Sequence[int] = (), num_outputs: int = 0) -> CompileOptions:
    """One replica, ``num_partitions`` partitions on ``device_assignment``, SPMD partitioning on (with Shardy when
    ``shardy``: the module carries ``sdy`` shardings).

    Outputs carry no sharding in the module, so ``allow_spmd_sharding_propagation_to_output``
    lets the partitioner choose their layouts (read back by :func:`read_output_shardings`), except
    ``pinned_outputs`` (of ``num_outputs``): the module fixes their sharding (a donated input's).
    """
    propagate: bool | list[bool] = True
    if pinned_outputs:
        fixed = set(pinned_outputs)
        propagate = [j not in fixed for j in range(num_outputs)]
    return CompileOptions(
        num_replicas=1,
        num_partitions=num_partitions,
        use_spmd_partitioning=num_partitions > 1,
        device_assignment=[list(device_assignment)],
        allow_spmd_sharding_propagation_to_output=propagate,
        use_shardy_partitioner=shardy and num_partitions > 1,
    )
