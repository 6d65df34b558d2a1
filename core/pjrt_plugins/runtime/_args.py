"""Args structs in, the plugin's answers out: what every call into a plugin starts and ends with.

The bottom of the runtime's calls: a fresh args struct with its ``struct_size`` set
(:func:`new_args`), pools of reusable ones for the hot paths (:class:`Pool`), and the rules
for reading what a plugin hands back: a ``char*`` it owns, a count and an array checked
before any item is read (:func:`checked_count`), and the error for an answer that cannot be
used (:func:`broken_answer`). Nothing here calls a plugin.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..errors import PjrtError
from ._cdef import POINTER_CTYPES, STRUCT_SIZE, ffi

T = TypeVar("T")
_INTERNAL = 13  # absl::StatusCode::kInternal
#: More items than any real answer of a plugin holds (devices, memories, dimensions, outputs, attributes).
MAX_ITEMS = 1 << 20
#: More bytes than any text a plugin hands back (a name, a kind, a serialized program).
MAX_TEXT_BYTES = 1 << 31


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
    """A plugin-owned ``char*`` of ``size`` bytes as str ("" for NULL; bad UTF-8 replaced).

    A size no text has (a negative number stored in a ``size_t``) is refused, never read.
    """
    if pointer == ffi.NULL:
        return ""
    if size > MAX_TEXT_BYTES:
        raise broken_answer("a PJRT function", f"gave a text of {size} bytes", "the plugin")
    text: str = ffi.unpack(pointer, size).decode("utf-8", "replace")
    return text


def broken_answer(function: str, what: str, plugin: str) -> PjrtError:
    """The error for a plugin that reported success with an answer that cannot be used:
    ``function`` reported success but ``what`` (e.g. "returned no client")."""
    return PjrtError(
        _INTERNAL,
        f"{function} reported success but {what}",
        function=function,
        hint=f"a bug in the plugin {plugin}: using that answer would crash the process; report it to the plugin's "
        "maintainers",
    )


def checked_count(pointer: Any, count: int, function: str, what: str, plugin: str) -> int:
    """``count`` items at the plugin's ``pointer``, as an int, once both can be real: no more than
    :data:`MAX_ITEMS` (a negative count in a ``size_t`` is huge), and not NULL when there are any."""
    n = int(count)
    if n > MAX_ITEMS:
        raise broken_answer(function, f"gave {n} {what}, more than any plugin has", plugin)
    if n and pointer == ffi.NULL:
        raise broken_answer(function, f"gave {n} {what} at address NULL", plugin)
    return n


def version_text(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"
