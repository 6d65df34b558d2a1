"""Step closures: functions queued to run right after the next ``sync`` (PyTorch/XLA's ``xm.add_step_closure``).

Why: reading a tensor in the middle of a step (a loss to print, a metric to log) runs the pending
graph there, splitting the step into two programs. A closure queued with its tensors runs once the
step's program has run, when they hold device data, so reading them costs a transfer and no extra
program. Synchronous closures run on the thread that called ``sync``, in the order they were
queued; asynchronous ones run in that order on one background thread, and an exception one of
them raised is raised by the next ``sync``.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["add_step_closure", "run_step_closures", "wait_async_closures"]

logger = logging.getLogger(__name__)

#: Environment variable PyTorch/XLA reads for the length of the asynchronous closure queue.
MAX_ASYNC_QUEUE_ENV = "XLA_MAX_ASYNC_QUEUE"

_lock = threading.Lock()
_closures: list[Callable[[], Any]] = []
_async_closures: list[Callable[[], Any]] = []
_worker: _AsyncWorker | None = None


class _AsyncWorker:
    """One daemon thread running queued closures in order; the first exception is kept for the caller."""

    def __init__(self, max_queue: int) -> None:
        self.queue: queue.Queue[Callable[[], Any]] = queue.Queue(max_queue)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="pjrt-step-closures", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            closure = self.queue.get()
            try:
                if self.error is None:
                    closure()
            except BaseException as exc:  # noqa: BLE001 - handed to the next sync on the caller's thread
                logger.debug("an asynchronous step closure raised %r", exc)
                self.error = exc
            finally:
                self.queue.task_done()

    def raise_error(self) -> None:
        error, self.error = self.error, None
        if error is not None:
            raise RuntimeError(f"an asynchronous step closure raised {type(error).__name__}: {error}") from error


def add_step_closure(closure: Callable[..., Any], args: tuple[Any, ...] = (), run_async: bool = False) -> None:
    """Queue ``closure(*args)`` to run after the next ``sync`` (on a background thread if ``run_async``)."""
    if not callable(closure):
        raise TypeError(f"add_step_closure needs a callable, got {type(closure).__name__}")
    if not isinstance(args, tuple):
        raise TypeError(f"add_step_closure's args must be a tuple, got {type(args).__name__}")
    with _lock:
        (_async_closures if run_async else _closures).append(lambda: closure(*args))


def _async_worker() -> _AsyncWorker:
    global _worker
    if _worker is None:
        raw = os.environ.get(MAX_ASYNC_QUEUE_ENV, "100")
        try:
            size = int(raw)
        except ValueError:
            raise ValueError(f"{MAX_ASYNC_QUEUE_ENV}={raw!r} is not an integer (the asynchronous step closure "
                             "queue's length)") from None
        _worker = _AsyncWorker(size)
    return _worker


def run_step_closures() -> None:
    """Run the queued closures (``sync`` calls it after running the step): the asynchronous ones are handed to
    the background thread first, then the synchronous ones run here, in order."""
    with _lock:
        pending_async = _async_closures[:]
        _async_closures.clear()
        pending = _closures[:]
        _closures.clear()
    if pending_async or _worker is not None:
        worker = _async_worker()
        worker.raise_error()
        for closure in pending_async:
            worker.queue.put(closure)
    for closure in pending:
        closure()


def wait_async_closures() -> None:
    """Block until the asynchronous closures queued so far have run; raise the exception one raised."""
    if _worker is not None:
        _worker.queue.join()
        _worker.raise_error()
