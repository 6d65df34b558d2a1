"""XLAShardedTensor: the torch.Tensor subclass on ``pjrt:0``, its shards, and mark_sharding / clear_sharding.

Handles only the data-model operators itself (aliases, copies to and from the
CPU, filling deferred host data); every other operator goes to the execution
engine (``pjrt_plugins.spmd._lazy.dispatch``). Never computes on the devices.
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

from ..errors import ShardingConflictError, ShardingError, SpmdDisabledError, UnsupportedOpError, VirtualDeviceError
from . import _device, _transfer
from ._data import TensorData, TensorState, host_empty
from ._sharding import PartitionSpec, ShardingSpec, ShardingType
from .mesh import Mesh

logger = logging.getLogger(__name__)

__all__ = ["XLAShard", "XLAShardedTensor", "clear_sharding", "mark_sharding", "to_device", "unwrap", "wrap"]

aten = torch.ops.aten


@dataclass
class XLAShard:
    """One device's piece of an :class:`XLAShardedTensor`.

    ``data`` is the (zero-padded) shard copied to the CPU, ``indices`` the
    slices of the global tensor it covers (``...`` for a full replica),
    ``shard_device`` the physical device (e.g. ``'cpu:3'``) and ``replica_id``
    0 for tiled shards, the position in the replication group for partially
    replicated ones and the device ordinal for replicated ones.
    """

    data: torch.Tensor
    indices: tuple[slice, ...] | EllipsisType
    shard_device: str
    replica_id: int

    @property
    def unpadded_data(self) -> torch.Tensor:
        """``data`` without the zero padding of a short tail shard."""
        if self.indices is ...:
            return self.data
        return self.data[tuple(slice(0, s.stop - s.start) for s in self.indices)]


_make_wrapper = torch.Tensor._make_wrapper_subclass
_TORCH_DEVICE = _device.TORCH_DEVICE


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
        t.local_shards[5].indices    # (slice(2, 4), slice(1, 2))
        t.cpu()                      # the whole 4x4 tensor again
    """

    _pjrt_data: TensorData

    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, elem: Any, *, requires_grad: bool = False) -> XLAShardedTensor:
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
        return wrap(data, requires_grad, cls)

    # -- what PyTorch/XLA users read -------------------------------------------------------

    @property
    def sharding(self) -> ShardingSpec | None:
        """The declared sharding as a :class:`ShardingSpec`, or ``None``."""
        return self._pjrt_data.annotation

    @property
    def sharding_spec(self) -> str:
        """The HLO sharding string, e.g. ``'{devices=[2,4]0,1,2,3,4,5,6,7}'``; ``''`` if none is declared."""
        spec = self._pjrt_data.annotation
        return spec.to_hlo() if spec is not None else ""

    @property
    def sharding_type(self) -> ShardingType | None:
        """REPLICATED, TILED, PARTIAL or MAXIMAL (a :class:`ShardingType`), or ``None`` if none is declared."""
        spec = self._pjrt_data.annotation
        return spec.type if spec is not None else None

    @property
    def mesh_shape(self) -> tuple[int, ...] | None:
        """Shape of the mesh given to :func:`mark_sharding`, or ``None``."""
        mark = self._pjrt_data_mark()
        return mark[0].mesh_shape if mark else None

    @property
    def partition_spec(self) -> tuple | None:
        """The partition spec given to :func:`mark_sharding`, or ``None``."""
        mark = self._pjrt_data_mark()
        return mark[1] if mark else None

    def _pjrt_data_mark(self) -> tuple[Mesh, tuple] | None:
        data = self._pjrt_data
        return data.mark if data.annotation is not None else None

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
            _transfer.upload(data, data.annotation)
        vd = _device.virtual_device()
        assert data.sharding is not None
        return [
            XLAShard(_transfer.download_shard(data, s.device), s.indices, vd.device_name(s.device), s.replica_id)
            for s in data.sharding.shards(data.shape, vd.device_ids)
        ]

    # -- behaving like a plain tensor --------------------------------------------------------

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        data = self._pjrt_data
        if data is None:
            return f"XLAShardedTensor(<traced by torch.compile>, size={tuple(self.shape)}, dtype={self.dtype})"
        text = repr(to_cpu(self))
        inner = text[len("tensor(") : -1] if text.startswith("tensor(") and text.endswith(")") else text
        extras = [f"device='{_device.TORCH_DEVICE}'"]
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
        new = TensorData.from_host(_transfer.gather(data), copy=False)
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
        return (rebuild, (to_cpu(self), self.dtype, str(_device.TORCH_DEVICE), self.requires_grad))

    # -- torch's wrapper-subclass protocol ------------------------------------------------------
    # With it, Module.to / _apply moves a Parameter by swapping its contents in place
    # (torch.utils.swap_tensors) instead of making a new Parameter per module, so parameters
    # tied across modules (a GPT's embedding and LM head) stay one Parameter, as on CUDA.
    # torch.compile traces the inner tensor: a meta tensor linked to this one (see _compile).

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_pjrt_inner"], None

    @property
    def _pjrt_inner(self) -> torch.Tensor:
        from . import _compile

        return _compile.inner_of(self)

    @staticmethod
    def __tensor_unflatten__(inner: dict, meta: Any, outer_size: Any, outer_stride: Any) -> XLAShardedTensor:
        from . import _compile

        return _compile.outer_of(inner["_pjrt_inner"], outer_size, outer_stride)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        try:
            if kwargs is None:
                kwargs = {}
            if tracing_tensors_alive:  # torch.compile is (or was) tracing: its tensors take their own path
                from . import _compile

                if _compile.is_tracing(args, kwargs):
                    return _compile.trace_dispatch(func, args, kwargs)
            handler = _HANDLERS_BY_ID.get(id(func))  # by id: an OpOverload's __hash__ is Python code
            if handler is not None:
                result = handler(func, args, kwargs)
                if result is not NotImplemented:
                    return result
            return _route_to_engine(func, types, args, kwargs)
        except BaseException as error:
            if torch._C._current_graph_task_id() == -1:
                raise
            if not getattr(error, "_pjrt_op_noted", False):
                error.add_note(f"(raised by {func} in autograd's backward pass on the pjrt device)")
                error._pjrt_op_noted = True  # type: ignore[attr-defined]
            return _ErrorForAutograd(error)


