"""PJRT_Client_Create: the options encoded, the key-value store wired in, the call bounded in time.

The one call that makes a client, apart from the Client that owns what is made from it. With a
key-value store the call runs on the caller's thread (the store bounds each wait, and Ctrl-C
reaches its get); without one it runs on a daemon thread, waited for at most the initialize
timeout, and a client the plugin makes after that is destroyed then.
"""

from __future__ import annotations

from typing import Any

from .._timeouts import DEFAULT_INITIALIZE_TIMEOUT_S
from ..errors import PluginTimeoutError
from ..options import NamedValue
from ._args import broken_answer, new_args
from ._bounded import BoundedCall
from ._cdef import ffi
from ._kv import KvCallbacks
from ._library import Library
from ._named_values import EncodedNamedValues


def create_pjrt_client(
    lib: Library, values: list[NamedValue], kv_store: Any, timeout: float | None, plugin_name: str
) -> tuple[Any, KvCallbacks | None]:
    """``(PJRT_Client*, the KV callbacks to keep as long as the client)`` made with the checked
    create option ``values``; raises the plugin's error, PluginTimeoutError, or a PjrtError for a
    plugin that reports success without a client."""
    encoded = EncodedNamedValues(values)
    args = new_args("PJRT_Client_Create_Args")
    args.create_options = encoded.pointer
    args.num_options = encoded.count
    kv = None
    if kv_store is not None:
        kv = KvCallbacks(kv_store)
        args.kv_get_callback = kv.get
        args.kv_put_callback = kv.put
        if lib.supports_field("PJRT_Client_Create_Args", "kv_try_get_callback"):
            args.kv_try_get_callback = kv.try_get
        lib.call("PJRT_Client_Create", args)
    else:
        _create_bounded(lib, args, encoded, timeout)
    if args.client == ffi.NULL:
        raise broken_answer("PJRT_Client_Create", "returned no client", repr(plugin_name))
    return args.client, kv


def _create_bounded(lib: Library, args: Any, encoded: EncodedNamedValues, timeout: float | None) -> None:
    """``PJRT_Client_Create(args)`` on a daemon thread, waited for at most ``timeout`` seconds.

    Past it, PluginTimeoutError; a client the plugin creates later is destroyed then
    (``args`` and the option values it points to stay alive until the call returns).
    """

    def create(keep_alive: Any = encoded) -> None:  # the option values stay alive as long as the call
        lib.call("PJRT_Client_Create", args)

    def destroy_late_client(_: None) -> None:
        if args.client != ffi.NULL:
            lib.invoke("PJRT_Client_Destroy", client=args.client)

    call = BoundedCall(create, f"pjrt-client-create:{lib.name}")
    if timeout is None:
        timeout = DEFAULT_INITIALIZE_TIMEOUT_S
    if call.wait(timeout):
        call.outcome()
        return

    call.give_up(destroy_late_client)
    raise PluginTimeoutError(
        f"PJRT_Client_Create in {lib.name} did not return within {timeout:g} s. The plugin may be waiting for "
        "hardware, a driver or a peer process; check the device and the plugin's requirements, or raise the "
        "plugin's initialize timeout."
    )
