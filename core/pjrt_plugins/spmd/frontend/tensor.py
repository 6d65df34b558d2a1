"""XLAShardedTensor: the torch.Tensor subclass on ``pjrt:0``, its shards, and the operators of its data model.

Handles only the data-model operators itself (aliases, copies to and from the
CPU, filling deferred host data); every other operator goes to the engine
(``_engine.dispatch``, reached through ``_seam``). Never computes on the devices.
"""

from __future__ import annotations

import copy as _copy
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import Any

import torch
from torch.optim import optimizer as torch_optimizer
from torch.utils import _foreach_utils

from ...errors import ShardingError, VirtualDeviceError
from ..devices import virtual_device
from ..sharding import Mesh, OpSharding, ShardingType
from ..transport import TensorData, TensorState, download_shard, gather, host_empty, upload, upload_shards
from . import _seam
from ._torch_device import DEVICE_TYPE, TORCH_DEVICE, check_torch_device
from ._hooks import guard_hook, hook_errors_raised
from ._tracing_tensors import EMPTY_STORAGE_BYTES, inner_of, is_tracing, outer_of, trace_dispatch, tracing_tensors_alive

logger = logging.getLogger(__name__)

__all__ = ["XLAShard", "XLAShardedTensor", "copy_into", "describe", "materialize", "to_cpu", "unwrap", "wrap"]

aten = torch.ops.aten
_META = torch.device("meta")


@dataclass
class XLAShard:
    """One device's piece of an :class:`XLAShardedTensor`.

    ``data`` is the (zero-padded) shard copied to the CPU, ``indices`` the
    slices of the global tensor it covers, a list of ``slice(start, stop, 1)``
    as in PyTorch/XLA (``...`` for a full replica), ``shard_device`` the
    physical device (e.g. ``'cpu:3'``) and ``replica_id`` 0 for tiled shards,
    the position in the replication group for partially replicated ones and
    the device ordinal for replicated ones. Index a tensor with
    ``t[tuple(shard.indices)]``.
    """

    data: torch.Tensor
    indices: list[slice] | EllipsisType
    shard_device: str
    replica_id: int

    def _unpadded_index(self) -> tuple[slice, ...] | EllipsisType:
        if self.indices is ...:
            return ...
        return tuple(slice(0, s.stop - s.start) for s in self.indices)

    @property
    def unpadded_data(self) -> torch.Tensor:
        """``data`` without the zero padding of a short tail shard."""
        return self.data[self._unpadded_index()]

    @unpadded_data.setter
    def unpadded_data(self, value: torch.Tensor) -> None:
        self.data[self._unpadded_index()] = value


_make_wrapper = torch.Tensor._make_wrapper_subclass


