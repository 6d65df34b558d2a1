"""Calls in flight: a client, buffer or executable is never freed while a C call on it runs.

Calls are counted while they run, in lists used as atomic counters (under the GIL
``append``, ``pop``, ``remove``, ``in`` and ``len`` are atomic, and Python operations happen in
one order): ``client._calls`` counts every call on the client and on anything it owns,
``client._handle_calls`` holds the buffer or executable of each call on one (an entry per call),
and ``client._running`` holds the frames of the executes in flight, whose ``arguments`` are the
buffers they read. The calls on a handle are entries of its client's list rather than a list of
its own: an execute makes a buffer object for every output on every device, and a list more
each would double the objects that drive the garbage collector (a replayed training step makes
about 1,300 buffers; with a list each, its collections took 4 ms a step on average). A call first
counts itself, then checks that its object is still there; ``close()`` and ``delete()`` first
mark the object gone, then look at the counts. So either the call sees the mark and fails
cleanly (ValueError, ClientClosedError), or the closer sees the call: ``close()`` waits for
it, and ``delete()`` leaves the object in ``client._deferred``, freed when the last such call
ends. No lock on the hot path: a few list operations per call.

The dispatch hot path (``Executable.execute``, ``Buffer.to_numpy``, a buffer's ``_free_now``)
writes these steps out instead of calling ``_begin``/``_end``: on Python 3.11 a frame costs
about 0.1 us, and together they were 0.6 us of a 7 us execute-and-read.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..errors import ClientClosedError

if TYPE_CHECKING:  # pragma: no cover - annotations only: the client is the layer above
    from ._client import Client


class OwnedHandle:
    """A buffer or executable handle owned by its client's registry and freed exactly once.

    ``_ptr`` is the handle while the object is usable and None once it is deleted; the
    registry entry (``client.<_REGISTRY>[id(self)]``) holds what is freed. Subclasses set
    ``_KIND`` and ``_REGISTRY`` and implement ``_destroy(entry)``.
    """

    __slots__ = ("_client", "_ptr")
    _KIND = "handle"
    _REGISTRY = ""
    #: The owning client (kept alive by this object).
    _client: Client
    #: The C handle while usable; None once deleted.
    _ptr: Any

    def _begin(self) -> Any:
        """Count a call on this object (and its client) and return the handle; raises if it is gone.

        Pair with :meth:`_end` in a ``finally``. Use only the returned handle in the call.
        """
        client = self._client
        client._calls.append(None)
        client._handle_calls.append(self)
        ptr = self._ptr
        if ptr is None or client._closed:
            self._end()
            raise self._gone_error()
        return ptr

    def _end(self) -> None:
        """The call counted by :meth:`_begin` is over; frees what was deleted while calls ran."""
        client = self._client
        client._handle_calls.remove(self)
        if client._deferred:
            free_deferred(client._deferred)
        client._calls.pop()

    @contextmanager
    def _call(self) -> Iterator[Any]:
        """``with obj._call() as ptr:`` a counted call; read what the plugin returns inside it."""
        ptr = self._begin()
        try:
            yield ptr
        finally:
            self._end()

    def _gone_error(self) -> Exception:
        if self._ptr is None:
            return ValueError(f"this {self._KIND} has been deleted")
        return ClientClosedError(f"this {self._KIND}'s client has been closed")

    def _in_use(self) -> bool:
        """Whether a call on this object is in flight (a buffer also checks the running executes)."""
        return self in self._client._handle_calls  # identity: handles do not define equality

    def _forget(self) -> None:
        """Mark the object deleted (new calls fail), then free it once no call on it is in flight."""
        if self._ptr is not None:
            self._ptr = None
            self._free_when_unused()

    def _free_when_unused(self) -> None:
        """Free this deleted object now, or when the last call using it ends."""
        deferred = self._client._deferred
        deferred.append(self)  # first: a call ending from now on sees it
        free_deferred(deferred)

    def _free_now(self) -> None:
        """Free the handle of a deleted object that no call uses, unless the client is closed
        (``close()`` frees everything). Counted on the client: ``close()`` waits for it."""
        client = self._client
        calls = client._calls
        calls.append(None)
        try:
            if not client._closed:
                entry = getattr(client, self._REGISTRY).pop(id(self), None)  # atomic: one caller wins
                if entry is not None:
                    self._destroy(entry)
        finally:
            calls.pop()

    def _destroy(self, entry: Any) -> None:
        raise NotImplementedError


def free_deferred(deferred: list[OwnedHandle]) -> None:
    """Free the deleted objects of ``deferred`` that no call uses any more (any thread may run this)."""
    for handle in list(deferred):
        if handle._in_use():
            continue
        try:
            deferred.remove(handle)  # atomic: one caller wins
        except ValueError:
            continue
        handle._free_now()


def wait_for_calls(calls: list[None], timeout: float | None, what: str) -> None:
    """Wait until ``calls`` (a client's count of calls in flight) is empty; TimeoutError after ``timeout`` s."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 1e-4
    while calls:
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(
                f"{len(calls)} call(s) on {what} were still running after {timeout:g} s; it stays closed to "
                "new calls and is released by a later close() once they end"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.01)
