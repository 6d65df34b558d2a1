"""FSDPv2: fully sharded data parallelism written as shardings (PyTorch/XLA's
``torch_xla.experimental.spmd_fully_sharded_data_parallel``).

Each parameter is split over the mesh's ``"fsdp"`` axis and each wrapped module's output is split
along its batch dimension; the XLA partitioner then inserts the all-gathers and reduce-scatters of
FSDP. Port: ``from torch_xla.experimental.spmd_fully_sharded_data_parallel import
SpmdFullyShardedDataParallel`` becomes ``from pjrt_plugins.spmd.spmd_fully_sharded_data_parallel import ...``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn

from ..errors import ShardingError
from .devices import get_global_mesh
from .frontend import TORCH_DEVICE, apply_backward_optimization_barrier, mark_sharding
from .fsdp_wrap import recursive_wrap
from .sharding import Mesh

logger = logging.getLogger(__name__)

__all__ = ["FSDP_AXIS", "SpmdFullyShardedDataParallel", "parameter_partition_spec"]

#: The mesh axis parameters and batches are split over.
FSDP_AXIS = "fsdp"


def parameter_partition_spec(shape: torch.Size | tuple[int, ...], extra_data_axis: str | None = None,
                             *, shard_maximal: bool = False) -> tuple[Any, ...]:
    """The partition spec FSDPv2 gives a tensor of ``shape``: one dimension over ``"fsdp"``, the rest replicated.

    The dimension is the first one, or with ``shard_maximal`` the (first) largest one,
    which is what parameters get (as in PyTorch/XLA). ``extra_data_axis`` makes it
    ``(extra_data_axis, "fsdp")``. A scalar is replicated: ``()``.

    >>> parameter_partition_spec((64, 128), shard_maximal=True)
    (None, 'fsdp')
    >>> parameter_partition_spec((16, 128), "data")
    (('data', 'fsdp'), None)
    """
    spec: list[Any] = [None] * len(shape)
    if not spec:
        return ()
    dim = max(range(len(shape)), key=lambda d: (shape[d], -d)) if shard_maximal else 0
    spec[dim] = (extra_data_axis, FSDP_AXIS) if extra_data_axis else FSDP_AXIS
    return tuple(spec)


class SpmdFullyShardedDataParallel(nn.Module):
    """Wrap ``module`` for FSDP through shardings: its parameters are split over the mesh's ``"fsdp"`` axis.

    Same name and signature as PyTorch/XLA's FSDPv2:

    - ``mesh``: an :class:`~pjrt_plugins.spmd.Mesh` with an axis named ``"fsdp"``; default
      ``xs.get_global_mesh()`` (``ValueError`` if neither is set).
    - The module is moved to ``pjrt`` if it is not there yet. Every parameter not already
      sharded (a submodule wrapped first, or one you marked yourself) is split over
      ``"fsdp"`` along its largest dimension; the others are left as they are.
    - ``shard_output(output, mesh)``: marks the forward's output. The default splits the
      output's first dimension (the batch) over ``"fsdp"`` (over ``(extra_data_axis,
      "fsdp")`` with ``extra_data_axis``); for a tuple it marks the first element and warns.
    - ``auto_wrap_policy``: wraps the submodules it picks first (see
      :mod:`pjrt_plugins.spmd.fsdp_wrap`), with ``auto_wrapper_callable`` (default this class);
      they share ``mesh`` and ``shard_output``.
    - ``.module`` is the wrapped module; unknown attributes and ``[i]`` are forwarded to it.

    As in PyTorch/XLA, the wrapped module gets optimization barriers on its gradients in the
    backward pass (:func:`~pjrt_plugins.spmd.apply_backward_optimization_barrier`), a hint that
    bounds XLA's fusions for memory; it does not change the numbers.

    Example (8 devices)::

        mesh = xs.Mesh(range(8), (8, 1), ("fsdp", "tensor"))
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
        model = SpmdFullyShardedDataParallel(model, mesh=mesh, auto_wrap_policy=policy)
        x = xs.mark_sharding(batch.to("pjrt"), mesh, ("fsdp", None))
        loss = model(x).mean(); loss.backward(); opt.step(); xs.sync()
    """

    def __init__(
        self,
        module: nn.Module,
        *,
        mesh: Mesh | None = None,
        shard_output: Callable[[Any, Mesh], None] | None = None,
        auto_wrap_policy: Callable[..., bool] | None = None,
        auto_wrapper_callable: Callable[..., nn.Module] | None = None,
        extra_data_axis: str | None = None,
    ) -> None:
        if isinstance(module, SpmdFullyShardedDataParallel):
            raise RuntimeError(
                "the module is already wrapped in SpmdFullyShardedDataParallel; to nest, wrap the inner "
                "submodules first and then their parent (or pass auto_wrap_policy)"
            )
        if not isinstance(module, nn.Module):
            raise TypeError(f"SpmdFullyShardedDataParallel wraps an nn.Module, got {type(module).__name__}")
        if getattr(type(module), "forward", nn.Module.forward) is nn.Module.forward:
            raise RuntimeError(
                f"{type(module).__name__} has no forward method: wrap modules that define one and call the wrapper "
                "itself (not nn.ModuleList / nn.ModuleDict, whose children are called one by one)"
            )
        mesh = _resolve_mesh(mesh, extra_data_axis)
        super().__init__()
        if auto_wrap_policy is not None:
            for name, sub in module.named_modules():
                if isinstance(sub, SpmdFullyShardedDataParallel):
                    raise ValueError(f"{name} is already SpmdFullyShardedDataParallel; with an auto_wrap_policy "
                                     "no submodule may be wrapped beforehand")
            recursive_wrap(module, auto_wrap_policy, auto_wrapper_callable or SpmdFullyShardedDataParallel,
                           ignored_modules=[], ignored_params=[], only_wrap_children=True,
                           mesh=mesh, shard_output=shard_output)
        self._orig_module = module.to(TORCH_DEVICE)
        self._mesh = mesh
        for param in module.parameters():
            if param.sharding_spec != "":  # already sharded: by an inner wrapper or by hand
                continue
            mark_sharding(param, mesh, parameter_partition_spec(param.shape, shard_maximal=True))
        # Barriers on the gradients when the backward pass leaves the module keep XLA from fusing its backward
        # with the others into huge buffers for the gradient reductions (as PyTorch/XLA's FSDPv2 does).
        apply_backward_optimization_barrier(module)
        self._shard_output = shard_output if shard_output is not None else _default_shard_output(extra_data_axis)

    @property
    def module(self) -> nn.Module:
        """The wrapped module (as ``DistributedDataParallel.module``)."""
        return self._orig_module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        output = self.module(*args, **kwargs)
        self._shard_output(output, self._mesh)  # the batch split is what makes the partitioner do FSDP
        return output

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

    def __getitem__(self, key: Any) -> Any:
        return self.module.__getitem__(key)


def _resolve_mesh(mesh: Mesh | None, extra_data_axis: str | None) -> Mesh:
    if mesh is None:
        mesh = get_global_mesh()
        if mesh is None:
            raise ShardingError(
                "SpmdFullyShardedDataParallel needs a mesh: pass mesh=... or call xs.set_global_mesh(mesh) first"
            )
    if not isinstance(mesh, Mesh):
        raise TypeError(f"mesh must be an xs.Mesh, got {type(mesh).__name__}")
    names = mesh.axis_names or ()
    if FSDP_AXIS not in names:
        raise ShardingError(
            f"the mesh must have an axis named {FSDP_AXIS!r} (its axes are {mesh.axis_names}); e.g. "
            f"xs.Mesh(range(n), (n, 1), ('fsdp', 'tensor'))"
        )
    if extra_data_axis and extra_data_axis not in names:
        raise ShardingError(f"The provided {extra_data_axis} axis is not in the mesh (its axes are {names}).")
    return mesh


def _default_shard_output(extra_data_axis: str | None) -> Callable[[Any, Mesh], None]:
    def shard_output(output: Any, mesh: Mesh) -> None:
        target = output
        if isinstance(output, tuple):
            target = output[0] if output and isinstance(output[0], torch.Tensor) else None
            warnings.warn("the output is a tuple: only its first element is sharded; pass shard_output=... "
                          "to shard more", stacklevel=3)
        if not isinstance(target, torch.Tensor):
            raise RuntimeError(
                f"SpmdFullyShardedDataParallel cannot shard an output of type {type(output).__name__}; pass "
                "shard_output=fn, where fn(output, mesh) calls xs.mark_sharding on the output's tensors"
            )
        mark_sharding(target, mesh, parameter_partition_spec(target.shape, extra_data_axis))

    return shard_output
