"""The tensors ``torch.compile`` traces for pjrt tensors: a pjrt tensor's inner tensor, and *tracing* pjrt tensors.

``XLAShardedTensor.__tensor_flatten__`` exposes one inner tensor, a meta tensor of its shape linked back
to its data (:func:`inner_of`). Dynamo and AOTAutograd trace with fake inner tensors wrapped in tracing
pjrt tensors (``_pjrt_data is None``, made by :func:`outer_of`), whose ops run on the inner tensors
(:func:`trace_dispatch`). The ``pjrt`` backend itself is ``_dynamo_backend``.
"""

from __future__ import annotations

import pkgutil
import sys
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch._guards import TracingContext
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import return_and_correct_aliasing
from torch.utils._pytree import tree_map_only

from ..devices import HybridMesh, Mesh
from ..sharding import Mesh as PureMesh
from ..transport import TensorData
from ._torch_device import DEVICE_TYPE, TORCH_DEVICE

__all__ = ["EMPTY_STORAGE_BYTES", "IN_GRAPH", "configure_dynamo", "inner_of", "is_tracing", "linked", "outer_of",
           "trace_dispatch", "trace_through", "tracing_tensors_alive"]

_META = torch.device("meta")
_F = TypeVar("_F", bound=Callable[..., Any])
#: The one module of this package dynamo traces (the sharding functions users call in compiled code).
TRACEABLE_MODULE = f"{__package__}._traceable"
#: API modules of plain torch code that compiled models call, traced too (a skipped call would break the graph):
#: the bounded mixture-of-experts functions.
TRACEABLE_API_MODULES = ("pjrt_plugins.spmd.moe",)

#: The storage a pjrt tensor with no elements reports, in bytes. Why not 0: torch.compile's fake copy of a tensor
#: whose storage has no bytes resizes its own, which torch asks the device's hooks to do, and torch's Python hooks
#: for PrivateUse1 cannot (``resizePrivateUse1Bytes``: an internal error of dynamo for a zero-size input).
EMPTY_STORAGE_BYTES = 1

#: One entry per tracing tensor that is alive: while any, each op checks its arguments for them.
tracing_tensors_alive: list[None] = []
_dynamo_configured = False
#: The :func:`trace_through` functions by name.
_traced_through: dict[str, Callable[..., Any]] = {}
#: Name -> what compiled code calls for that :func:`trace_through` function: it, as a call dynamo leaves opaque
#: in its graph (filled by :func:`configure_dynamo`; empty until dynamo is loaded).
IN_GRAPH: dict[str, Callable[..., Any]] = {}


def configure_dynamo() -> None:
    """Dynamo must not trace into pjrt_plugins (mark_sharding, transfers: devices and cffi calls): a call from a
    compiled function breaks the graph there and runs eagerly. The exception is ``_traceable`` (the sharding
    functions users call in compiled code), and the :func:`trace_through` functions it calls, which dynamo leaves
    opaque. Done the first time dynamo looks inside a pjrt tensor (dynamo is loaded by then; ``_dynamo_backend``
    does it too, for ``backend="pjrt"``)."""
    global _dynamo_configured
    dynamo = sys.modules.get("torch._dynamo")
    trace_rules = sys.modules.get("torch._dynamo.trace_rules")
    if dynamo is None or trace_rules is None or _dynamo_configured:
        return
    _skip_all_but(trace_rules, (TRACEABLE_MODULE, *TRACEABLE_API_MODULES))
    # Meshes are arguments of the opaque calls: constants to dynamo (they compare by value).
    for mesh_class in (Mesh, HybridMesh, PureMesh):
        if not pytree.is_constant_class(mesh_class):
            pytree.register_constant(mesh_class)
    for name, fn in _traced_through.items():
        IN_GRAPH[name] = dynamo.nonstrict_trace(fn)
    _dynamo_configured = True


def _skip_all_but(trace_rules: Any, kept: tuple[str, ...]) -> None:
    """Have dynamo skip every module of the top package of ``kept`` but the ``kept`` ones (the packages'
    ``__init__`` files on their paths stay traceable: the functions there only delegate, and a call into a skipped
    module breaks the graph)."""
    on_paths = {".".join(name.split(".")[:depth]) for name in kept for depth in range(1, name.count(".") + 2)}
    for package in sorted(p for p in on_paths if p not in kept):
        for module in pkgutil.iter_modules(sys.modules[package].__path__):
            if f"{package}.{module.name}" not in on_paths:
                trace_rules.add(f"{package}.{module.name}")


