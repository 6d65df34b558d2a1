"""TensorData: where one tensor on the virtual device lives (host, device shards, or a pending graph value).

Shared by every wrapper of the same tensor (``detach``/``alias`` views). Holds
state only: it never transfers data or records ops itself.
"""

from __future__ import annotations

import enum
import itertools
import logging
import math
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from ...runtime import aligned_empty
from ..sharding import OpSharding

logger = logging.getLogger(__name__)

__all__ = ["TensorData", "TensorState", "host_empty"]

#: From this size on, host tensors are allocated through numpy (see host_empty).
_LARGE_HOST_BYTES = 1 << 20


def host_empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized contiguous CPU tensor; large ones are allocated by numpy.

    numpy asks Linux for transparent huge pages on large allocations and torch's CPU
    allocator does not; first writes into fresh memory (every snapshot and gather
    writes fresh memory) then run about twice as fast. The start is aligned (see
    :func:`pjrt_plugins.runtime.aligned_empty`), so plugins can still alias it.
    """
    shape = tuple(int(s) for s in shape)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < _LARGE_HOST_BYTES:
        return torch.empty(shape, dtype=dtype)
    return torch.from_numpy(aligned_empty(nbytes)).view(dtype).view(shape)


class TensorState(enum.Enum):
    """Where a tensor's value is.

    HOST:   a CPU tensor not yet uploaded (deferred: nothing has moved).
    DEVICE: one runtime Buffer per device ordinal (``None`` where a device holds
            nothing), laid out by ``TensorData.sharding``.
    LAZY:   a value of the pending graph (owned by the execution engine).
    """

    HOST = "host"
    DEVICE = "device"
    LAZY = "lazy"


#: The next process-unique TensorData id. ``itertools.count``'s ``__next__`` runs in C without releasing the
#: GIL, so two threads never get the same id; no lock needed on the tracer's hot path.
_next_id = itertools.count(1).__next__


class TensorData:
    """The value behind one or more ``XLAShardedTensor`` wrappers.

    Attributes (read freely; change only through the ``set_*`` methods):

    - ``shape`` (tuple of ints) and ``dtype`` (torch dtype): the global tensor's.
    - ``state``: a :class:`TensorState`.
    - ``host``: the CPU tensor (contiguous, owned: nobody else writes it) in state HOST.
    - ``buffers``: in state DEVICE, a list indexed by device ordinal of runtime
      ``Buffer`` objects (padded shards), ``None`` for devices holding nothing.
    - ``sharding``: in state DEVICE, the :class:`OpSharding` the buffers follow.
    - ``lazy``: in state LAZY, the execution engine's graph value (opaque here).
    - ``annotation``: the declared sharding (``mark_sharding``, or the sharding
      the partitioner chose for an output), or ``None``. It is what
      ``sharding_spec`` reports and what the re-marking rules check.
    - ``mark``: ``(mesh, partition_spec)`` of the last ``mark_sharding``, or ``None``.
    - ``generation``: the virtual device generation the buffers belong to.
    - ``id``: a process-unique integer (stable across state changes).
    - ``version``: bumped on every state change.
    - ``view_of``: for a view of another tensor, ``(root, chain)``: a weak reference to the TensorData
      it views at the end of a chain of views, and the chain, a tuple of ``(view op, its arguments
      after the tensor)`` from the root to this view. Kept for the tensor's life (a write into the
      view after the values were materialized still reaches the root); ``None`` otherwise. Weak:
      torch's own view tracking (``tensor._base``) keeps the root of a user's view alive; a root
      only the engine made (inside a decomposition) may go, and then a write into the view reaches
      no other view of it.
    - ``views``: on a root, weak references to the TensorData viewing it (``None`` when there never
      were any), so that an engine writing new contents into it can derive its live views again,
      as torch's views see every later write into their base.
    - ``uninitialized``: True for HOST data made by ``empty`` whose contents nobody wrote yet
      (an engine may skip uploading it before an op that overwrites it); any state change clears it.
    - ``recipe``: for HOST data a factory made (a fill, an integer ``arange``), ``(op, args, kwargs)``
      of one ATen op that makes the same contents, so an engine can compute them on the devices
      instead of uploading them; set after :meth:`set_host`, cleared by any state change.
    """

    __slots__ = (
        "__weakref__",
        "annotation",
        "buffers",
        "dtype",
        "generation",
        "host",
        "id",
        "lazy",
        "mark",
        "recipe",
        "shape",
        "sharding",
        "state",
        "uninitialized",
        "version",
        "view_of",
        "views",
    )

    def __init__(self, shape: Sequence[int], dtype: torch.dtype) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.state = TensorState.HOST
        self.host: torch.Tensor | None = None
        self.buffers: list[Any] | None = None
        self.sharding: OpSharding | None = None
        self.lazy: Any = None
        self.annotation: OpSharding | None = None
        self.mark: tuple[Any, tuple] | None = None
        self.generation = 0
        self.id = _next_id()
        self.version = 0
        self.uninitialized = False
        self.view_of: tuple[weakref.ref[TensorData], tuple[tuple[Any, tuple], ...]] | None = None
        self.views: list[weakref.ref[TensorData]] | None = None
        self.recipe: tuple[Any, tuple, dict] | None = None

    # -- constructors --------------------------------------------------------------------

    @classmethod
    def from_host(cls, tensor: torch.Tensor, *, copy: bool = True) -> TensorData:
        """A HOST-state TensorData holding ``tensor`` (copied unless ``copy=False`` and it is private)."""
        data = cls(tensor.shape, tensor.dtype)
        data.set_host(tensor, copy=copy)
        return data

    @classmethod
    def empty(cls, shape: Sequence[int], dtype: torch.dtype) -> TensorData:
        """A HOST-state TensorData with uninitialized contents (``torch.empty`` semantics)."""
        data = cls(shape, dtype)
        data.set_host(host_empty(data.shape, dtype), copy=False)
        data.uninitialized = True
        return data

    @classmethod
    def from_lazy(cls, shape: Sequence[int], dtype: torch.dtype, value: Any) -> TensorData:
        """A LAZY-state TensorData for a pending graph value."""
        data = cls(shape, dtype)
        data.set_lazy(value)
        return data

    @classmethod
    def pending(cls, shape: tuple[int, ...], dtype: torch.dtype, value: Any) -> TensorData:
        """:meth:`from_lazy` for the tracer's hot path: ``shape`` is already a tuple of ints."""
        data = cls.__new__(cls)
        data.shape = shape
        data.dtype = dtype
        data.state = TensorState.LAZY
        data.host = data.buffers = data.sharding = data.annotation = data.mark = None
        data.lazy = value
        data.views = None
        data.view_of = None
        base = value.base() if value.base is not None else None
        if base is not None:
            data.make_view_of(base, value.view)
        data.generation = 0
        data.id = _next_id()
        data.version = 1
        data.uninitialized = False
        data.recipe = None
        return data

    # -- state changes -------------------------------------------------------------------

    def set_host(self, tensor: torch.Tensor, *, copy: bool = True) -> None:
        """Hold ``tensor`` (a CPU tensor of this shape and dtype) on the host; drops device buffers."""
        if tensor.device.type != "cpu":
            raise ValueError(f"host data must be a CPU tensor, got one on {tensor.device}")
        if tuple(tensor.shape) != self.shape or tensor.dtype != self.dtype:
            raise ValueError(
                f"host data of shape {tuple(tensor.shape)} and {tensor.dtype} does not match "
                f"{self.shape} and {self.dtype}"
            )
        tensor = tensor.detach()
        if copy or not tensor.is_contiguous():
            fresh = host_empty(self.shape, self.dtype)
            fresh.copy_(tensor)
            tensor = fresh
        self.host = tensor
        self.buffers = None
        self.sharding = None
        self.lazy = None
        self.state = TensorState.HOST
        self.uninitialized = False
        self.recipe = None
        self.version += 1

    def set_device(self, buffers: Sequence[Any], sharding: OpSharding, generation: int) -> None:
        """Hold per-device ``buffers`` (indexed by device ordinal) laid out by ``sharding``."""
        if not isinstance(sharding, OpSharding):
            raise TypeError(f"sharding must be a OpSharding, got {type(sharding).__name__}")
        sharding.check_rank(self.shape)
        self.buffers = list(buffers)
        self.sharding = sharding
        self.generation = int(generation)
        self.host = None
        self.lazy = None
        self.state = TensorState.DEVICE
        self.uninitialized = False
        self.recipe = None
        self.version += 1

    def set_lazy(self, value: Any) -> None:
        """Become the pending graph value ``value``; drops host data and device buffers.

        A value that views another tensor (``value.base``) makes this data a view of it for good.
        """
        self.lazy = value
        base_ref = getattr(value, "base", None)
        base = base_ref() if base_ref is not None else None
        if base is not None and self.view_of is None:
            self.make_view_of(base, value.view)
        self.host = None
        self.buffers = None
        self.sharding = None
        self.state = TensorState.LAZY
        self.uninitialized = False
        self.recipe = None
        self.version += 1

    def make_view_of(self, base: TensorData, links: tuple[tuple[Any, tuple], ...]) -> None:
        """Become for good the view of ``base`` that ``links`` derive from it (``((view op, its arguments after
        the tensor), ...)``), known to its root."""
        if base.view_of is None:
            root_ref, chain = weakref.ref(base), links  # the caller's tuple, kept as it is
        else:
            root_ref, chain = base.view_of
            chain = (*chain, *links)
        root = root_ref()
        self.view_of = (root_ref, chain)
        if root is None:
            return
        views = root.views
        if views is None:
            root.views = [weakref.ref(self)]
            return
        views.append(weakref.ref(self))
        n = len(views)
        if n >= 16 and n & (n - 1) == 0:  # at each power of two, forget the views that died (amortized O(1))
            views[:] = [r for r in views if r() is not None]

    def live_views(self) -> list[TensorData]:
        """The TensorData viewing this one that are still alive."""
        if not self.views:
            return []
        return [v for r in self.views if (v := r()) is not None]

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Reached only by code that copies a tensor's internals (torch.distributed.checkpoint.async_save's
        # stager): without this, pickle fails deep inside on a cffi pointer of a device buffer.
        raise TypeError(
            "the data of a pjrt tensor (device buffers) cannot be copied or pickled on its own; copy or pickle the "
            "tensor itself (copy.deepcopy(t), t.cpu(), torch.save), which gathers its value"
        )

    # -- facts ---------------------------------------------------------------------------

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the global (unpadded) tensor."""
        return self.numel * self.dtype.itemsize

    def meta(self) -> torch.Tensor:
        """A meta tensor with this shape and dtype (for shape inference)."""
        return torch.empty(self.shape, dtype=self.dtype, device="meta")

    def __repr__(self) -> str:
        spec = f" sharding={self.sharding}" if self.sharding is not None else ""
        mark = f" annotation={self.annotation}" if self.annotation is not None else ""
        return f"<TensorData #{self.id} {self.state.value} {list(self.shape)} {self.dtype}{spec}{mark}>"