class XLAShardedTensor(torch.Tensor):
    """A tensor on the virtual device ``pjrt:0`` that behaves like the unpartitioned tensor.

    Every tensor on ``pjrt`` is one of these, sharded or not: ``t.to("pjrt")``,
    ``module.to("pjrt")`` and ``torch.zeros(..., device="pjrt")`` make them, and
    :func:`mark_sharding` annotates them in place. Shape, dtype and ``repr``
    are the global tensor's; ``.cpu()`` gathers it.

    Example (8 devices)::

        import torch, pjrt_plugins.spmd as xs
        t = torch.arange(16.).reshape(4, 4).to("pjrt")          # deferred: nothing uploaded
        xs.mark_sharding(t, xs.Mesh(range(8), (2, 4)), (0, 1))  # one 2x1 shard per device
        t.sharding_spec              # '{devices=[2,4]0,1,2,3,4,5,6,7}'
        t.local_shards[5].indices    # [slice(2, 4, 1), slice(1, 2, 1)]
        t.cpu()                      # the whole 4x4 tensor again
    """

    _pjrt_data: TensorData

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    # Hooks run guarded, and backward() raises their errors (see _hooks: an error would abort the process).
    def register_hook(self, hook: Any) -> Any:
        return super().register_hook(guard_hook(hook))

    def register_post_accumulate_grad_hook(self, hook: Any) -> Any:
        return super().register_post_accumulate_grad_hook(guard_hook(hook))

    def backward(self, *args: Any, **kwargs: Any) -> None:
        with hook_errors_raised():
            super().backward(*args, **kwargs)

    @staticmethod
    def __new__(cls, elem: Any, mesh_shape: Sequence[int] | None = None, partition_spec: Sequence[Any] | None = None,
                *, requires_grad: bool = False) -> XLAShardedTensor:
        # mesh_shape / partition_spec: PyTorch/XLA's descriptive metadata (see wrap_as_sharded_tensor).
        if isinstance(elem, TensorData):
            data = elem
        elif isinstance(elem, XLAShardedTensor):
            data = elem._pjrt_data
        elif isinstance(elem, torch.Tensor):
            if elem.device.type != "cpu":
                raise VirtualDeviceError(f"XLAShardedTensor wraps CPU or pjrt tensors, not one on {elem.device}")
            data = TensorData.from_host(elem)
        else:
            raise TypeError(f"XLAShardedTensor wraps a tensor, got {type(elem).__name__}")
        result = wrap(data, requires_grad, cls)
        if mesh_shape is not None or partition_spec is not None:
            describe(result, mesh_shape, partition_spec)
        return result

    # -- what PyTorch/XLA users read -------------------------------------------------------

    @property
    def sharding(self) -> OpSharding | None:
        """The declared sharding as a :class:`OpSharding`, or ``None``."""
        return self._pjrt_data.annotation

    @property
    def sharding_spec(self) -> str:
        """The HLO sharding string, e.g. ``'{devices=[2,4]0,1,2,3,4,5,6,7}'``; ``''`` if none is declared."""
        spec = self._pjrt_data.annotation
        return spec.to_hlo() if spec is not None else ""

    @property
    def sharding_type(self) -> ShardingType | None:
        """REPLICATED, TILED, PARTIAL, MAXIMAL or MANUAL (a :class:`ShardingType`), or ``None`` if none is declared."""
        spec = self._pjrt_data.annotation
        return spec.type if spec is not None else None

    @property
    def mesh_shape(self) -> tuple[int, ...] | None:
        """Shape of the mesh given to :func:`mark_sharding` (or ``wrap_as_sharded_tensor``), or ``None``."""
        mark = self._pjrt_data.mark
        return mark[0].mesh_shape if mark and mark[0] is not None else None

    @property
    def partition_spec(self) -> tuple | None:
        """The partition spec given to :func:`mark_sharding` (or ``wrap_as_sharded_tensor``), or ``None``."""
        mark = self._pjrt_data.mark
        return mark[1] if mark else None

    @property
    def placements(self) -> tuple:
        """DTensor's view of the declared sharding: per mesh dimension, ``Shard(dim)`` or ``Replicate()``.

        Relative to the DeviceMesh the tensor was distributed on (``xla_distribute_tensor``, torch's
        ``distribute_tensor``, ``redistribute``), else to the :class:`Mesh` given to :func:`mark_sharding`.
        Raises :class:`~pjrt_plugins.errors.PlacementError` (a ``ValueError``) for a tensor no mesh was
        given for. Loads ``torch.distributed.tensor`` on first use.

        Example (8 devices)::

            t = xs.mark_sharding(torch.zeros(8, 4).to("pjrt"), xs.Mesh(range(8), (2, 4)), (None, 0))
            t.placements      # (Shard(dim=1), Replicate())
        """
        return _seam.placements().placements_of(self)  # type: ignore[no-any-return]

    def redistribute(self, device_mesh: Any = None, placements: Sequence[Any] | None = None, *,
                     async_op: bool = False) -> XLAShardedTensor:
        """A new tensor with the same values laid out by ``placements`` on ``device_mesh`` (this one keeps its layout).

        ``device_mesh`` is a ``pjrt`` DeviceMesh or an :class:`Mesh` (default: the one this tensor was
        distributed or marked on); ``placements`` has one ``Shard(dim)`` or ``Replicate()`` per mesh
        dimension (``Partial`` raises :class:`~pjrt_plugins.errors.UnsupportedPlacementError`, a
        ``NotImplementedError``). Differentiable: the gradient is laid out like this tensor.

        ``async_op=False`` returns the result computed in its new layout (it runs the pending graph up to
        it, as DTensor's blocking collective would); ``async_op=True`` records the move in the pending
        graph, to run with the next program (what torch's parallel styles ask for inside a step).

        Example (8 devices)::

            mesh = xs.Mesh(range(8), (8,))
            t = xs.mark_sharding(torch.randn(8, 16).to("pjrt"), mesh, (0, None))
            u = t.redistribute(mesh, [Shard(1)])     # from torch.distributed.tensor import Shard
            u.partition_spec, t.partition_spec     # ((None, 0), (0, None))
        """
        return _seam.placements().redistribute(self, device_mesh, placements, async_op)  # type: ignore[no-any-return]

    @property
    def global_tensor(self) -> torch.Tensor:
        """The whole tensor, gathered to a new CPU tensor."""
        return to_cpu(self)

    @property
    def local_shards(self) -> list[XLAShard]:
        """Each device's shard, copied to the CPU, in device order (uploads deferred data first)."""
        data = self._pjrt_data
        materialize([data])
        if data.state is TensorState.HOST:
            upload(data, data.annotation)
        vd = virtual_device()
        assert data.sharding is not None
        return [
            XLAShard(download_shard(data, s.device), _listed(s.indices), vd.device_name(s.device), s.replica_id)
            for s in data.sharding.shards(data.shape, vd.device_ids)
        ]

    def load_local_shards_(self, shards: Sequence[XLAShard]) -> None:
        """Replace this tensor's value by the given shards, one per device, keeping its sharding (in place).

        ``shards`` are :class:`XLAShard` s (only ``data`` and ``shard_device`` are read),
        one for each device, each of the padded shard shape, as ``local_shards`` returns
        them. The tensor must carry a tiled sharding (``mark_sharding`` it first) or be a
        value of a manual-sharding region (``{manual}``: each device gets a value of the
        tensor's whole shape); a replicated one is loaded with ``copy_``, as in PyTorch/XLA. Each device
        receives only its shard. Raises :class:`~pjrt_plugins.errors.ShardingError`
        (a ``ValueError``) naming what does not fit.

        Example (8 devices)::

            t = xs.mark_sharding(torch.zeros(16, 4).to("pjrt"), mesh, (0, None))
            shards = t.local_shards
            for s in shards:
                s.data += 1
            t.load_local_shards_(shards)   # t.cpu() is all ones
        """
        data = unwrap(self)
        spec = data.annotation
        if spec is None or spec.type not in (ShardingType.TILED, ShardingType.PARTIAL, ShardingType.MANUAL):
            raise ShardingError(
                "load_local_shards_ needs a tensor with a tiled or manual sharding (mark_sharding it first); it has "
                + ("none" if spec is None else f"{spec}: load a replicated tensor with copy_")
            )
        if data.view_of is not None:
            raise ShardingError("load_local_shards_ cannot load into a view; load into the tensor it views")
        vd = virtual_device()
        ordinals = {vd.device_name(d): d for d in vd.device_ids}
        pieces: list[torch.Tensor | None] = [None] * vd.num_devices
        for shard in shards:
            ordinal = ordinals.get(str(shard.shard_device))
            if ordinal is None:
                raise ShardingError(
                    f"shard device {shard.shard_device!r} is not a device of {TORCH_DEVICE}; the devices are "
                    f"{sorted(ordinals, key=ordinals.__getitem__)}"
                )
            if pieces[ordinal] is not None:
                raise ShardingError(f"two shards are given for device {shard.shard_device!r}")
            pieces[ordinal] = shard.data
        missing = [vd.device_name(d) for d, piece in enumerate(pieces) if piece is None]
        if missing:
            raise ShardingError(f"shards must be given for every device; missing {missing}")
        buffers = upload_shards(pieces, data.shape, data.dtype, spec, vd)  # type: ignore[arg-type]
        materialize([data])  # a pending value is replaced: run what it depends on first
        data.set_device(buffers, spec, vd.generation)
        _contents_changed(data)

    # -- behaving like a plain tensor --------------------------------------------------------

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        data = self._pjrt_data
        if data is None:
            return f"XLAShardedTensor(<traced by torch.compile>, size={tuple(self.shape)}, dtype={self.dtype})"
        if torch._C._len_torch_dispatch_stack() > 0:  # dynamo formats errors under its fake mode: no download
            return f"XLAShardedTensor(<pjrt values>, size={tuple(self.shape)}, dtype={self.dtype})"
        materialize([data])
        if data.state is TensorState.DEVICE and data.sharding is not None and data.sharding.is_manual:
            # A value of a manual-sharding region: one per device, no global value to show.
            inner = f"<one value per device: see local_shards>, size={tuple(self.shape)}, dtype={self.dtype}"
        else:
            text = repr(to_cpu(self))
            inner = text[len("tensor(") : -1] if text.startswith("tensor(") and text.endswith(")") else text
        extras = [f"device='{TORCH_DEVICE}'"]
        if data.annotation is not None:
            extras.append(f"sharding='{data.annotation}'")
        if self.grad_fn is not None:
            extras.append(f"grad_fn=<{type(self.grad_fn).__name__}>")
        elif self.requires_grad:
            extras.append("requires_grad=True")
        return f"XLAShardedTensor({inner}, {', '.join(extras)})"

    def tolist(self) -> Any:
        """Gather and convert to nested Python lists (as for CPU tensors)."""
        return to_cpu(self).tolist()

    @property
    def data(self) -> torch.Tensor:  # type: ignore[override]
        return torch._C.TensorBase.data.__get__(self)  # type: ignore[attr-defined]

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        # torch's setter swaps the C++ tensor but not our Python attribute; keep both in step.
        if not isinstance(value, XLAShardedTensor):
            raise VirtualDeviceError(
                f"cannot set .data of a pjrt tensor to a tensor on {value.device}; move it with .to('pjrt') first"
            )
        torch._C.TensorBase.data.__set__(self, value)  # type: ignore[attr-defined]
        self._pjrt_data = value._pjrt_data

    def __deepcopy__(self, memo: dict) -> XLAShardedTensor:
        if id(self) in memo:
            return memo[id(self)]
        data = self._pjrt_data
        materialize([data])
        new = TensorData.from_host(gather(data), copy=False)
        new.annotation, new.mark = data.annotation, data.mark
        result = wrap(new, requires_grad=self.requires_grad)
        for key, value in self.__dict__.items():
            if key not in ("_pjrt_data", "_pjrt_inner_tensor"):  # the inner tensor stands for the old data
                setattr(result, key, _copy.deepcopy(value, memo))
        memo[id(self)] = result
        return result

    def __reduce_ex__(self, protocol: Any) -> tuple:
        # torch.save / pickle: the gathered value, restored as deferred pjrt data (declared
        # shardings are not kept: mark again after loading). torch's own rebuild function,
        # so torch.load(weights_only=True) accepts it.
        rebuild = torch._utils._rebuild_device_tensor_from_cpu_tensor  # type: ignore[attr-defined]
        return (rebuild, (to_cpu(self), self.dtype, str(TORCH_DEVICE), self.requires_grad))

    # -- torch's wrapper-subclass protocol ------------------------------------------------------
    # With it, Module.to / _apply moves a Parameter by swapping its contents in place
    # (torch.utils.swap_tensors) instead of making a new Parameter per module, so parameters
    # tied across modules (a GPT's embedding and LM head) stay one Parameter, as on CUDA.
    # torch.compile traces the inner tensor: a meta tensor linked to this one (see _tracing_tensors).

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_pjrt_inner"], None

    @property
    def _pjrt_inner(self) -> torch.Tensor:
        return inner_of(self)

    @staticmethod
    def __tensor_unflatten__(inner: dict, meta: Any, outer_size: Any, outer_stride: Any) -> XLAShardedTensor:
        return outer_of(XLAShardedTensor, inner["_pjrt_inner"], outer_size, outer_stride)  # type: ignore[no-any-return]

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        try:
            if kwargs is None:
                kwargs = {}
            if tracing_tensors_alive and is_tracing(args, kwargs):  # torch.compile's tracing tensors
                return trace_dispatch(cls, func, args, kwargs)
            handler = _HANDLERS_BY_ID.get(id(func))  # by id: an OpOverload's __hash__ is Python code
            if handler is not None:
                result = handler(func, args, kwargs)
                if result is not NotImplemented:
                    return result
            return _seam.engine().dispatch(func, types, args, kwargs)  # _route_to_engine, one call less per op
        except BaseException as error:
            if getattr(error, "_pjrt_no_device", False) and torch._C._current_graph_task_id() == -1:
                # No pjrt device (PJRT_DEVICE=garbage, no GPU): the devices layer's one-line error, without the
                # engine's frames between the user's op and the device's creation.
                raise error.with_traceback(None) from None
            if torch._C._current_graph_task_id() == -1:
                raise
            if not getattr(error, "_pjrt_op_noted", False) and hasattr(error, "add_note"):  # Python 3.11+
                error.add_note(f"(raised by {func} in autograd's backward pass on the pjrt device)")
                error._pjrt_op_noted = True  # type: ignore[attr-defined]
            return _ErrorForAutograd(error)


