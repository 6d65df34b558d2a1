"""A region: a whole graph that ``torch.compile`` traced, recorded by the engine as one op (``pjrt::region``).

The ``pjrt`` torch.compile backend (``spmd/_compile.py``) registers each graph AOTAutograd gives it
here and records one ``region(id, inputs)`` op per call, so a cache hit costs one recorded op
instead of one per ATen operator; the lowering inlines the region's nodes into the program being
built, so the regions of a training step (forward, backward) and the eager ops around them
(the optimizer) still become one program.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.fx as fx

from ._emitter import Emitter, TensorValue
from ._module import lower_subgraph
from ._table import is_random, lowers, meta_rule

_library = torch.library.Library("pjrt", "FRAGMENT")  # kept alive: dropping it unregisters the op
_library.define("region(int id, Tensor[] inputs) -> Tensor[]")
REGION = torch.ops.pjrt.region.default


@dataclass(frozen=True)
class Region:
    """A registered graph: every call lowerable (``expand_graph``), node values as meta tensors.

    A region with random ops (dropout) takes one more input after its graph's: the ``uint64[n, 2]``
    RNG key table of its call, one row per random node (``random_rows``), drawn from the device RNG
    stream when the call is recorded, as the engine does for each random op it records.
    """

    graph: fx.Graph
    inputs: tuple[torch.Tensor, ...]  # meta tensors: what each input must be
    outputs: tuple[torch.Tensor, ...]  # meta tensors: what each result is
    random_rows: dict[fx.Node, int]  # the random nodes and their rows of the key table


_regions: dict[int, Region] = {}
_ids = itertools.count()


def register_region(graph: fx.Graph, inputs: tuple[torch.Tensor, ...], outputs: tuple[torch.Tensor, ...]) -> int:
    """Keep ``graph`` for the process; returns the id its ``region`` ops name."""
    region_id = next(_ids)
    random_nodes = [n for n in graph.nodes if n.op == "call_function" and is_random(n.target)]
    _regions[region_id] = Region(graph, inputs, outputs, {n: row for row, n in enumerate(random_nodes)})
    return region_id


def region(region_id: int) -> Region:
    return _regions[region_id]


@meta_rule(REGION)
def _region_meta(region_id: int, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device="meta") for o in _regions[region_id].outputs]


_library.impl("region", _region_meta, "Meta")


@lowers(REGION)
def _region(em: Emitter, out: list[torch.Tensor], region_id: int, inputs: list[TensorValue]) -> list[TensorValue]:
    registered = _regions[region_id]
    if not registered.random_rows:
        return lower_subgraph(em, registered.graph, list(inputs))
    return lower_subgraph(em, registered.graph, list(inputs[:-1]), rng=(inputs[-1], registered.random_rows))
