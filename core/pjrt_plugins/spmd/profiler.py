"""Step profiling with PyTorch/XLA's names (``torch_xla.debug.profiler as xp``): ``start_trace``/``stop_trace``,
``Trace`` and ``StepTrace`` annotations, ``trace_me``.

Why: to see where a training step's time goes on the host (data loading, tracing the step, the
program's run inside ``sync``) next to what the plugin's devices did. The annotations are host
spans, written as a Chrome trace (JSON that Perfetto and ``chrome://tracing`` open); when the
plugin has the PJRT profiler extension, its device profile is recorded over the same interval
(:func:`pjrt_plugins.profiler.trace`: XProf's ``.xplane.pb`` and a Perfetto trace). A plugin
without the extension gives host spans only, and :func:`start_trace` warns that it does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from .. import profiler as _plugin_profiler
from .devices import metrics, virtual_device
from .frontend import engine

logger = logging.getLogger(__name__)

__all__ = ["ProfileResult", "StepTrace", "Trace", "start_trace", "stop_trace", "trace_me"]

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass
class ProfileResult:
    """What :func:`stop_trace` wrote: the host spans' Chrome trace, and the plugin's profile when it has one."""

    log_dir: Path
    host_trace_path: Path
    #: Spans recorded (``Trace``/``StepTrace`` blocks that ended while tracing).
    spans: int = 0
    #: The plugin's profile (``None``: the plugin has no profiler extension).
    device_trace: _plugin_profiler.Trace | None = None


@dataclass
class _Session:
    log_dir: Path
    start_ns: int
    events: list[dict[str, Any]] = field(default_factory=list)
    threads: dict[int, str] = field(default_factory=dict)
    device: contextlib.ExitStack | None = None
    device_trace: _plugin_profiler.Trace | None = None


_lock = threading.Lock()
_session: _Session | None = None


class Trace:
    """A named span of host time, recorded while a trace runs (:func:`start_trace`); ``kwargs`` become its
    arguments in the trace viewer. Cheap when no trace runs. A context manager:

    Example::

        with xp.Trace("forward", layer=3):
            out = model(x)
    """

    def __init__(self, name: str, **kwargs: Any) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a trace span needs a non-empty name, got {name!r}")
        self.name = name
        self.kwargs = kwargs
        self._start_ns: int | None = None

    def __enter__(self) -> Trace:
        self._start_ns = time.perf_counter_ns() if _session is not None else None
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._record()

    def _record(self) -> None:
        start, self._start_ns = self._start_ns, None
        session = _session
        if start is None or session is None:
            return
        end = time.perf_counter_ns()
        thread = threading.current_thread()
        event = {"name": self.name, "ph": "X", "pid": os.getpid(), "tid": thread.ident,
                 "ts": (start - session.start_ns) / 1000, "dur": (end - start) / 1000,
                 "args": {k: _json_value(v) for k, v in self.kwargs.items()}}
        with _lock:
            if _session is session:
                session.events.append(event)
                session.threads.setdefault(thread.ident or 0, thread.name)


class StepTrace(Trace):
    """A :class:`Trace` around one training step that ends it: on exit the pending step runs (``xs.sync()``),
    inside the span, so its time includes the step's program. The span's arguments add the programs
    compiled and run during the step (``compiles``, ``executions``).

    Example::

        for step, (x, y) in enumerate(loader):
            with xp.StepTrace("train_step", step_num=step):
                loss = loss_fn(model(x), y); loss.backward(); opt.step()
    """

    def __enter__(self) -> StepTrace:
        self._before = metrics()
        super().__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc_type is None:
                engine().sync()
        finally:
            after = metrics()
            self.kwargs = {**self.kwargs, "compiles": after.compiles - self._before.compiles,
                           "executions": after.executions - self._before.executions}
            self._record()


def trace_me(scope: str) -> Callable[[_F], _F]:
    """A decorator: each call of the function is a :class:`Trace` span named ``scope``."""

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def traced(*args: Any, **kwargs: Any) -> Any:
            with Trace(scope):
                return fn(*args, **kwargs)

        return traced  # type: ignore[return-value]

    return decorate


def start_trace(log_dir: str | os.PathLike[str], plugin: Any = None) -> None:
    """Start recording :class:`Trace` spans, and the plugin's device profile if it has a profiler.

    ``plugin`` is the one to profile (default: the virtual device's; see
    :func:`pjrt_plugins.profiler.plugin_library`). One trace at a time: a second ``start_trace``
    raises ``RuntimeError``, as in PyTorch/XLA. :func:`stop_trace` writes the results under
    ``log_dir``. Warns when the plugin has no profiler extension: the trace then holds host spans only.
    """
    global _session
    with _lock:
        if _session is not None:
            raise RuntimeError("Profile has already been started: only one profile may run at a time "
                               "(call stop_trace() first)")
        log_dir = Path(log_dir)
        library = _plugin_profiler.plugin_library(virtual_device() if plugin is None else plugin)
        session = _Session(log_dir, time.perf_counter_ns())
        if _plugin_profiler.has_profiler(library):
            stack = contextlib.ExitStack()
            session.device_trace = stack.enter_context(_plugin_profiler.trace(log_dir, library))
            session.device = stack
        else:
            warnings.warn(f"the plugin ({Path(library.path).name}) has no PJRT profiler extension: this plugin does "
                          "not provide device traces, and the trace holds the host spans only", UserWarning,
                          stacklevel=2)
        _session = session


def stop_trace() -> ProfileResult:
    """Stop the trace :func:`start_trace` began and write it: the host spans as a Chrome trace JSON file
    (``log_dir/pjrt_host_trace_<time>.json``, for Perfetto or ``chrome://tracing``) and, if recorded, the
    plugin's profile (``log_dir/plugins/profile/...``, for TensorBoard/XProf). Raises ``RuntimeError``
    when no trace runs."""
    global _session
    with _lock:
        session = _session
        if session is None:
            raise RuntimeError("No profile started: call start_trace(log_dir) first")
        _session = None
    if session.device is not None:
        session.device.close()  # the plugin's profile is written here
    session.log_dir.mkdir(parents=True, exist_ok=True)
    path = session.log_dir / f"pjrt_host_trace_{time.strftime('%Y_%m_%d_%H_%M_%S')}.json"
    suffix = 1
    while path.exists():
        suffix += 1
        path = session.log_dir / f"pjrt_host_trace_{time.strftime('%Y_%m_%d_%H_%M_%S')}_{suffix}.json"
    names = [{"name": "thread_name", "ph": "M", "pid": os.getpid(), "tid": tid, "args": {"name": name}}
             for tid, name in session.threads.items()]
    path.write_text(json.dumps({"traceEvents": names + session.events, "displayTimeUnit": "ms"}))
    logger.info("wrote %d host spans to %s", len(session.events), path)
    return ProfileResult(session.log_dir, path, len(session.events), session.device_trace)


def _json_value(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool)) or value is None else repr(value)
