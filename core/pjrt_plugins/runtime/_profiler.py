"""A plugin's own profiler: the Profiler extension's ``PLUGIN_Profiler_Api`` (create, start, stop, collect).

What it collects is an XSpace (XLA's profile format) of what the plugin saw: device activity,
its own host-side trace events. Every struct the plugin hands over is bounds-checked against its
``struct_size``; a plugin without a usable extension raises
:class:`~pjrt_plugins.UnsupportedExtensionError`. Never initializes the plugin or creates a client.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..errors import PjrtError, UnsupportedExtensionError
from ._cdef import ffi, field_end
from ._args import new_args, unpack_text
from ._library import Library
from ._proto import length_delimited_fields

logger = logging.getLogger(__name__)

_PROFILER_FUNCTIONS = ("error_destroy", "error_message", "error_get_code", "create", "destroy", "start", "stop",
                       "collect_data")


def profiler_api(library: Library) -> Any:
    """The plugin's ``PLUGIN_Profiler_Api*``, checked; :class:`UnsupportedExtensionError` when it has none."""
    node = library.find_extension("Profiler")
    if node is None:
        raise _unsupported(library, "it has no Profiler extension")
    extension = ffi.cast("PJRT_Profiler_Extension*", node)
    needed = field_end("PJRT_Profiler_Extension", "profiler_api")
    if int(extension.struct_size) < needed:
        raise _unsupported(library, f"its Profiler extension has {int(extension.struct_size)} bytes, "
                                    f"fewer than the {needed} that hold the profiler")
    api = extension.profiler_api
    if api == ffi.NULL:
        raise _unsupported(library, "its Profiler extension carries no profiler (only trace context ids)")
    needed = field_end("PLUGIN_Profiler_Api", "collect_data")
    if int(api.struct_size) < needed:
        raise _unsupported(library, f"its profiler API has {int(api.struct_size)} bytes, fewer than the {needed} "
                                    "this version of the API has")
    missing = [name for name in _PROFILER_FUNCTIONS if getattr(api, name) == ffi.NULL]
    if missing:
        raise _unsupported(library, f"its profiler API leaves {', '.join(missing)} unset (NULL)")
    return api


def has_profiler(library: Library) -> bool:
    """Whether ``library`` provides a usable profiler (see :func:`profiler_api`)."""
    try:
        profiler_api(library)
    except UnsupportedExtensionError:
        return False
    return True


class PluginProfiler:
    """One profiling session of a plugin: :meth:`start`, :meth:`stop`, then :meth:`collect` the XSpace bytes.

    ``options`` are serialized ``tensorflow.ProfileOptions`` bytes (empty: the plugin's defaults).
    Close it (or use it as a context manager) to free the plugin's profiler.
    """

    def __init__(self, library: Library, options: bytes = b"") -> None:
        self.library = library
        self._api = profiler_api(library)
        self._lock = threading.Lock()
        self._options = ffi.new("char[]", bytes(options) or b"\0")  # alive as long as the profiler
        args = new_args("PLUGIN_Profiler_Create_Args")
        args.options = self._options
        args.options_size = len(options)
        self._check(self._api.create(args), "create")
        if args.profiler == ffi.NULL:
            raise PjrtError(13, "the plugin's profiler create reported success but returned no profiler",
                            function="PLUGIN_Profiler_Create", hint=f"a bug in {library.name}")
        self._profiler = args.profiler

    def __enter__(self) -> PluginProfiler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _session_args(self, struct: str) -> Any:
        if self._profiler is None:
            raise RuntimeError("this profiler has been closed")
        args = new_args(struct)
        args.profiler = self._profiler
        return args

    def start(self) -> None:
        with self._lock:
            self._check(self._api.start(self._session_args("PLUGIN_Profiler_Start_Args")), "start")

    def stop(self) -> None:
        with self._lock:
            self._check(self._api.stop(self._session_args("PLUGIN_Profiler_Stop_Args")), "stop")

    def collect(self) -> bytes:
        """The serialized XSpace of the stopped session (``b""`` when the plugin recorded nothing)."""
        with self._lock:
            args = self._session_args("PLUGIN_Profiler_CollectData_Args")
            args.buffer = ffi.NULL
            self._check(self._api.collect_data(args), "collect_data")
            size = int(args.buffer_size_in_bytes)
            if args.buffer == ffi.NULL and size:  # the header's protocol: we bring the buffer, it fills it
                buffer = ffi.new("uint8_t[]", size)
                args.buffer = buffer
                self._check(self._api.collect_data(args), "collect_data")
                size = min(size, int(args.buffer_size_in_bytes))
            data = bytes(ffi.buffer(args.buffer, size)) if size and args.buffer != ffi.NULL else b""
        return _without_terminator(data)

    def close(self) -> None:
        with self._lock:
            profiler, self._profiler = getattr(self, "_profiler", None), None
            if profiler is not None:
                args = new_args("PLUGIN_Profiler_Destroy_Args")
                args.profiler = profiler
                self._check(self._api.destroy(args), "destroy")

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def _check(self, error: Any, step: str) -> None:
        """Raise the plugin profiler's error (destroyed here) as :class:`PjrtError`."""
        if error == ffi.NULL:
            return
        api = self._api
        code, message = 2, "(the plugin's profiler gave no message)"
        try:
            message_args = new_args("PLUGIN_Profiler_Error_Message_Args")
            message_args.error = error
            api.error_message(message_args)
            if message_args.message != ffi.NULL:
                message = unpack_text(message_args.message, message_args.message_size)
            code_args = new_args("PLUGIN_Profiler_Error_GetCode_Args")
            code_args.error = error
            if api.error_get_code(code_args) == ffi.NULL:
                code = int(code_args.code)
        finally:
            destroy_args = new_args("PLUGIN_Profiler_Error_Destroy_Args")
            destroy_args.error = error
            api.error_destroy(destroy_args)
        raise PjrtError(code, message, function=f"PLUGIN_Profiler_{step.title().replace('_', '')}")


def _without_terminator(data: bytes) -> bytes:
    """``data``, less one trailing NUL byte that some plugins count in the size, if that is what breaks it."""
    if not data.endswith(b"\0"):
        return data
    try:
        length_delimited_fields(data, 1)
    except ValueError:
        return data[:-1]
    return data


def _unsupported(library: Library, reason: str) -> UnsupportedExtensionError:
    error = UnsupportedExtensionError(f"{library.name} does not provide a profiler: {reason}")
    error.extension = "Profiler"
    return error

