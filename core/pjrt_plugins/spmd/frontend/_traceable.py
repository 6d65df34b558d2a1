"""The sharding functions users call inside ``torch.compile``'d code: the one module of pjrt_plugins dynamo traces.

Why: dynamo skips pjrt_plugins (its code moves data and calls into plugins), so a call to it from compiled
code breaks the graph. These functions are the exception (``_tracing_tensors.configure_dynamo``): under
dynamo they call only torch operators and the ``IN_GRAPH`` functions, which dynamo leaves opaque in its
graph, and make the caller's tensor hold the result in place (``copy_``, which AOTAutograd turns into a
plain use of the new value). Eagerly they hand over to ``_annotate`` / ``_constraints``. Keep the code on
the compiled path to what dynamo can trace: torch operators, builtins, this module's functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..sharding import Mesh, PartitionSpec
from . import _annotate, _constraints
from ._tracing_tensors import IN_GRAPH
from .tensor import XLAShardedTensor

__all__ = [
    "annotate_custom_sharding",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "optimization_barrier_",
    "shard_as",
]


def _graphable(partition_spec: PartitionSpec) -> tuple[Any, ...]:
    """The spec in a form dynamo passes to an opaque call (``None``, which it cannot, as ``()``)."""
    return tuple(() if p is None else p for p in partition_spec)


def mark_sharding(
    t: torch.Tensor,
    mesh: Mesh | Sequence[int],
    partition_spec: PartitionSpec,
    use_dynamo_custom_op: bool = False,
) -> XLAShardedTensor:
    """Declare how ``t`` is split over ``mesh`` and upload each device's shard (and nothing more).

    ``t`` must be on ``pjrt`` (``t.to("pjrt")``); it is annotated in place and
    returned. ``mesh`` is a :class:`Mesh` or, as in the RFC, a mesh shape over
    all devices. ``partition_spec`` has one entry per dimension of ``t``: a mesh
    axis index, an axis name, a tuple of those (merged, in order) or ``None``.

    Re-marking with the same sharding is a no-op; marking over a replicated
    sharding re-shards; any other existing sharding raises
    :class:`~pjrt_plugins.errors.ShardingConflictError` until
    :func:`clear_sharding`. A pending (lazy) tensor only records the
    annotation; the execution engine applies it.

    Inside a ``torch.compile(backend="pjrt")`` function the call breaks no graph: it becomes a
    sharding constraint of the compiled graph (the ``pjrt::sharding_constraint`` operator), and
    the code after it uses ``t`` constrained. ``use_dynamo_custom_op`` (PyTorch/XLA's switch for
    that before 2.9) is accepted and changes nothing: both ways work, eagerly and compiled.

    Example (8 devices)::

        mesh = xs.Mesh(range(8), (4, 2), ("data", "model"))
        x = xs.mark_sharding(torch.randn(8, 32).to("pjrt"), mesh, ("data", None))
        x.sharding_type      # ShardingType.PARTIAL: 4-way split, replicated over "model"
        linear = torch.nn.Linear(32, 10).to("pjrt")
        xs.mark_sharding(linear.weight, mesh, (None, "model"))   # in place: still the Parameter
        xs.mark_sharding(torch.zeros(8, 4).to("pjrt"), (4, 2), (0, 1))   # the RFC's mesh-shape form
    """
    if _hinted_in_graph(t, mesh, partition_spec):
        return t  # type: ignore[return-value]
    return _annotate.mark_sharding(t, mesh, partition_spec)


def _hinted_in_graph(t: torch.Tensor, mesh: Mesh | Sequence[int], partition_spec: PartitionSpec) -> bool:
    """Inside a ``torch.compile(backend="pjrt")`` graph, record a sharding hint on ``t`` instead (True when done)."""
    if not torch.compiler.is_compiling():
        return False
    hint = IN_GRAPH.get("hint")
    if hint is None:
        return False
    hint(t, mesh, _graphable(partition_spec))
    return True


def mark_sharding_with_gradients(t: torch.Tensor, mesh: Mesh, partition_spec: PartitionSpec) -> torch.Tensor:
    """A new tensor: ``t`` sharded as ``partition_spec`` says on ``mesh``, whose gradient is sharded the same way.

    Unlike :func:`mark_sharding` it does not annotate ``t`` in place: use the result (PyTorch/XLA's
    ``mark_sharding_with_gradients``; :class:`MarkShardingFunction` is the autograd function behind
    it). Raises :class:`~pjrt_plugins.errors.ShardingError` when the spec does not have one entry per
    dimension. Works eagerly and inside ``torch.compile(backend="pjrt")`` functions.

    Example (8 devices)::

        h = xs.mark_sharding_with_gradients(x @ w, mesh, ("data", None))
        h.sharding_spec     # '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}'
        h.sum().backward()  # dL/dh is laid out as h is
    """
    if torch.compiler.is_compiling():
        with_gradients = IN_GRAPH.get("with_gradients")
        if with_gradients is not None:
            return with_gradients(t, mesh, _graphable(partition_spec))  # type: ignore[no-any-return]
    return _constraints.MarkShardingFunction.apply(t, mesh, partition_spec)  # type: ignore[no-any-return]


def annotate_custom_sharding(t: torch.Tensor, mesh: Mesh, partition_spec: PartitionSpec) -> XLAShardedTensor:
    """Constrain the value ``t`` holds from here on to a sharding, keeping the layout of its data (in place).

    Unlike :func:`mark_sharding`, ``t``'s declared sharding and its shards stay as they are: the
    computations that use ``t`` next see it as ``partition_spec`` says (the partitioner reshards
    on the devices). Useful on a tensor already marked with another sharding. Returns ``t``.

    Example (8 devices)::

        xs.mark_sharding(t, mesh, (0, None))                 # t's data: split by rows
        xs.annotate_custom_sharding(t, mesh, (None, 0))      # the next ops use it split by columns
    """
    if _hinted_in_graph(t, mesh, partition_spec):
        return t  # type: ignore[return-value]
    return _constraints.annotate_custom_sharding(t, mesh, partition_spec)


def shard_as(a: Any, b: Any) -> tuple[Any, Any]:
    """Make the tensors of ``a`` and ``b`` be sharded alike, without saying how (JAX's ``shard_alike``).

    ``a`` and ``b`` are pytrees of one structure (a tensor each, or lists, dicts, ... of them,
    with ``None`` at the same places); returns new trees of that structure. The partitioner gives
    each pair of corresponding tensors one sharding, the one it settles on for either. Raises
    ``ValueError`` when the structures differ. PyTorch/XLA needs JAX for it; this does not.

    Example::

        q, k = xs.shard_as(q, k)   # q and k end up split the same way
    """
    if torch.compiler.is_compiling():
        a_flat, a_spec = tree_flatten(a)
        b_flat, b_spec = tree_flatten(b)
        if a_spec != b_spec:
            raise ValueError(f"shard_as needs two trees of the same structure, got {a_spec} and {b_spec}")
        pairs = [(x, y) if x is None or y is None else torch.ops.pjrt.shard_alike(x, y) for x, y in zip(a_flat, b_flat)]
        return tree_unflatten([x for x, _ in pairs], a_spec), tree_unflatten([y for _, y in pairs], b_spec)
    return _constraints.shard_as(a, b)


def optimization_barrier_(tensors: Sequence[torch.Tensor]) -> None:
    """Keep XLA from moving computations across this point for ``tensors`` (in place; PyTorch/XLA's
    ``xm.optimization_barrier_``).

    Each tensor then holds its value passed through StableHLO's ``optimization_barrier``: what
    computes it is not fused with, duplicated into or hoisted over what uses it. Used to keep
    gradient checkpointing from being undone, and to bound fusions for memory. Values are unchanged.

    Example::

        xm.optimization_barrier_([hidden, residual])
    """
    if torch.compiler.is_compiling():
        tensors = list(tensors)
        for tensor, result in zip(tensors, torch.ops.pjrt.optimization_barrier(tensors)):
            tensor.copy_(result)
        return
    _constraints.optimization_barrier_(tensors)
