"""Args structs and plugin-owned text: what every call into a plugin starts from.

The bottom of the runtime's calls: a fresh args struct with its ``struct_size`` set
(:func:`new_args`), pools of reusable ones for the hot paths (:class:`Pool`), and the
reading of a ``char*`` the plugin owns. Nothing here calls a plugin.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ._cdef import POINTER_CTYPES, STRUCT_SIZE, ffi

T = TypeVar("T")


def new_args(struct: str) -> Any:
    """A zeroed ``struct*`` with its ``struct_size`` set (our header's STRUCT_SIZE).

    For raw calls: ``args = new_args("PJRT_Buffer_Dimensions_Args")``, fill it (e.g.
    ``args.buffer = buffer.c_pointer()``), then ``library.call("PJRT_Buffer_Dimensions", args)``;
    or let :meth:`Library.invoke` make it: ``library.invoke("PJRT_Buffer_Dimensions", buffer=...)``.
    """
    args = ffi.new(POINTER_CTYPES[struct])
    args.struct_size = STRUCT_SIZE[struct]
    return args


class Pool(list[T], Generic[T]):
    """Reusable objects for hot paths (args structs, sets of them): ``item = pool.take()``, use it,
    ``pool.give(item)``; saves an allocation per call.

    A free list (the pool is the list of free items): ``pop`` and ``append`` are atomic under
    the GIL, so an item that was taken belongs to its taker until given back; another thread,
    or a finalizer (``__del__`` of a Buffer run by a garbage collection) that interrupts the
    taker on its own thread, takes another one or makes a new one. An item not given back (an
    exception) is simply dropped. ``give`` is ``list.append`` itself (no Python frame).
    Finalizers may use any of them: every declared type is resolved at import
    (``_cdef.POINTER_CTYPES``), so a finalizer never runs cffi's type parser, which holds a lock and
    is not re-entrant (a collection during a first ``ffi.typeof`` would deadlock on it).
    """

    __slots__ = ("_make",)

    def __init__(self, make: Callable[[], T]) -> None:
        super().__init__()
        self._make = make

    def take(self) -> T:
        try:
            return self.pop()
        except IndexError:
            return self._make()

    give = list.append


_pools: dict[str, Pool[Any]] = {}


def args_pool(struct: str) -> Pool[Any]:
    """The process-wide :class:`Pool` of ``struct`` args (e.g. ``"PJRT_Event_IsReady_Args"``)."""
    pool = _pools.get(struct)
    if pool is None:
        pool = _pools.setdefault(struct, Pool(functools.partial(new_args, struct)))
    return pool


def unpack_text(pointer: Any, size: int) -> str:
    """A plugin-owned ``char*`` of ``size`` bytes as str ("" for NULL; bad UTF-8 replaced)."""
    if pointer == ffi.NULL:
        return ""
    text: str = ffi.unpack(pointer, size).decode("utf-8", "replace")
    return text


def version_text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"
