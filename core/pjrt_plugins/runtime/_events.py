"""Waiting for PJRT events: interruptible by Ctrl-C and bounded in time.

``PJRT_Event_Await`` parks the calling thread inside the plugin: Ctrl-C is only seen once
it returns, and nothing can bound it. Here the caller checks which events are ready,
registers a ``PJRT_Event_OnReady`` callback on one that is not, and waits for that callback
in short slices; then it checks again. So ``KeyboardInterrupt`` arrives at once, a deadline
can be kept, and a wait on a plugin whose devices are host threads can notice that the
process stopped using CPU altogether: a deadlock inside the plugin (the documentation's
Architecture page, "Waiting for a plugin"). One callback at a time, because each costs a thread state and the GIL on a
plugin thread, and the devices of one execution finish together.

A wait that is given up (interrupted, timed out) stays registered, together with any host
memory the plugin may still write into, until its last callback has fired. If the process
exits before that, it ends (with its exit status) before the plugin's exit-time destructors
run: they free code and data the still-running execution uses, which crashed the process.
"""

from __future__ import annotations

import atexit
import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import cffi

from ..errors import PjrtError
from . import _fastpath
from ._cdef import ffi
from ._args import new_args

if TYPE_CHECKING:  # pragma: no cover
    from ._library import Library

logger = logging.getLogger(__name__)
_pjrtp_finish_ready: Any = _fastpath.library.pjrtp_finish_ready if _fastpath.library is not None else None

#: How long the waiting thread sleeps between checks of its deadline and of CPU progress.
WAIT_SLICE_S = 0.25
#: A stall: the whole process used less than this share of one core over ``stall_timeout``.
STALL_CPU_SHARE = 0.01

_abandoned: set[EventWait] = set()  # given-up waits, kept until their last callback fires
_abandoned_lock = threading.Lock()
_left_running = 0  # executions of clients left to the OS that no wait reports (see leave_running)


class WaitExpired(TimeoutError):
    """A wait passed its deadline (``reason="timeout"``) or saw no CPU progress (``"stalled"``)."""

    def __init__(self, reason: str, waited: float):
        self.reason = reason
        self.waited = waited
        super().__init__(f"{reason} after {waited:.1f} s")


