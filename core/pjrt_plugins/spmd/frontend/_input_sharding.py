"""Input shardings (PyTorch/XLA's ``xs.ShardingSpec``) and moving a CPU batch onto ``pjrt`` with them.

A batch is checked whole against its specs before any of it is uploaded; then each device receives
its shard only. The data loaders (``pjrt_plugins.spmd.parallel_loader``) call this on their
background thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

import torch
from torch.utils import _pytree as pytree

from ...errors import InputShardingError
from ..devices import check_mesh_fits, virtual_device
from ..sharding import Mesh, OpSharding, PartitionSpec
from ..transport import TensorData, upload
from ._annotate import mark_sharding
from ._torch_device import check_torch_device
from .tensor import XLAShardedTensor, wrap

logger = logging.getLogger(__name__)

__all__ = ["InputSharding", "ShardingSpec", "send_cpu_data_to_device"]


@dataclass
class ShardingSpec:
    """How to shard input tensors: a mesh and a partition spec (PyTorch/XLA's ``xs.ShardingSpec``).

    Give it to a loader (``MpDeviceLoader(loader, device, input_sharding=spec)``) or to
    ``send_cpu_data_to_device``. It applies to the tensors whose rank equals
    ``len(partition_spec)``; see :meth:`can_apply`. The mesh and the axes are checked here
    (an unknown axis name raises :class:`~pjrt_plugins.errors.ShardingError` at once).

    ``minibatch=True`` says that each process loads its own part of a global batch, split
    along dimension 0, as on multi-host TPU pods. Here one process drives every device of
    ``pjrt:0``, so a process's part is the whole batch; the flag keeps PyTorch/XLA's check
    that the batch size divides by the process's device count, so multi-host code runs
    unchanged.

    Example (8 devices)::

        mesh = xs.Mesh(range(8), (8,), ("data",))
        spec = xs.ShardingSpec(mesh, ("data", None))   # batch over "data"
        spec.can_apply(torch.zeros(16, 4))             # True: rank 2
    """

    mesh: Mesh
    partition_spec: PartitionSpec
    minibatch: bool | None = False

    _op_sharding: OpSharding = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.mesh, Mesh):
            raise TypeError(f"ShardingSpec needs an xs.Mesh, got {type(self.mesh).__name__}")
        self._op_sharding = self.mesh.get_op_sharding(self.partition_spec)  # checks the axes
        self.minibatch = bool(self.minibatch)

    def can_apply(self, t: torch.Tensor) -> bool:
        """Whether this spec fits ``t``: one partition-spec entry per dimension."""
        return len(t.shape) == len(self.partition_spec)

    def xla_spec(self, t: torch.Tensor) -> OpSharding | None:
        """The HLO sharding this spec gives ``t`` (an :class:`OpSharding`), or ``None`` if it does not apply."""
        if not self.can_apply(t):
            return None
        return self._op_sharding

    def apply(self, t: torch.Tensor) -> XLAShardedTensor:
        """``mark_sharding(t, self.mesh, self.partition_spec)`` for a tensor already on ``pjrt``."""
        return mark_sharding(t, self.mesh, self.partition_spec)


#: What the loaders accept as ``input_sharding``: one spec for every tensor, or one per key of a dict batch.
InputSharding = Union[ShardingSpec, Mapping[Any, ShardingSpec], None]


def _check_input_sharding(input_sharding: InputSharding) -> None:
    specs = input_sharding.values() if isinstance(input_sharding, Mapping) else [input_sharding]
    for spec in specs:
        if spec is not None and not isinstance(spec, ShardingSpec):
            raise TypeError(
                "input_sharding must be an xs.ShardingSpec or a dict of them (one per batch key), got "
                f"{type(spec).__name__}; build one with xs.ShardingSpec(mesh, partition_spec)"
            )


def check_input_sharding(input_sharding: InputSharding) -> None:
    """Raise unless ``input_sharding`` is ``None``, a :class:`ShardingSpec` or a dict of them whose meshes fit
    the virtual device (opens the plugin's client). Loaders call this when they are made."""
    _check_input_sharding(input_sharding)
    specs = input_sharding.values() if isinstance(input_sharding, Mapping) else [input_sharding]
    vd = virtual_device()
    for spec in specs:
        if spec is not None:
            check_mesh_fits(spec.mesh, vd)


def _is_cpu_tensor(value: Any) -> bool:
    return type(value) is torch.Tensor and value.device.type == "cpu"


def _plan_leaf(tensor: torch.Tensor, spec: ShardingSpec | None, where: str, strict: bool,
               addressable: int) -> ShardingSpec | None:
    """The spec ``tensor`` is uploaded with (``None``: replicated), after checking that it fits."""
    if spec is None:
        return None
    if not spec.can_apply(tensor):
        if not strict:
            return None  # PyTorch/XLA's rule for one spec: tensors of another rank are replicated
        raise InputShardingError(
            f"input_sharding{where} has {len(spec.partition_spec)} partition-spec entries but batch{where} has "
            f"shape {tuple(tensor.shape)} (rank {tensor.dim()}); give one entry per tensor dimension"
        )
    if spec.minibatch and tensor.dim() > 0 and tensor.shape[0] % addressable != 0:
        raise InputShardingError(
            f"with minibatch=True the per-process batch size must divide by the process's {addressable} devices; "
            f"batch{where} has shape {tuple(tensor.shape)}"
        )
    return spec


def send_cpu_data_to_device(datas: Any, device: Any, input_sharding: InputSharding = None) -> Any:
    """Move the CPU tensors of ``datas`` (a tensor, or nested lists / tuples / dicts) onto ``pjrt``, sharded.

    PyTorch/XLA's ``xm.send_cpu_data_to_device``: a single tensor comes back as a one-item
    list. ``input_sharding`` is one :class:`ShardingSpec` (applied to every tensor it fits,
    the others are replicated) or a dict of them keyed like a dict batch (each tensor of a
    key gets its spec, which must fit it). The whole batch is checked before anything is
    uploaded: a missing key, a spec of the wrong rank or a mesh that does not cover the
    devices raises :class:`~pjrt_plugins.errors.InputShardingError` /
    :class:`~pjrt_plugins.errors.ShardingError` with nothing sent. Then each device receives
    its shard only (a tensor without a spec goes to every device).
    """
    check_torch_device(device)
    _check_input_sharding(input_sharding)
    if isinstance(input_sharding, Mapping) and not isinstance(datas, Mapping):
        raise InputShardingError(
            f"input_sharding is a dict (keys {sorted(map(str, input_sharding))}), so each batch must be a dict "
            f"too; got {type(datas).__name__}"
        )
    if type(datas) is torch.Tensor:
        datas = [datas]
    vd = virtual_device()
    addressable = len(vd.client.addressable_devices) if vd.spmd else 1
    plan: list[tuple[int, ShardingSpec | None]] = []
    leaves: list[Any]
    if isinstance(input_sharding, Mapping):
        leaves, spec_tree = pytree.tree_flatten(datas)
        keys = [_top_key(path) for path, _ in pytree.tree_flatten_with_path(datas)[0]]
        missing = sorted({str(k) for k, leaf in zip(keys, leaves) if _is_cpu_tensor(leaf) and k not in input_sharding})
        if missing:
            raise InputShardingError(
                f"the batch has tensors under keys {missing} that input_sharding does not name; give each key a "
                f"ShardingSpec (input_sharding names {sorted(map(str, input_sharding))})"
            )
        for i, (key, leaf) in enumerate(zip(keys, leaves)):
            if _is_cpu_tensor(leaf):
                plan.append((i, _plan_leaf(leaf, input_sharding[key], f"[{key!r}]", True, addressable)))
    else:
        leaves, spec_tree = pytree.tree_flatten(datas)
        for i, leaf in enumerate(leaves):
            if _is_cpu_tensor(leaf):
                plan.append((i, _plan_leaf(leaf, input_sharding, "", False, addressable)))
    for _, spec in plan:  # every check before the first upload
        if spec is not None:
            check_mesh_fits(spec.mesh, vd)
            spec.mesh.get_op_sharding(spec.partition_spec)
    out = list(leaves)
    for i, spec in plan:
        out[i] = _upload(leaves[i], spec)
    return pytree.tree_unflatten(out, spec_tree)


def _top_key(path: Sequence[Any]) -> Any:
    entry = path[0]
    return getattr(entry, "key", getattr(entry, "idx", entry))


def _upload(tensor: torch.Tensor, spec: ShardingSpec | None) -> XLAShardedTensor:
    data = TensorData.from_host(tensor)
    result = wrap(data)
    if spec is None:
        upload(data, None)  # replicated: every device gets the whole tensor
    else:
        mark_sharding(result, spec.mesh, spec.partition_spec)
    return result

