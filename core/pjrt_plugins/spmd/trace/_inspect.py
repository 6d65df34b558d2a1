"""The pending graph as StableHLO, lowered without running it (PyTorch/XLA's ``xm.get_stablehlo``).

Why: to see what a step will run, with the shardings the partitioner will get (the ``mhlo.sharding``
of each argument and the ``@Sharding`` constraints), before it runs or without running it. Lowering
does not compile or execute: the pending trace and the tensors stay pending.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from ..devices import virtual_device
from ..execution import lowering_options
from ..lowering import LoweredModule, lower_graph
from ..transport import TensorData, TensorState
from ._materialize import build_graph, live_outputs, output_pins
from ._state import ENGINE

__all__ = ["lower_pending"]


def lower_pending(datas: Sequence[TensorData] | None = None) -> LoweredModule:
    """The lowered module computing ``datas`` (every live pending value when ``None`` or empty).

    Tensors with data (not pending) become arguments the module returns as they are; with no
    pending work and no ``datas`` the module has no arguments and no results.
    """
    options = lowering_options(virtual_device())
    with ENGINE.lock:
        trace = ENGINE.trace
        if trace is not None and (trace.ops == 0 or trace.done):
            trace = None
        holders = live_outputs(trace) if trace is not None else {}
        if datas:
            wanted: dict[int, list[TensorData]] = {}
            for data in datas:
                if data.state is TensorState.LAZY and trace is not None and data.lazy.trace is trace:
                    wanted.setdefault(data.lazy.index, []).append(data)
                elif data.state is TensorState.LAZY:
                    raise ValueError("get_stablehlo: a tensor belongs to a pending graph that already ran or "
                                     "failed; it cannot be lowered again")
            if not wanted:
                return lower_graph(_identity_graph(datas), options)
            holders = wanted
        if trace is None or not holders:
            return lower_graph(_identity_graph(()), options)
        outputs = sorted(holders)
        graph = build_graph(trace, outputs, output_pins(trace, holders, outputs))
    graph.eliminate_dead_code()
    return lower_graph(graph, options)


def _identity_graph(datas: Sequence[TensorData]) -> fx.Graph:
    """A graph returning its arguments: the tensors with data, with their shardings."""
    graph = fx.Graph()
    nodes = []
    for i, data in enumerate(datas):
        node = graph.placeholder(f"in{i}")
        node.meta["val"] = torch.empty(data.shape, dtype=data.dtype, device="meta")
        node.meta["sharding"] = data.sharding
        nodes.append(node)
    graph.output(tuple(nodes))
    return graph