class ReadyEvents:
    """Finishes events that are ready now: ``PJRT_Event_IsReady``, then ``PJRT_Event_Await``
    (which returns at once on a ready event) and ``PJRT_Event_Destroy``, with its own args
    structs and the library's functions bound once. With the compiled fast path all of it is one
    C call (``pjrtp_finish_ready``, or ``pjrtp_execute`` after an execute), whose status
    :meth:`outcome` reads; without it, the same calls from Python.

    One user at a time: an execute frame owns one, other waits take one from the library's
    pool (``lib.pool(ReadyEvents)``).
    """

    __slots__ = (
        "_lib", "_is_ready", "_await", "_destroy", "_is_ready_fn", "_await_fn", "_destroy_fn", "plan", "_arrays",
    )

    def __init__(self, lib: Library, capacity: int = 1) -> None:
        self._lib = lib
        self._is_ready = new_args("PJRT_Event_IsReady_Args")
        self._await = new_args("PJRT_Event_Await_Args")
        self._destroy = new_args("PJRT_Event_Destroy_Args")
        self._is_ready_fn = lib.function("PJRT_Event_IsReady")
        self._await_fn = lib.function("PJRT_Event_Await")
        self._destroy_fn = lib.function("PJRT_Event_Destroy")
        #: The PJRTP_EventPlan of the fast path (None without it), for pjrtp_execute too.
        self.plan = _fastpath.event_plan(
            (self._is_ready_fn, self._await_fn, self._destroy_fn), (self._is_ready, self._await, self._destroy)
        )
        self._arrays: tuple[Any, Any, Any] = (None, None, None)  # the plan's events, errors, destroy errors
        if self.plan is not None:
            self._reserve(capacity)

    def _reserve(self, count: int) -> None:
        """Make the plan's arrays hold ``count`` events."""
        events = ffi.new("PJRT_Event*[]", count)
        errors = ffi.new("PJRT_Error*[]", count)
        destroy_errors = ffi.new("PJRT_Error*[]", count)
        self.plan.errors, self.plan.destroy_errors = errors, destroy_errors
        self._arrays = (events, errors, destroy_errors)

    def errors(self, events: Sequence[Any], function: str) -> list[PjrtError | None] | None:
        """The events' errors attributed to ``function``, destroying the events, if every one
        (NULL ones aside) is ready now; else None, with nothing touched (also when the plugin
        cannot say whether they are ready). ``events``: a sequence or a cffi array of them."""
        if self.plan is None:
            return self._errors_in_python(events, function)
        count = len(events)
        array = self._arrays[0]
        if count > len(array):
            self._reserve(count)
            array = self._arrays[0]
        if not isinstance(events, ffi.CData):
            for i, event in enumerate(events):
                array[i] = event
            events = array
        return self.outcome(_pjrtp_finish_ready(self.plan, events, count), count, function)

    def outcome(self, status: int, count: int, function: str) -> list[PjrtError | None] | None:
        """The errors of ``count`` events after the fast path returned ``status`` for them (see
        :meth:`errors`); raises the first failing ``PJRT_Event_Destroy``."""
        if status == _fastpath.DONE:
            return [None] * count
        lib = self._lib
        plan = self.plan
        if status == _fastpath.DONE_WITH_ERRORS:  # every event awaited and destroyed: read the errors
            errors = [lib.error_to_exception(e, function) if e else None for e in plan.errors[0:count]]
            destroyed = [lib.error_to_exception(e, "PJRT_Event_Destroy") for e in plan.destroy_errors[0:count] if e]
            if destroyed:
                raise destroyed[0]
            return errors
        if status == _fastpath.READINESS_UNKNOWN:  # the plugin cannot say: the caller waits for callbacks
            lib.error_to_exception(plan.errors[0], "PJRT_Event_IsReady")  # read and destroyed
        elif status == _fastpath.INVALID_ARGUMENTS:  # a plan or count the runtime made wrongly: nothing touched
            raise RuntimeError(f"pjrtp_finish_ready refused its plan or its {count} event(s) (a bug in pjrt_plugins)")
        return None  # RUNNING: not done yet

    def _errors_in_python(self, events: Sequence[Any], function: str) -> list[PjrtError | None] | None:
        """:meth:`errors` without the fast path."""
        args = self._is_ready
        is_ready = self._is_ready_fn
        ready = []
        for event in events:
            if event:
                args.event = event
                err = is_ready(args)
                if err:  # the plugin cannot say: the caller waits for callbacks instead
                    self._lib.error_to_exception(err, "PJRT_Event_IsReady")  # read and destroyed
                    return None
                if not args.is_ready:
                    return None
            ready.append(event)
        return self.finish_all(ready, function)

    def finish_all(self, events: Sequence[Any], function: str) -> list[PjrtError | None]:
        """The errors of ready ``events`` attributed to ``function`` (None: it succeeded; NULL
        events give None), destroying each (``PJRT_Event_Await`` returns at once on a ready event).
        A failing ``PJRT_Event_Destroy`` is raised once every event is destroyed."""
        errors: list[PjrtError | None] = []
        destroy_errors: list[PjrtError] = []
        awaited, destroy = self._await, self._destroy
        for event in events:
            if event:
                awaited.event = event
                err = self._await_fn(awaited)
                destroy.event = event
                destroy_err = self._destroy_fn(destroy)
                if err or destroy_err:  # rare: read (and destroy) the errors, in order
                    errors.append(self._lib.error_to_exception(err, function) if err else None)
                    if destroy_err:
                        destroy_errors.append(self._lib.error_to_exception(destroy_err, "PJRT_Event_Destroy"))
                    continue
            errors.append(None)
        if destroy_errors:
            raise destroy_errors[0]
        return errors