def trace_through(fn: _F) -> _F:
    """Let compiled code call ``fn`` (a sharding hint that handles tracing tensors itself) without a graph break,
    as ``IN_GRAPH[fn.__name__]``: dynamo leaves the call opaque in its graph (``torch._dynamo.nonstrict_trace``),
    and AOTAutograd runs ``fn`` on its tracing tensors, so the operators ``fn`` calls become graph nodes."""
    _traced_through[fn.__name__] = fn
    dynamo = sys.modules.get("torch._dynamo")
    if _dynamo_configured and dynamo is not None:
        IN_GRAPH[fn.__name__] = dynamo.nonstrict_trace(fn)
    return fn


def inner_of(t: Any) -> torch.Tensor:
    """The inner tensor torch.compile sees for the pjrt tensor ``t``: a meta tensor of its shape linked to its
    data (kept on ``t`` while its data, shape and dtype stay, so that every look at ``t`` gives the same one,
    as torch expects)."""
    configure_dynamo()
    inner = t.__dict__.get("_pjrt_inner_tensor")
    data = t._pjrt_data
    if data is None:  # a tracing tensor: its fake inner tensor
        return inner  # type: ignore[no-any-return]
    if inner is not None and inner._pjrt_linked is data and inner.shape == t.shape and inner.dtype == t.dtype:
        return inner  # type: ignore[no-any-return]
    _check_view_layout(t, data)
    inner = linked(data)
    t.__dict__["_pjrt_inner_tensor"] = inner
    return inner  # type: ignore[no-any-return]


def _check_view_layout(t: Any, data: TensorData) -> None:
    """Refuse a view whose torch layout is not contiguous from offset 0 (``x[:, :n]``, ``x[1:]``): a pjrt tensor
    reports contiguous strides and no storage offset, and dynamo, which rebuilds a view input from its base,
    fails on the difference with an internal error. Raised here, where dynamo first looks inside the tensor,
    the message says what to do."""
    if data.view_of is None or not t._is_view() or TracingContext.try_get() is None:
        return  # only while dynamo traces: AOTAutograd's run time flattens views too (an expanded gradient)
    root_ref, chain = data.view_of
    root = root_ref()
    if root is None:
        return
    layout = torch.empty(root.shape, dtype=root.dtype, device=_META)
    try:
        for op, args in chain:
            layout = op(layout, *args)
    except Exception:  # noqa: BLE001 - a chain that does not replay on meta: leave it to dynamo
        return
    if not layout.is_contiguous() or layout.storage_offset() != 0:
        raise NotImplementedError(
            f"torch.compile on pjrt: an input is a view of another pjrt tensor ({tuple(t.shape)} of "
            f"{tuple(root.shape)}, strides {layout.stride()} and storage offset {layout.storage_offset()} in "
            "torch's layout) that pjrt reports as contiguous from offset 0; pass a copy (x[1:].clone()) or pass "
            "the whole tensor and take the view inside the compiled function")


def linked(data: TensorData, storage_offset: int = 0) -> torch.Tensor:
    """A meta tensor standing for ``data`` where torch.compile expects an inner tensor. ``storage_offset``: the
    one torch traced for it (a compiled function's output that is a view of an input, see :func:`outer_of`)."""
    inner = torch.empty(data.shape, dtype=data.dtype, device=_META)
    inner._pjrt_linked = data  # type: ignore[attr-defined]
    if storage_offset:
        inner._pjrt_storage_offset = storage_offset  # type: ignore[attr-defined]
    return inner


