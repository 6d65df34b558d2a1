"""Open a PJRT plugin library once, check its API version, and call its functions safely.

Every call goes through a slot that was checked against the plugin's ``struct_size`` and
version, for NULL, and for pointing into executable memory; every ``PJRT_Error`` becomes a
:class:`PjrtError` and is destroyed. The file's ELF headers are checked before dlopen; the
opening (dlopen, ``GetPjrtApi``) and ``PJRT_Plugin_Initialize`` are bounded in time. A
library is opened with ``RTLD_NOW | RTLD_NODELETE`` and never closed: closing a plugin under
its live static state crashes the process at exit.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from .._native_logs import apply_native_log_settings
from .._timeouts import DEFAULT_INITIALIZE_TIMEOUT_S, checked_timeout
from ..errors import (
    ApiVersionError,
    LibraryLoadError,
    PjrtError,
    PluginInitializeTimeoutError,
    PluginTimeoutError,
    UnsupportedFunctionError,
)
from . import _cdef, _events
from ._args import Pool, args_pool, broken_answer, checked_count, new_args, version_text
from ._bounded import BoundedCall
from ._cdef import API_MAJOR, HEADER_MINOR, MIN_SUPPORTED_MINOR, STRUCT_SIZE, ffi
from ._code_map import is_executable_address
from ._elf import check_shared_library
from ._named_values import decode_named_values

logger = logging.getLogger(__name__)
T = TypeVar("T")

_MAX_EXTENSIONS = 256
_load_lock = threading.Lock()
_libraries: dict[str, Library] = {}
_opening: dict[str, BoundedCall[Library]] = {}  # by resolved path, while dlopen/GetPjrtApi run

# Essential functions: without them no error can be read or freed, so such a library is refused.
_ERROR_FUNCTIONS = ("PJRT_Error_Destroy", "PJRT_Error_Message", "PJRT_Error_GetCode")
_STRUCT_SIZE_HINT = re.compile(r"Unexpected \S+ size: expected \d+, got \d+")


def load_library(path: str | os.PathLike[str], timeout: float | None = None) -> Library:
    """Open the PJRT plugin at ``path`` (once per resolved path) without initializing it.

    Raises :class:`LibraryLoadError` for a missing file, a file that is not a shared
    library of this machine, a truncated one, or one without ``GetPjrtApi``;
    :class:`ApiVersionError` for a major version we do not speak or a minor below
    :data:`MIN_SUPPORTED_MINOR`; :class:`PluginConfigurationError` for a malformed
    ``PJRT_PLUGINS_LOG_LEVEL`` (applied first); :class:`PluginTimeoutError` when dlopen and ``GetPjrtApi``
    have not returned within ``timeout`` seconds (default: 60; a later call waits for the
    same attempt).
    """
    timeout = checked_timeout(timeout, "load_library(timeout)")
    given = Path(os.fspath(path))
    if not given.exists():
        raise LibraryLoadError(f"PJRT plugin library {str(given)!r} does not exist")
    if not given.is_file():
        raise LibraryLoadError(f"PJRT plugin library {str(given)!r} is not a regular file")
    resolved = os.path.realpath(given)
    apply_native_log_settings()  # plugins read their logging variables when they are loaded
    with _load_lock:
        library = _libraries.get(resolved)
        if library is not None:
            return library
        opening = _opening.get(resolved)
        if opening is None:
            opening = _opening[resolved] = BoundedCall(
                lambda: _open_once(resolved), f"pjrt-open:{os.path.basename(resolved)}"
            )
    if timeout is None:
        timeout = DEFAULT_INITIALIZE_TIMEOUT_S
    if not opening.wait(timeout):
        raise PluginTimeoutError(
            f"opening {resolved!r} (dlopen and GetPjrtApi) did not return within {timeout:g} s. A static "
            "initializer of the library (or of one it needs) is blocked; the process cannot load other "
            "libraries safely now. Check the plugin's installation and its dependencies."
        )
    return opening.outcome()


def _open_once(path: str) -> Library:
    """Open and register the library at resolved ``path`` (runs on the opening thread)."""
    try:
        library = Library._open(path)
        with _load_lock:
            return _libraries.setdefault(path, library)
    finally:
        with _load_lock:
            _opening.pop(path, None)


def loaded_libraries() -> dict[str, Library]:
    """Every library opened in this process, by resolved path."""
    with _load_lock:
        return dict(_libraries)


class Library:
    """One opened PJRT plugin: its ``PJRT_Api`` table, version, attributes and extensions.

    Get one with :func:`load_library`; do not construct it directly.
    """

    def __init__(self, path: str, handle: Any, api: Any) -> None:
        self.path = path
        self.name = os.path.basename(path)
        self._handle = handle  # kept forever: the library is never closed
        self._api = api
        self.api_struct_size = int(api.struct_size)
        #: ``PJRT_Api.pjrt_api_version.struct_size`` as the plugin reports it.
        self.api_version_struct_size = int(api.pjrt_api_version.struct_size)
        self.api_version: tuple[int, int] = (
            int(api.pjrt_api_version.major_version),
            int(api.pjrt_api_version.minor_version),
        )
        self._fns: dict[str, Any] = {}
        self._init_lock = threading.Lock()
        self._init_call: BoundedCall[None] | None = None
        self._initialized = False
        self._attributes: dict[str, Any] | None = None
        self._error_message: Any = None  # the three error functions, bound at _open
        self._error_get_code: Any = None
        self._error_destroy: Any = None
        self._pools: dict[Callable[[Library], Any], Pool[Any]] = {}

    # -- opening ---------------------------------------------------------------------

    @classmethod
    def _open(cls, path: str) -> Library:
        check_shared_library(path)  # a truncated file would crash inside dlopen
        try:
            handle = ffi.dlopen(path, ffi.RTLD_NOW | ffi.RTLD_LOCAL | ffi.RTLD_NODELETE)
        except OSError as exc:
            raise LibraryLoadError(f"cannot open PJRT plugin library {path!r}: {exc}") from exc
        try:
            get_api = handle.GetPjrtApi
        except AttributeError:
            raise LibraryLoadError(
                f"{path!r} does not export GetPjrtApi, so it is not a PJRT plugin library"
            ) from None
        api = get_api()
        if api == ffi.NULL:
            raise LibraryLoadError(f"GetPjrtApi() in {path!r} returned NULL")
        size = int(api.struct_size)
        header = ffi.offsetof("PJRT_Api", "PJRT_Error_Destroy")
        if size < header:
            raise LibraryLoadError(
                f"{path!r} reports a PJRT_Api of {size} bytes, smaller than its {header}-byte header; "
                "it is not a PJRT plugin we can talk to"
            )
        library = cls(path, handle, api)
        library._check_version()
        try:
            library._error_destroy, library._error_message, library._error_get_code = map(
                library._fn, _ERROR_FUNCTIONS
            )
        except UnsupportedFunctionError as exc:
            raise LibraryLoadError(f"{path!r} cannot report errors: {exc}") from None
        logger.debug(
            "opened PJRT plugin %s (API %s, %d-byte table)", path, version_text(library.api_version), size
        )
        return library

    def _check_version(self) -> None:
        major, minor = self.api_version
        supported = f"0.{MIN_SUPPORTED_MINOR} and newer (laid out as 0.{HEADER_MINOR})"
        if major != API_MAJOR:
            raise ApiVersionError(
                f"{self.path!r} speaks PJRT C API {major}.{minor}, but pjrt-plugins speaks major "
                f"version {API_MAJOR} ({supported}). A major version is an ABI break: install a "
                "plugin built for PJRT C API 0.x or a pjrt-plugins release that speaks "
                f"{major}.x."
            )
        if minor < MIN_SUPPORTED_MINOR:
            raise ApiVersionError(
                f"{self.path!r} speaks PJRT C API {major}.{minor}, older than 0.{MIN_SUPPORTED_MINOR}, "
                f"the oldest pjrt-plugins supports: PJRT 0.{MIN_SUPPORTED_MINOR} rearranged the "
                "function table of PJRT_Api, so an older plugin's functions sit at other positions "
                "and calling them would crash. Install a newer build of the plugin."
            )
        if minor > HEADER_MINOR:
            logger.info(
                "%s speaks PJRT C API %d.%d, newer than the 0.%d layout pjrt-plugins knows; "
                "functions and fields added since are not used",
                self.path,
                major,
                minor,
                HEADER_MINOR,
            )

    # -- slots -----------------------------------------------------------------------

    def has_function(self, name: str) -> bool:
        """Whether the plugin provides C API function ``name`` (in its table and version, non-NULL, code)."""
        try:
            self._fn(name)
        except UnsupportedFunctionError:
            return False
        return True

    def function(self, name: str) -> Any:
        """The cffi function pointer ``name``, checked against struct_size, the plugin's version,
        for NULL and for pointing into executable memory.

        Raises :class:`UnsupportedFunctionError` (naming the function, the plugin's version
        and the version that added it) when the plugin does not provide it.
        """
        return self._fns.get(name) or self._fn(name)

    def _fn(self, name: str) -> Any:
        fn = self._fns.get(name)
        if fn is not None:
            return fn
        slot = _cdef.SLOTS_BY_NAME.get(name)
        if slot is None:
            raise KeyError(f"{name!r} is not a PJRT C API function known to pjrt-plugins")
        end = _cdef.slot_end(name)
        if end > self.api_struct_size:
            raise self._unsupported(
                name, f"its PJRT_Api table has {self.api_struct_size} bytes and this slot needs {end}"
            )
        if self.api_version[1] < slot.added and name not in _cdef.ADDED_BY_AT_LATEST:
            # A table cannot hold slots newer than its version: a larger struct_size overstates it.
            raise self._unsupported(
                name, f"its PJRT_Api table claims {self.api_struct_size} bytes, more than its version has"
            )
        fn = getattr(self._api, name)
        if fn == ffi.NULL:
            raise self._unsupported(name, "the plugin leaves this function unset (NULL)")
        if not is_executable_address(int(ffi.cast("uintptr_t", fn))):
            raise self._unsupported(
                name, "this slot does not point into executable code (the table is shorter than its "
                "struct_size claims, or damaged); it is never called"
            )
        self._fns[name] = fn
        return fn

    def _unsupported(self, name: str, reason: str) -> UnsupportedFunctionError:
        slot = _cdef.SLOTS_BY_NAME[name]
        if name in _cdef.ADDED_BY_AT_LATEST:
            added = f"added by PJRT C API 0.{slot.added}"
        elif slot.added <= MIN_SUPPORTED_MINOR:
            added = f"part of every PJRT C API since before 0.{MIN_SUPPORTED_MINOR}"
        else:
            added = f"added in PJRT C API 0.{slot.added}"
        have = version_text(self.api_version)
        advice = (
            "upgrade the plugin" if self.api_version[1] < slot.added else "the plugin does not implement it"
        )
        error = UnsupportedFunctionError(
            f"{name} is not available in {self.name} (PJRT C API {have}): {reason}. "
            f"{name} was {added}; {advice}."
        )
        error.function = name
        error.plugin_version = self.api_version
        error.added_in = (API_MAJOR, slot.added)
        return error

    def pool(self, kind: Callable[[Library], T]) -> Pool[T]:
        """This library's :class:`Pool` of ``kind(self)`` objects (args structs with its functions bound)."""
        pool = self._pools.get(kind)
        if pool is None:
            pool = self._pools.setdefault(kind, Pool(functools.partial(kind, self)))
        return pool

    def broken_answer(self, function: str, what: str) -> PjrtError:
        """The error for ``function`` reporting success with an answer that cannot be used
        (``what``: "returned no executable"); never used, as using it would crash the process."""
        return broken_answer(function, what, repr(self.name))

    def count(self, pointer: Any, count: int, function: str, what: str) -> int:
        """``count`` items of ``function``'s answer at ``pointer``, checked before any is read
        (not NULL when there are some, not more than any plugin has)."""
        return checked_count(pointer, count, function, what, repr(self.name))

    def supports_field(self, struct: str, field: str) -> bool:
        """Whether a plugin of this version knows ``struct.field`` (appended fields)."""
        added = _cdef.FIELDS_ADDED.get((struct, field))
        return added is None or self.api_version[1] >= added

    # -- calls and errors ------------------------------------------------------------

    def call(self, name: str, args: Any) -> None:
        """Call ``name(args)``; a returned PJRT_Error is destroyed and raised as PjrtError."""
        err = (self._fns.get(name) or self._fn(name))(args)
        if err:
            raise self.error_to_exception(err, name)

    def invoke(self, name: str, **fields: Any) -> Any:
        """:meth:`call` ``name`` with a fresh args struct holding ``fields``; returns the struct to
        read the results from: ``lib.invoke("PJRT_Buffer_Device", buffer=ptr).device``.

        The struct type comes from the slot table, so it always matches the function. Hot
        paths fill (and reuse) their own structs and use :meth:`call`.
        """
        self._fn(name)  # an unknown or unsupported function raises before a struct is made for it
        struct = _cdef.SLOTS_BY_NAME[name].args
        if struct is None:
            raise TypeError(f"{name} takes no args struct; call it through library.function({name!r})")
        args = new_args(struct)
        for field, value in fields.items():
            setattr(args, field, value)
        self.call(name, args)
        return args

    def error_to_exception(self, err: Any, function: str | None = None) -> PjrtError:
        """Read a PJRT_Error's code and message, destroy it, and return the exception."""
        code, message = 2, "(the plugin gave no message)"
        try:
            margs = new_args("PJRT_Error_Message_Args")
            margs.error = err
            self._error_message(margs)
            if margs.message != ffi.NULL:
                message = ffi.unpack(margs.message, margs.message_size).decode("utf-8", "replace")
            cargs = new_args("PJRT_Error_GetCode_Args")
            cargs.error = err
            code_err = self._error_get_code(cargs)
            if code_err:
                self._destroy_error(code_err)
            else:
                code = int(cargs.code)
        finally:
            self._destroy_error(err)
        hint = None
        if _STRUCT_SIZE_HINT.search(message):
            hint = (
                f"the plugin ({self.name}, PJRT C API {version_text(self.api_version)}) expects a newer "
                f"args struct than pjrt-plugins' 0.{HEADER_MINOR} layout; upgrade pjrt-plugins or use "
                "a plugin build for an older PJRT C API."
            )
        return PjrtError(code, message, function=function, hint=hint)

    def _destroy_error(self, err: Any) -> None:
        dargs = new_args("PJRT_Error_Destroy_Args")
        dargs.error = err
        self._error_destroy(dargs)

    # -- events ----------------------------------------------------------------------

    def await_event(
        self, event: Any, function: str, *, timeout: float | None = None, keep_alive: Any = None
    ) -> None:
        """Wait until ``event`` is ready, destroy it, raise its error if any.

        Ctrl-C interrupts the wait (see ``_events``); ``timeout`` seconds bound it
        (``TimeoutError``). ``keep_alive``: host memory the plugin writes into, held until
        the event fires even when the wait is given up.
        """
        if event == ffi.NULL:
            return
        if timeout is not None:
            timeout = checked_timeout(timeout, "await_event(timeout)")
        errors = _events.errors_if_ready(self, (event,), function)
        if errors is None:
            try:
                errors = _events.EventWait(self, (event,), function, keep_alive=keep_alive).wait(timeout)
            except _events.WaitExpired as exc:
                raise TimeoutError(f"{function} did not complete within {timeout:g} s ({exc})") from None
        if errors[0] is not None:
            raise errors[0]

    # event_is_ready and destroy_event run on every upload: pooled structs, filled by hand, not
    # through invoke().
    def event_is_ready(self, event: Any) -> bool:
        pool = _IS_READY
        args = pool.take()
        args.event = event
        err = (self._fns.get("PJRT_Event_IsReady") or self._fn("PJRT_Event_IsReady"))(args)
        if err:
            raise self.error_to_exception(err, "PJRT_Event_IsReady")
        ready = bool(args.is_ready)
        pool.give(args)
        return ready

    def destroy_event(self, event: Any) -> None:
        pool = _DESTROY_EVENT
        args = pool.take()
        args.event = event
        err = (self._fns.get("PJRT_Event_Destroy") or self._fn("PJRT_Event_Destroy"))(args)
        if err:
            raise self.error_to_exception(err, "PJRT_Event_Destroy")
        pool.give(args)

    # -- initialize and attributes ---------------------------------------------------

    @property
    def initialized(self) -> bool:
        return self._initialized

    def initialize(self, timeout: float | None = None) -> None:
        """Run ``PJRT_Plugin_Initialize`` once per library, waiting at most ``timeout`` s.

        The call runs in a daemon thread: if it does not return in time,
        :class:`PluginInitializeTimeoutError` is raised and the thread is left behind (a
        plugin cannot be interrupted). A later call waits for that same first attempt.
        """
        timeout = checked_timeout(timeout, "Library.initialize(timeout)")
        if self._initialized:
            return
        if timeout is None:
            timeout = DEFAULT_INITIALIZE_TIMEOUT_S
        with self._init_lock:
            if self._init_call is None:
                self._init_call = BoundedCall(self._run_initialize, f"pjrt-initialize:{self.name}")
        if not self._init_call.wait(timeout):
            raise PluginInitializeTimeoutError(
                f"PJRT_Plugin_Initialize in {self.name} did not return within {timeout:g} s. The "
                "plugin may be waiting for hardware or a service that is not there; check that the "
                "device is present, or raise the plugin's initialize timeout."
            )
        self._init_call.outcome()
        self._initialized = True

    def _run_initialize(self) -> None:
        if not self.has_function("PJRT_Plugin_Initialize"):
            logger.debug("%s has no PJRT_Plugin_Initialize; nothing to run", self.name)
        else:
            self.invoke("PJRT_Plugin_Initialize")

    @property
    def attributes(self) -> dict[str, Any]:
        """The plugin's attributes (``xla_version``, ``stablehlo_current_version``, ...).

        Initializes the library first. Lists come back as tuples.
        """
        if self._attributes is None:
            self.initialize()
            if not self.has_function("PJRT_Plugin_Attributes"):
                self._attributes = {}
            else:
                args = self.invoke("PJRT_Plugin_Attributes")
                self._attributes = decode_named_values(args.attributes, args.num_attributes, "PJRT_Plugin_Attributes")
        return dict(self._attributes)

    # -- extensions ------------------------------------------------------------------

    @property
    def extensions(self) -> list[tuple[int, str]]:
        """``[(type id, name)]`` of the plugin's extension chain (bounded, cycle-safe)."""
        return [(kind, name) for kind, name, _ in self._walk_extensions()]

    def find_extension(self, name: str) -> Any:
        """The first extension of type ``name`` (e.g. ``"Profiler"``) as a ``PJRT_Extension_Base*``, or None."""
        return next((node for _, found, node in self._walk_extensions() if found == name), None)

    def _walk_extensions(self) -> Iterator[tuple[int, str, Any]]:
        base_size = STRUCT_SIZE["PJRT_Extension_Base"]
        seen: set[int] = set()
        node = self._api.extension_start
        while node != ffi.NULL:
            address = int(ffi.cast("uintptr_t", node))
            if address in seen:
                logger.warning("%s: the extension chain loops back to %#x; stopped there", self.name, address)
                return
            if len(seen) >= _MAX_EXTENSIONS:
                logger.warning("%s: more than %d extensions; stopped there", self.name, _MAX_EXTENSIONS)
                return
            seen.add(address)
            size = int(node.struct_size)
            if size < base_size:
                logger.warning(
                    "%s: extension at %#x reports struct_size %d (< %d); stopped there",
                    self.name,
                    address,
                    size,
                    base_size,
                )
                return
            kind = int(ffi.cast("int", node.type))
            yield kind, _cdef.EXTENSION_TYPE_NAMES.get(kind, f"Unknown{kind}"), node
            node = node.next

    def __repr__(self) -> str:
        return f"<pjrt Library {self.path!r} API {version_text(self.api_version)}>"


_IS_READY = args_pool("PJRT_Event_IsReady_Args")
_DESTROY_EVENT = args_pool("PJRT_Event_Destroy_Args")
