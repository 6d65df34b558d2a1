"""Key-value store callbacks for PJRT_Client_Create, bound to a Python store object.

The plugin calls these from its own threads. No Python exception ever unwinds into the
plugin: failures are reported through the plugin's ``callback_error`` (a pointer to a
function pointer, as the C API defines it), and every returned value stays alive until the
plugin calls our value deleter.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from ._cdef import POINTER_CTYPES, ffi, field_end

logger = logging.getLogger(__name__)

_CANCELLED = 1
_UNKNOWN = 2
_UNAVAILABLE = 14
_INVALID_ARGUMENT = 3
_DEADLINE_EXCEEDED = 4
_NOT_FOUND = 5


class KeyValueStore(Protocol):
    """What ``Client(..., kv_store=...)`` needs; ``pjrt_plugins.distributed`` provides one."""

    def get(self, key: str, timeout_ms: int) -> bytes:
        """Block until ``key`` exists (raise TimeoutError after ``timeout_ms``) and return it."""

    def try_get(self, key: str) -> bytes | None:
        """The value of ``key`` now, or None."""

    def put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``."""


# A plugin older than our header passes a smaller args struct: touch only fields inside it.
_END = {
    struct: {name: field_end(struct, name) for name, _ in POINTER_CTYPES[struct].item.fields}
    for struct in (
        "PJRT_KeyValueGetCallback_Args",
        "PJRT_KeyValueTryGetCallback_Args",
        "PJRT_KeyValuePutCallback_Args",
    )
}


def _code_for(exc: BaseException) -> int:
    if isinstance(exc, TimeoutError):
        return _DEADLINE_EXCEEDED
    if isinstance(exc, KeyError):
        return _NOT_FOUND
    if isinstance(exc, (TypeError, ValueError, UnicodeError)):
        return _INVALID_ARGUMENT
    if isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return _CANCELLED
    if isinstance(exc, ConnectionError):
        return _UNAVAILABLE
    return _UNKNOWN


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"a kv_store must return bytes, got {type(value).__name__}")


class KvCallbacks:
    """The cffi callbacks for one client; keep this object alive as long as the client."""

    def __init__(self, store: Any) -> None:
        for method in ("get", "try_get", "put"):
            if not callable(getattr(store, method, None)):
                raise TypeError(
                    f"kv_store must have get(key, timeout_ms), try_get(key) and put(key, value); "
                    f"{type(store).__name__} has no {method}()"
                )
        self.store = store
        self._values: dict[int, Any] = {}
        self._lock = threading.Lock()
        self.get = ffi.callback("PJRT_KeyValueGetCallback", self._get, onerror=self._unexpected)
        self.try_get = ffi.callback("PJRT_KeyValueTryGetCallback", self._try_get, onerror=self._unexpected)
        self.put = ffi.callback("PJRT_KeyValuePutCallback", self._put, onerror=self._unexpected)
        self._get_deleter = ffi.callback(
            "PJRT_KeyValueGetCallback_ValueDeleter", self._delete_value, onerror=self._unexpected
        )
        self._try_get_deleter = ffi.callback(
            "PJRT_KeyValueTryGetCallback_ValueDeleter", self._delete_value, onerror=self._unexpected
        )

    @property
    def live_values(self) -> int:
        """Values handed to the plugin whose deleter it has not called yet."""
        with self._lock:
            return len(self._values)

    def release(self) -> None:
        """Forget values the plugin never deleted (call after the client is destroyed)."""
        with self._lock:
            self._values.clear()

    # -- the callbacks -------------------------------------------------------------------

    def _get(self, args: Any) -> Any:
        return self._run("PJRT_KeyValueGetCallback_Args", args, "get")

    def _try_get(self, args: Any) -> Any:
        return self._run("PJRT_KeyValueTryGetCallback_Args", args, "try_get")

    def _put(self, args: Any) -> Any:
        return self._run("PJRT_KeyValuePutCallback_Args", args, "put")

    def _run(self, struct: str, args: Any, op: str) -> Any:
        key = None
        try:
            ends = _END[struct]
            size = int(args.struct_size)
            needed = ["key", "key_size"] + (
                ["value", "value_size"] if op == "put" else ["value", "value_size", "value_deleter_callback"]
            )
            if op == "get":
                needed.append("timeout_in_ms")
            missing = [name for name in needed if ends[name] > size]
            if missing:
                raise ValueError(f"the plugin's {struct} ({size} bytes) lacks {', '.join(missing)}")
            key = ffi.unpack(args.key, args.key_size).decode("utf-8")
            if op == "put":
                self.store.put(key, ffi.unpack(args.value, args.value_size))
                return ffi.NULL
            if op == "get":
                value = self.store.get(key, int(args.timeout_in_ms))
            else:
                value = self.store.try_get(key)
                if value is None:
                    return self._report(struct, args, _NOT_FOUND, f"kv_store has no key {key!r}")
            data = _as_bytes(value)
            buf = ffi.new("char[]", max(1, len(data)))
            ffi.memmove(buf, data, len(data))
            with self._lock:
                self._values[int(ffi.cast("uintptr_t", buf))] = buf
            args.value = buf
            args.value_size = len(data)
            args.value_deleter_callback = self._get_deleter if op == "get" else self._try_get_deleter
            return ffi.NULL
        except BaseException as exc:  # noqa: BLE001 - nothing may unwind into the plugin
            text = f"kv_store.{op}({key!r}) failed: {type(exc).__name__}: {exc}"
            return self._report(struct, args, _code_for(exc), text)

    def _report(self, struct: str, args: Any, code: int, message: str) -> Any:
        """Create the plugin's error through ``(*callback_error)(code, msg, len)``."""
        try:
            if _END[struct]["callback_error"] <= int(args.struct_size) and args.callback_error != ffi.NULL:
                create = args.callback_error[0]
                if create != ffi.NULL:
                    data = message.encode("utf-8", "replace")
                    return create(code, data, len(data))
            logger.error("cannot report a KV-store failure to the plugin (no callback_error): %s", message)
        except BaseException:  # noqa: BLE001
            logger.exception("reporting a KV-store failure to the plugin failed: %s", message)
        return ffi.NULL

    def _delete_value(self, value: Any) -> None:
        try:
            with self._lock:
                self._values.pop(int(ffi.cast("uintptr_t", value)), None)
        except BaseException:  # noqa: BLE001
            logger.exception("KV value deleter failed")

    @staticmethod
    def _unexpected(exc_type: Any, exc_value: Any, traceback: Any) -> None:
        logger.error("unexpected error in a KV-store callback: %s: %s", exc_type.__name__, exc_value)
        return None