#: One entry per tensor torch.compile is tracing that is alive (``_compile``): while any, each op checks its
#: arguments for them.
tracing_tensors_alive: list[None] = []


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
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    for types in (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if XLAShardedTensor not in types:
            types.append(XLAShardedTensor)


_join_foreach_types()


# -- wrapping ------------------------------------------------------------------------------


def wrap(data: TensorData, requires_grad: bool = False, cls: type | None = None) -> XLAShardedTensor:
    """A new wrapper (tensor object, of ``cls``, a subclass) for ``data``; wrappers of the same data alias each other.

    Every traced op makes one. No strides given: torch makes the contiguous ones (in C, cheaper than passing
    them), which is what a pjrt tensor reports.
    """
    r = _make_wrapper(cls or XLAShardedTensor, data.shape, dtype=data.dtype, device=_TORCH_DEVICE,
                      requires_grad=requires_grad)
    r._pjrt_data = data
    return r


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
        f"expected a tensor on the virtual device {_device.TORCH_DEVICE}, got "
        f"{type(tensor).__name__} on {device}; move it with .to('pjrt') or xs.to_device(...)"
    )


# -- materialization -------------------------------------------------------------------------


def materialize(datas: Sequence[TensorData]) -> None:
    """Turn LAZY ``datas`` into DEVICE state through the execution engine (no-op for the others)."""
    pending = [d for d in datas if d.state is TensorState.LAZY]
    if not pending:
        return
    engine = _device._lazy_module()
    if engine is None:  # pragma: no cover - lazy values exist only when the engine does
        raise VirtualDeviceError("a pending graph value exists but the execution engine is missing")
    engine.materialize(pending)