class _ErrorForAutograd:
    """An error of ``__torch_dispatch__`` inside autograd's backward, handed to torch already fetched.

    Why: torch raises a ``__torch_dispatch__`` error in C++ with the Python error still set.
    Autograd's engine unwinds through a stream guard of the ``pjrt`` device, and torch's
    Python device guard calls into Python from that guard's ``noexcept`` destructor; with an
    error set that call fails and the process aborts (``terminate called without an active
    exception``). Returning this object instead makes torch read it as the op's result: every
    way torch converts a result (``str()`` of a non-tensor, ``len()`` / iteration of a
    sequence) raises the original error through pybind11, which fetches it before any C++
    unwinds. Autograd then re-raises it unchanged in the thread that called ``backward()``,
    as it does for errors in a Python ``autograd.Function``. An op with no results cannot
    carry it: torch raises its own RuntimeError naming the op instead.
    """

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def _raise(self, *args: Any) -> Any:
        raise self.error

    __str__ = __len__ = __iter__ = __getitem__ = _raise

    def __repr__(self) -> str:
        return f"<error for autograd: {self.error!r}>"


def _join_foreach_types() -> None:
    """Let torch's optimizers take their foreach path on pjrt tensors, as torch.distributed.tensor does for DTensor.

    torch checks the exact type (``type(p) in _foreach_supported_types``); on the foreach path an
    optimizer step is a handful of ops per parameter *list*, each recorded as one op.
    """
    for types in (torch_optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if XLAShardedTensor not in types:
            types.append(XLAShardedTensor)  # type: ignore[arg-type]


_join_foreach_types()


def _listed(indices: Any) -> list[slice] | EllipsisType:
    """Shard indices as PyTorch/XLA reports them: a list of ``slice(start, stop, 1)``, or ``...``."""
    if indices is ...:
        return ...
    return [slice(s.start, s.stop, 1) for s in indices]


# -- wrapping ------------------------------------------------------------------------------


def wrap(data: TensorData, requires_grad: bool = False, cls: type | None = None) -> XLAShardedTensor:
    """A new wrapper (tensor object, of ``cls``, a subclass) for ``data``; wrappers of the same data alias each other.

    Every traced op makes one. No strides given: torch makes the contiguous ones (in C, cheaper than passing
    them), which is what a pjrt tensor reports.
    """
    if 0 in data.shape:  # see EMPTY_STORAGE_BYTES
        r: Any = _make_wrapper(cls or XLAShardedTensor, data.shape, dtype=data.dtype, device=TORCH_DEVICE,
                               requires_grad=requires_grad, storage_size=EMPTY_STORAGE_BYTES)
    else:
        r = _make_wrapper(cls or XLAShardedTensor, data.shape, dtype=data.dtype, device=TORCH_DEVICE,
                          requires_grad=requires_grad)
    r._pjrt_data = data
    return r


def describe(tensor: XLAShardedTensor, mesh_shape: Sequence[int] | None, partition_spec: Sequence[Any] | None) -> None:
    """Record ``mesh_shape`` / ``partition_spec`` as the tensor's description only (its sharding is unchanged)."""
    data = unwrap(tensor)
    mesh: Any
    spec: Any
    mesh, spec = data.mark if data.mark is not None else (None, None)
    if mesh_shape is not None:
        shape = tuple(int(s) for s in mesh_shape)
        if mesh is None or tuple(mesh.mesh_shape) != shape:
            mesh = Mesh(range(math.prod(shape)), shape)
    if partition_spec is not None:
        spec = tuple(partition_spec)
    data.mark = (mesh, spec)


def unwrap(tensor: torch.Tensor) -> TensorData:
    """The :class:`TensorData` behind a pjrt tensor; raises VirtualDeviceError for other tensors."""
    if isinstance(tensor, XLAShardedTensor):
        data = tensor._pjrt_data
        if data is None:
            raise RuntimeError(
                "this pjrt tensor is being traced by torch.compile, which cannot run pjrt_plugins.spmd functions "
                "such as mark_sharding inside a compiled function: call them before or after it")
        return data
    device = getattr(tensor, "device", None)
    raise VirtualDeviceError(
        f"expected a tensor on the virtual device {TORCH_DEVICE}, got "
        f"{type(tensor).__name__} on {device}; move it with .to('pjrt') or xs.to_device(...)"
    )


# -- materialization -------------------------------------------------------------------------


def materialize(datas: Sequence[TensorData]) -> None:
    """Turn LAZY ``datas`` into DEVICE state through the execution engine (no-op for the others)."""
    pending = [d for d in datas if d.state is TensorState.LAZY]
    if pending:  # pending values exist only once the engine does
        _seam.engine().materialize(pending)


def to_cpu(tensor: XLAShardedTensor) -> torch.Tensor:
    """The global value of a pjrt tensor as a new CPU tensor (runs pending work, gathers shards; a small value
    that only moves data of device values, such as ``generate``'s final ``cat``, is put together on the host)."""
    data = unwrap(tensor)
    if data.state is TensorState.LAZY and not _seam.engine().read_on_host(data):
        materialize([data])
    return gather(data)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` for a pjrt ``dst`` and a CPU ``src``: ``dst`` becomes deferred host data."""
    data = unwrap(dst)
    if isinstance(src, XLAShardedTensor):
        sdata = src._pjrt_data
        if sdata.state is not TensorState.HOST:
            return _route_to_engine(aten.copy_.default, (type(dst),), (dst, src), {})
        assert sdata.host is not None
        src = sdata.host
    if src.device.type != "cpu":
        raise VirtualDeviceError(f"copy into a pjrt tensor from {src.device}: copy to the CPU first")
    host = host_empty(data.shape, data.dtype)
    host.copy_(src)
    data.set_host(host, copy=False)
    _contents_changed(data)
    return dst


def _contents_changed(data: TensorData) -> None:
    """``data`` was written on the host: its live views see the write (the engine derives them again)."""
    if data.views:
        engine = _seam.loaded_engine()
        if engine is not None:
            engine.refresh_views(data)


# -- data-model operators ---------------------------------------------------------------------

Handler = Callable[[Any, tuple, dict], Any]
_HANDLERS: dict[Any, Handler] = {}
#: id(op) -> handler (the ops are kept alive by ``_HANDLERS``, so their ids stay theirs).
_HANDLERS_BY_ID: dict[int, Handler] = {}


def _handles(*ops: Any) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for op in ops:
            _HANDLERS[op] = fn
            _HANDLERS_BY_ID[id(op)] = fn
        return fn

    return register


@_handles(aten.detach.default, aten.alias.default)
def _alias(func: Any, args: tuple, kwargs: dict) -> Any:
    return wrap(unwrap(args[0]))


@_handles(aten._fused_adam_.default, aten._fused_adam_.tensor_lr, aten._fused_adamw_.default,
          aten._fused_adamw_.tensor_lr, aten._fused_sgd_.default, aten._fused_sgd_.tensor_lr)
def _fused_optimizer_step(func: Any, args: tuple, kwargs: dict) -> Any:
    return _seam.engine().fused_step(func, args, kwargs)


@_handles(aten.lift_fresh.default)
def _lift_fresh(func: Any, args: tuple, kwargs: dict) -> Any:
    """``torch.tensor(data, device="pjrt")`` marks its fresh result; nothing to do, except while torch.compile traces.

    torch builds that tensor in C++ with the Python key off, so our factory kernels make a real pjrt tensor
    holding the values on the host even under dynamo's fake mode. There it becomes a tracing tensor whose
    inner tensor is the fake mode's constant of those values moved to the meta device: the graph holds the
    values as a constant and computes with them like any other traced tensor.
    """
    data = unwrap(args[0])
    if data.state is TensorState.HOST and torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE):
        assert data.host is not None
        inner = aten._to_copy.default(aten.lift_fresh_copy.default(data.host), device=_META)
        return outer_of(type(args[0]), inner, inner.shape, inner.stride())
    return args[0]


@_handles(aten._to_copy.default)
def _to_copy(func: Any, args: tuple, kwargs: dict) -> Any:
    src = args[0]
    data = unwrap(src)
    device = kwargs.get("device")
    dtype = kwargs.get("dtype") or data.dtype
    if device is not None and torch.device(device).type == "cpu":
        out = to_cpu(src)
        memory_format = kwargs.get("memory_format") or torch.preserve_format
        return out.to(dtype=dtype, memory_format=memory_format)
    if device is not None and torch.device(device).type == "meta":
        return torch.empty(data.shape, dtype=dtype, device="meta")
    if device is not None and torch.device(device).type != DEVICE_TYPE:
        raise VirtualDeviceError(f"cannot copy a pjrt tensor to {device} directly; go through .cpu()")
    check_torch_device(device)
    if data.state is TensorState.HOST:
        assert data.host is not None
        converted = data.host.to(dtype)
        return wrap(TensorData.from_host(converted, copy=converted is data.host))
    return NotImplemented


@_handles(aten.copy_.default)
def _copy_(func: Any, args: tuple, kwargs: dict) -> Any:
    dst, src = args[0], args[1]
    if isinstance(dst, XLAShardedTensor):
        if isinstance(src, XLAShardedTensor) and src._pjrt_data.state is not TensorState.HOST:
            return NotImplemented
        if dst._pjrt_data.state is TensorState.LAZY or dst._pjrt_data.view_of is not None:
            return NotImplemented  # a view: the engine writes through to its base
        return copy_into(dst, src)
    dst.copy_(to_cpu(src))
    return dst


@_handles(aten.zero_.default, aten.fill_.Scalar, aten.fill_.Tensor)
def _fill_host(func: Any, args: tuple, kwargs: dict) -> Any:
    data = unwrap(args[0])
    if data.state is not TensorState.HOST or data.view_of is not None:
        return NotImplemented  # a view: the engine writes through to its base
    rest = list(args[1:])
    if rest and isinstance(rest[0], XLAShardedTensor):
        source = rest[0]._pjrt_data
        if source.state is not TensorState.HOST:
            return NotImplemented
        rest[0] = source.host
    assert data.host is not None
    getattr(data.host, func.overloadpacket.__name__)(*rest, **kwargs)
    data.set_host(data.host, copy=False)  # new contents: a new version, no longer uninitialized
    value = 0 if func is aten.zero_.default else rest[0] if func is aten.fill_.Scalar else None
    if isinstance(value, (bool, int, float)):  # torch.ones/zeros/full: an engine can make these contents itself
        data.recipe = (aten.full.default, (list(data.shape), value), {"dtype": data.dtype})
    _contents_changed(data)
    return args[0]


@_handles(aten.clone.default)
def _clone(func: Any, args: tuple, kwargs: dict) -> Any:
    # The copy is declared with the original's sharding at once, as in PyTorch/XLA (a pending copy gets it
    # as a sharding constraint in the graph).
    data = unwrap(args[0])
    if data.state is TensorState.HOST:
        assert data.host is not None
        result = wrap(TensorData.from_host(data.host))
    else:
        result = _route_to_engine(func, (type(args[0]),), args, kwargs)
    if data.annotation is not None and isinstance(result, XLAShardedTensor):
        new = result._pjrt_data
        if new.annotation is None:
            new.annotation, new.mark = data.annotation, data.mark
            if new.state is TensorState.LAZY:
                _seam.engine().on_mark_sharding(new)
    return result


@_handles(aten.empty_like.default, aten.new_empty.default, aten.new_empty_strided.default)
def _empty_like(func: Any, args: tuple, kwargs: dict) -> Any:
    base = unwrap(args[0])
    shape = base.shape if func is aten.empty_like.default else tuple(args[1])
    dtype = kwargs.get("dtype") or base.dtype
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != DEVICE_TYPE:
        return torch.empty(shape, dtype=dtype, device=device)
    check_torch_device(device)
    if base.state is TensorState.LAZY:
        # Made from a pending tensor, it is read by pending ops too (autograd's ``1 - sigmoid`` is
        # ``empty_like(s).fill_(1).sub_(s)``): pending zeros, as an unwritten tensor reads in a trace, cost one
        # recorded op, where host memory cost an allocation and a host fill (0.5 ms for silu's backward of
        # the hf_step Llama) that the trace recomputes anyway.
        return _route_to_engine(aten.zeros.default, (), (list(shape),), {"dtype": dtype, "device": _META})
    return wrap(TensorData.empty(shape, dtype))


@_handles(aten._local_scalar_dense.default)
def _item(func: Any, args: tuple, kwargs: dict) -> Any:
    return to_cpu(args[0]).item()


@_handles(aten.is_pinned.default)
def _is_pinned(func: Any, args: tuple, kwargs: dict) -> Any:
    return False


def _route_to_engine(func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
    return _seam.engine().dispatch(func, types, args, kwargs)
