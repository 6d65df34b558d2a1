"""Plugin calls that may never return, run on a daemon thread and waited for with a time limit.

A plugin cannot be interrupted: past the limit the caller gets PluginTimeoutError and the
thread is left behind. What a call finishes after its caller gave up goes to the ``abandon``
callback given to :meth:`BoundedCall.give_up` (a client nobody will use is destroyed there).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)
T = TypeVar("T")


class BoundedCall(Generic[T]):
    """``target()`` started at once on a daemon thread named ``name``; any number of waiters."""

    def __init__(self, target: Callable[[], T], name: str) -> None:
        self._target = target
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._abandon: Callable[[T], Any] | None = None
        self.result: T | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        try:
            self.result = self._target()
        except BaseException as exc:  # handed to the waiters, never lost
            self.error = exc
        with self._lock:
            self._done.set()
            abandon = self._abandon
        if abandon is not None and self.error is None:
            _clean_up(abandon, self.result)

    def wait(self, timeout: float | None) -> bool:
        """Whether the call has returned, waiting up to ``timeout`` seconds (None: as long as it takes)."""
        return self._done.wait(timeout)

    def outcome(self) -> T:
        """The call's result, or its exception raised here (after :meth:`wait` returned True)."""
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]

    def give_up(self, abandon: Callable[[T], Any]) -> None:
        """Nobody will use the result: pass it to ``abandon`` when (or if) the call returns."""
        with self._lock:
            if not self._done.is_set():
                self._abandon = abandon
                return
        if self.error is None:
            _clean_up(abandon, self.result)


def _clean_up(abandon: Callable[[Any], Any], result: Any) -> None:
    try:
        abandon(result)
    except Exception as exc:  # noqa: BLE001 - nobody is left to report it to
        logger.warning("cleaning up after a plugin call that returned too late failed: %s", exc)