def to_cpu(tensor: XLAShardedTensor) -> torch.Tensor:
    """The global value of a pjrt tensor as a new CPU tensor (runs pending work, gathers shards)."""
    data = unwrap(tensor)
    materialize([data])
    return _transfer.gather(data)


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """``dst.copy_(src)`` for a pjrt ``dst`` and a CPU ``src``: ``dst`` becomes deferred host data."""
    data = unwrap(dst)
    if isinstance(src, XLAShardedTensor):
        sdata = src._pjrt_data
        if sdata.state is not TensorState.HOST:
            return _route_to_engine(aten.copy_.default, (type(dst),), (dst, src), {})
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
        engine = _device._lazy_module()
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
    from . import _optim  # the engine's side (imports the lowering)

    return _optim.fused_step(func, args, kwargs)


@_handles(aten.lift_fresh.default)
def _lift_fresh(func: Any, args: tuple, kwargs: dict) -> Any:
    return args[0]  # torch.tensor(..., device="pjrt") marks its fresh result; nothing to do


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
    if device is not None and torch.device(device).type != _device.DEVICE_TYPE:
        raise VirtualDeviceError(f"cannot copy a pjrt tensor to {device} directly; go through .cpu()")
    _device.check_torch_device(device)
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
        value = rest[0]._pjrt_data
        if value.state is not TensorState.HOST:
            return NotImplemented
        rest[0] = value.host
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
    data = unwrap(args[0])
    if data.state is not TensorState.HOST:
        return NotImplemented
    assert data.host is not None
    return wrap(TensorData.from_host(data.host))


@_handles(aten.empty_like.default, aten.new_empty.default, aten.new_empty_strided.default)
def _empty_like(func: Any, args: tuple, kwargs: dict) -> Any:
    base = unwrap(args[0])
    shape = base.shape if func is aten.empty_like.default else tuple(args[1])
    dtype = kwargs.get("dtype") or base.dtype
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != _device.DEVICE_TYPE:
        return torch.empty(shape, dtype=dtype, device=device)
    _device.check_torch_device(device)
    return wrap(TensorData.empty(shape, dtype))


@_handles(aten._local_scalar_dense.default)
def _item(func: Any, args: tuple, kwargs: dict) -> Any:
    return to_cpu(args[0]).item()


@_handles(aten.is_pinned.default)
def _is_pinned(func: Any, args: tuple, kwargs: dict) -> Any:
    return False