def outer_of(cls: type, inner: torch.Tensor, outer_size: Any, outer_stride: Any) -> Any:
    """The pjrt tensor (of ``cls``) for ``inner``: the data it is linked to, or a new tracing tensor.

    Both report the strides torch traced (``outer_stride``): AOTAutograd makes an output that is a view
    of an input (``a.t()``) again from that input with ``as_strided`` and the strides of what the
    compiled function returned, so these must be the view's, not those of the values' own layout.
    """
    data = getattr(inner, "_pjrt_linked", None)
    if data is None and type(inner) is torch.Tensor:  # not traced (fake/functional): another backend ran the graph
        raise RuntimeError(
            "pjrt tensors run under torch.compile only with backend=\"pjrt\" (or \"eager\"): another backend "
            "computed on the meta tensors that stand for them, which hold no values")
    offset = getattr(inner, "_pjrt_storage_offset", 0) if data is not None else inner.storage_offset()
    empty = data is not None and 0 in data.shape
    t: Any = torch.Tensor._make_wrapper_subclass(cls, outer_size, strides=outer_stride, storage_offset=offset,
                                            dtype=inner.dtype, device=TORCH_DEVICE,
                                            storage_size=EMPTY_STORAGE_BYTES if empty else None,
                                            requires_grad=inner.requires_grad if data is None else False)
    t._pjrt_data = data
    if data is not None:
        return t
    t.__dict__["_pjrt_inner_tensor"] = inner
    tracing_tensors_alive.append(None)  # list operations: atomic, finalizers run on any thread
    weakref.finalize(t, tracing_tensors_alive.pop)
    return t


def _is_tracing_tensor(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and getattr(x, "_pjrt_data", False) is None


def is_tracing(args: tuple, kwargs: dict) -> bool:
    """Whether a tracing tensor is among the arguments of an op (or in a list argument). Every op asks while
    tracing tensors are alive (dynamo keeps some after compiling): cheaper than flattening the arguments."""
    for group in (args, kwargs.values()):
        for a in group:
            if _is_tracing_tensor(a):
                return True
            if type(a) in (list, tuple) and any(_is_tracing_tensor(b) for b in a):
                return True
    return False


def trace_dispatch(cls: type, func: Any, args: tuple, kwargs: dict) -> Any:
    """An op on tracing tensors (of ``cls``): run it on their inner tensors, wrap the inner results (those on the
    meta device)."""

    def inner(x: Any) -> torch.Tensor:
        if x._pjrt_data is not None:
            raise RuntimeError(f"torch.compile: {func} mixes a traced pjrt tensor with one it did not trace; pass "
                               "every pjrt tensor the compiled function uses as an argument or module attribute")
        return x.__dict__["_pjrt_inner_tensor"]  # type: ignore[no-any-return]

    copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (plain pjrt tensor, its meta copy)

    def on_meta(x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, cls):
            return inner(x)
        if x.device.type != DEVICE_TYPE:
            return x
        # A factory's tensor (torch.arange(n, device=x.device)), traced as a plain tensor on pjrt: the inner
        # tensors live on the meta device (the lowering ignores devices).
        copy = x.to(_META)
        copies.append((x, copy))
        return copy

    try:
        meta_args, meta_kwargs = tree_map_only(torch.Tensor, on_meta, args), tree_map_only(torch.Tensor, on_meta, kwargs)
        out = func(*meta_args, **meta_kwargs)
    except RuntimeError as exc:
        if "meta and cpu" not in str(exc) and "cpu and meta" not in str(exc):
            raise
        # The inner tensors are on the meta device: torch's message would name it instead of pjrt.
        shapes = [tuple(a.shape) for a in pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor) and a.device.type == "cpu"]
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {TORCH_DEVICE} and "
            f"cpu! torch.compile on pjrt: {func} mixes pjrt tensors with a CPU tensor of shape "
            f"{shapes[0] if shapes else '?'}; move it to the pjrt device before the call (t.to(\"pjrt\")), or make "
            "it inside the compiled function with device=x.device") from None
    if copies:
        # An in-place op on a factory's tensor (a static KV cache: torch.zeros(..., device=x.device), then
        # index_copy_ of traced values into it) wrote into its meta copy: write the copy back, or the traced
        # graph would keep the factory's values and drop the write.
        written = _written_tensors(func, args, kwargs)
        for plain, copy in copies:
            if any(plain is w for w in written):
                plain.copy_(copy)
    wrapped = tree_map_only(torch.Tensor, lambda o: outer_of(cls, o, o.shape, o.stride()) if o.device == _META else o,
                            out)
    return return_and_correct_aliasing(func, args, kwargs, wrapped)


def _written_tensors(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors ``func`` writes into (``self`` of an in-place op, ``out=``), by its schema."""
    written: list[torch.Tensor] = []
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[position] if position < len(args) and not argument.kwarg_only else kwargs.get(argument.name)
        written.extend(v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor))
    return written