def errors_if_ready(lib: Library, events: Sequence[Any], function: str) -> list[PjrtError | None] | None:
    """The events' errors, destroying the events, if every one is ready now; else None (nothing touched).

    The fast path of every wait: a program the plugin ran inline, or a host copy it finished
    at once, costs one ``PJRT_Event_IsReady`` more than a blocking await and nothing else.
    """
    pool = lib.pool(ReadyEvents)
    structs = pool.take()
    try:
        return structs.errors(events, function)
    finally:
        pool.give(structs)


class EventWait:
    """The events of one call; ``wait()`` returns each one's error (a :class:`PjrtError` or None).

    The wait owns the events and destroys each once it is ready or has a callback.
    ``keep_alive`` is held until every event is ready, even when the caller gives up: host
    memory the plugin writes into must outlive the plugin's write.
    """

    def __init__(self, lib: Library, events: Sequence[Any], function: str, keep_alive: Any = None) -> None:
        self.lib = lib
        self.function = function
        self.errors: list[PjrtError | None] = [None] * len(events)
        self._events: list[Any] = [None if event == ffi.NULL else event for event in events]  # None: handled
        self._keep_alive = keep_alive
        self._handles: dict[int, Any] = {}
        self._armed: set[int] = set()  # callbacks registered and not fired yet
        self._on_done: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._fired_signal: threading.Lock | None = None  # held while waiting; a callback releases it
        self._given_up = False

    # -- the plugin's side (callbacks) ------------------------------------------------

    def _fired(self, index: int, error: Any) -> None:
        """A callback: event ``index`` is ready (on a plugin thread, or inline if it already was)."""
        if error != ffi.NULL:
            try:
                self.errors[index] = self.lib.error_to_exception(error, self.function)
            except Exception as exc:  # noqa: BLE001 - a callback must not raise into the plugin
                self.errors[index] = PjrtError(2, f"could not read the event's error: {exc}", function=self.function)
        with self._lock:
            self._armed.discard(index)
            finished = self._given_up and not self._armed
            hooks = self._on_done if finished else []
        if self._fired_signal is not None:
            try:
                self._fired_signal.release()
            except RuntimeError:  # already released by another callback (a given-up wait arms several)
                pass
        if finished:
            with _abandoned_lock:
                _abandoned.discard(self)
            for hook in hooks:
                try:
                    hook()
                except Exception:  # noqa: BLE001
                    logger.exception("a hook run when an abandoned wait on %s completed failed", self.function)

    # -- the caller's side -------------------------------------------------------------

    @property
    def pending(self) -> list[int]:
        """Indices of the events not known to be ready."""
        with self._lock:
            return [i for i, event in enumerate(self._events) if event is not None or i in self._armed]

    @property
    def complete(self) -> bool:
        return not self.pending

    def when_complete(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` once a given-up wait's last callback fired (at once if none is pending)."""
        with self._lock:
            if self._armed:
                self._on_done.append(hook)
                return
        hook()

    def wait(self, timeout: float | None = None, stall_timeout: float | None = None) -> list[PjrtError | None]:
        """Wait for every event; returns their errors.

        Raises :class:`WaitExpired` after ``timeout`` seconds, or when the process used
        (almost) no CPU for ``stall_timeout`` seconds; ``KeyboardInterrupt`` and other
        exceptions pass through. After any of these the wait is given up (see the module).
        """
        watch: _Watch | None = None  # made only when the events are not all ready already
        try:
            while True:
                self._take_ready()
                with self._lock:
                    waiting = bool(self._armed)
                    unhandled = [i for i, event in enumerate(self._events) if event is not None]
                if not waiting and not unhandled:
                    return list(self.errors)
                if not waiting:
                    if not self.lib.has_function("PJRT_Event_OnReady"):
                        self._await(unhandled[0])  # no callbacks: the blocking wait is all there is
                        continue
                    if self._fired_signal is None:
                        self._fired_signal = threading.Lock()
                        self._fired_signal.acquire()
                    self._arm(unhandled[-1])  # devices start in order: the last tends to finish last
                if watch is None:
                    watch = _Watch(timeout, stall_timeout)
                assert self._fired_signal is not None  # made above before the first callback was armed
                watch.until(self._fired_signal)
        except BaseException:
            self._give_up()
            raise

    def _take_ready(self) -> None:
        """Handle every event not armed that is ready now."""
        for index, event in enumerate(self._events):
            if event is None:
                continue
            try:
                ready = self.lib.event_is_ready(event)
            except PjrtError:
                ready = False  # ask the callback instead
            if ready:
                self._await(index)

    def _await(self, index: int) -> None:
        """``PJRT_Event_Await`` on event ``index`` (ready: returns at once), then destroy it."""
        event, self._events[index] = self._events[index], None
        pool = self.lib.pool(ReadyEvents)
        structs = pool.take()
        try:
            self.errors[index] = structs.finish_all((event,), self.function)[0]
        finally:
            pool.give(structs)

    def _arm(self, index: int) -> None:
        """Register the callback on event ``index``, then destroy the event (the callback does not need it)."""
        event, self._events[index] = self._events[index], None
        handle = self._handles[index] = ffi.new_handle((self, index))
        with self._lock:
            self._armed.add(index)
        args = new_args("PJRT_Event_OnReady_Args")
        args.event = event
        args.callback = _on_ready
        args.user_arg = handle
        try:
            self.lib.call("PJRT_Event_OnReady", args)
        except BaseException:
            self._fired(index, ffi.NULL)  # not registered: nothing will call back
            raise
        finally:
            self.lib.destroy_event(event)

    def _give_up(self) -> None:
        """Arm every event left, so each is destroyed and this wait lives until the last fires."""
        if self.lib.has_function("PJRT_Event_OnReady"):
            for index, event in enumerate(self._events):
                if event is not None:
                    try:
                        self._arm(index)
                    except Exception as exc:  # noqa: BLE001 - keep arming the others
                        logger.warning("could not hand event %d of %s to a callback: %s", index, self.function, exc)
        with self._lock:
            if not self._armed:
                return
            self._given_up = True
        with _abandoned_lock:
            _abandoned.add(self)


class _Watch:
    """Waits on behalf of :meth:`EventWait.wait`: in slices, against a deadline and a stall bound."""

    def __init__(self, timeout: float | None, stall_timeout: float | None) -> None:
        self.timeout = timeout
        self.stall_timeout = stall_timeout
        self.start = time.monotonic()
        self.samples = deque([(self.start, time.process_time())])  # (wall, process CPU) over the stall window

    def until(self, signal: threading.Lock) -> None:
        """Return once a callback released ``signal`` (taken again); raise :class:`WaitExpired` past a bound."""
        while True:
            slice_s = WAIT_SLICE_S
            if self.timeout is not None:
                slice_s = max(0.0, min(slice_s, self.start + self.timeout - time.monotonic()))
            if signal.acquire(timeout=slice_s):
                return
            now = time.monotonic()
            if self.timeout is not None and now - self.start >= self.timeout:
                raise WaitExpired("timeout", now - self.start)
            if self.stall_timeout is not None and self._stalled(now):
                raise WaitExpired("stalled", now - self.start)

    def _stalled(self, now: float) -> bool:
        window = self.stall_timeout
        if window is None:
            return False
        cpu = time.process_time()
        samples = self.samples
        samples.append((now, cpu))
        while len(samples) > 1 and now - samples[1][0] >= window:
            samples.popleft()
        since, cpu_then = samples[0]
        # Watched throughout (a process stopped with Ctrl-Z and resumed has one long gap and
        # no CPU over it, and is not stuck), and no CPU used over the whole window.
        watched = len(samples) >= window / WAIT_SLICE_S / 2
        return now - since >= window and watched and cpu - cpu_then < STALL_CPU_SHARE * (now - since)


def abandoned_waits() -> int:
    """How many given-up waits still have events pending in a plugin."""
    with _abandoned_lock:
        return len(_abandoned)


def leave_running(count: int) -> None:
    """Note ``count`` executions that may still run in a plugin with no wait to report them
    (interrupted between their launch and their wait): the exit then skips the plugins' destructors."""
    global _left_running
    with _abandoned_lock:
        _left_running += count


def _end_before_plugin_destructors() -> None:
    """At interpreter exit: if executions given up on still run in a plugin, skip its destructors.

    Registered with ``atexit``; it arranges for ``exit()`` to call ``_exit(status)`` before any exit
    handler (the plugins' static destructors among them). glibc runs exit handlers newest first, and a
    plugin's thread still running a program can register one at any time: a static it initializes
    lazily (oneDNN's gemm kernels on the CPU plugin's first dot) registers its destructor when it is
    built, possibly after Python began exiting, and that destructor then ran first and freed the
    kernels the thread was still building (SIGSEGV). So the ``_exit`` handler is registered now and
    again at the start of ``exit()`` itself, from a destructor of the main thread's thread-locals,
    which glibc runs before the exit handlers: it is then the newest. An uncaught KeyboardInterrupt
    never reaches ``exit()``: Python ends with SIGINT then, which runs no destructors either.
    """
    pending = abandoned_waits() + _left_running
    if not pending:
        return
    libc = cffi.FFI()
    libc.cdef(
        "int on_exit(void (*function)(int, void *), void *arg); void _exit(int status);"
        "int __cxa_thread_atexit_impl(void (*function)(void *), void *obj, void *dso_symbol);"
    )
    try:
        c = libc.dlopen(None)
        on_exit = c.on_exit
        exit_now = libc.cast("void (*)(int, void *)", c._exit)  # called as _exit(status, arg): arg unused
    except (AttributeError, OSError) as exc:  # not glibc: nothing to arrange it with
        sys.stderr.write(f"pjrt-plugins: cannot skip the plugins' exit handlers ({exc}); the exit may crash\n")
        return
    on_exit(exit_now, libc.NULL)  # now: the newest so far (and what an exit() on another thread finds)
    try:
        # Again at exit(): on_exit(exit_now, <unused>), from the main thread's thread-local destructors. In
        # the SysV calling conventions (x86-64, AArch64) the unused argument register is ignored, as _exit
        # ignores the arg it is called with.
        register_then = libc.cast("void (*)(void *)", on_exit)
        c.__cxa_thread_atexit_impl(register_then, libc.cast("void *", exit_now), libc.NULL)
    except AttributeError:  # an older C library: the handler registered now has to do
        pass
    sys.stderr.write(
        f"pjrt-plugins: {pending} execution(s) given up on are still running in a plugin; "
        "exiting without running the plugins' exit handlers\n"
    )
    sys.stderr.flush()


atexit.register(_end_before_plugin_destructors)


def _callback_failed(exc_type: type[BaseException], value: BaseException, tb: Any) -> None:
    logger.error("PJRT_Event_OnReady callback failed", exc_info=(exc_type, value, tb))


def _event_ready(error: Any, user_arg: Any) -> None:
    wait, index = ffi.from_handle(user_arg)
    try:
        wait._fired(index, error)
    finally:
        wait._handles.pop(index, None)  # fired once: the handle (which refers back to the wait) is done


#: The C callback given to PJRT_Event_OnReady: calls :func:`_event_ready` on a plugin thread.
_on_ready: Any = ffi.callback("PJRT_Event_OnReadyCallback", onerror=_callback_failed)(_event_ready)