def _route_to_engine(func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
    engine = _device._lazy_module()
    if engine is None:
        raise UnsupportedOpError(
            str(func),
            f"operator {func} is not supported on the pjrt device yet: running torch operators there needs "
            "the execution engine (pjrt_plugins.spmd._lazy), which this build does not have. "
            "Move the tensors to the CPU with .cpu() to compute on them.",
        )
    return engine.dispatch(func, types, args, kwargs)


# -- annotation --------------------------------------------------------------------------------

def _as_mesh(mesh: Mesh | Sequence[int]) -> Mesh:
    if isinstance(mesh, Mesh):
        return mesh
    if isinstance(mesh, (tuple, list)) and all(isinstance(s, int) and not isinstance(s, bool) for s in mesh):
        return Mesh(range(math.prod(mesh)), tuple(mesh))  # the RFC's form: a mesh shape, ids in ordinal order
    raise TypeError(f"mark_sharding expects a Mesh or a mesh shape (tuple of ints), got {mesh!r}")


def _plugin_label(vd: _device.VirtualDevice) -> str:
    return f"plugin {getattr(vd.plugin, 'name', None) or type(vd.plugin).__name__!r}"


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

    Example (8 devices)::

        mesh = xs.Mesh(range(8), (4, 2), ("data", "model"))
        x = xs.mark_sharding(torch.randn(8, 32).to("pjrt"), mesh, ("data", None))
        x.sharding_type      # ShardingType.PARTIAL: 4-way split, replicated over "model"
        linear = torch.nn.Linear(32, 10).to("pjrt")
        xs.mark_sharding(linear.weight, mesh, (None, "model"))   # in place: still the Parameter
        xs.mark_sharding(torch.zeros(8, 4).to("pjrt"), (4, 2), (0, 1))   # the RFC's mesh-shape form
    """
    if use_dynamo_custom_op:
        raise NotImplementedError("use_dynamo_custom_op=True (torch.compile sharding ops) is not supported")
    data = unwrap(t)
    vd = _device.virtual_device()
    if not vd.spmd:
        raise SpmdDisabledError(
            "mark_sharding needs SPMD mode, which is off (XLA_USE_SPMD=0): the virtual device is a single "
            "device. Call pjrt_plugins.spmd.use_spmd() or set XLA_USE_SPMD=1 before using the pjrt device."
        )
    mesh = _as_mesh(mesh)
    if mesh.size() != vd.num_devices:
        raise ShardingError(
            f"mesh shape {mesh.mesh_shape} covers {mesh.size()} devices but the virtual device stands for "
            f"{vd.num_devices} ({_plugin_label(vd)}); build the mesh over all {vd.num_devices} devices"
        )
    spec = mesh.get_op_sharding(partition_spec, rank=t.dim())
    spec.check_devices(vd.device_ids)
    current = data.annotation
    if current == spec:
        data.mark = (mesh, tuple(partition_spec))
        return t  # type: ignore[return-value]
    if current is not None and current.type is not ShardingType.REPLICATED:
        raise ShardingConflictError(
            f"the tensor already has sharding {current}; it cannot be re-marked as {spec}. "
            "Call xs.clear_sharding(t) first (re-marking with the same sharding, or over a replicated one, is allowed)"
        )
    if data.state is TensorState.DEVICE:
        _transfer.check_current(data, vd)
    data.annotation = spec
    data.mark = (mesh, tuple(partition_spec))
    if data.state is TensorState.LAZY:
        _device._lazy_module().on_mark_sharding(data)  # pending values exist only where the engine does
    else:
        _transfer.upload(data, spec)
    logger.debug("marked %r", data)
    return t  # type: ignore[return-value]


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Forget ``t``'s declared sharding (its shards stay where they are); returns ``t``.

    Afterwards ``t`` may be marked with any sharding.

    Example::

        xs.mark_sharding(t, mesh, (0, 1))
        xs.mark_sharding(t, mesh, (1, 0))   # ShardingConflictError: already {devices=[...]...}
        xs.clear_sharding(t)                # t.sharding_spec == ''
        xs.mark_sharding(t, mesh, (1, 0))   # re-shards
    """
    data = unwrap(t)
    data.annotation = None
    data.mark = None
    return t


def to_device(obj: Any) -> Any:
    """Place a CPU tensor or an ``nn.Module``'s parameters and buffers on ``pjrt:0`` (nothing is uploaded).

    The same as ``obj.to("pjrt")``, which also works; returns the tensor or the module.

    Example::

        model = xs.to_device(torch.nn.Linear(4, 2))   # parameters are deferred host data
        model.weight.device                           # device(type='pjrt', index=0)
        model = torch.nn.Linear(4, 2).to("pjrt")      # the same
    """
    if isinstance(obj, torch.nn.Module):
        return obj.to(_device.TORCH_DEVICE)
    if isinstance(obj, torch.Tensor):
        return obj.to(_device.TORCH_DEVICE)
    raise TypeError(f"to_device expects a tensor or an nn.Module, got {type(obj).__name__}")
