"""create_client_for_plugin: the one path from a DevicePlugin's hooks to a live Client.

Order matters and is the contract vendors rely on: configure the process, run the
preflight (which may refuse before any hardware is touched), find and open the library,
initialize it within the plugin's timeout, then create the client with validated options
(and the environment the plugin asks for around that one call).

This glue sits above both layers it joins: it calls the plugin's hooks and the runtime's
objects, and the runtime never sees a plugin. ``DevicePlugin.create_client`` imports it on
first use, so ``import pjrt_plugins`` does not load the runtime.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ._client_setup import checked_create_options, plugin_label, prepare_process
from .errors import PjrtError
from .runtime import Client, load_library

if TYPE_CHECKING:  # pragma: no cover
    from ._plugin import DevicePlugin

logger = logging.getLogger(__name__)
_environment_lock = threading.Lock()


def create_client_for_plugin(
    plugin: DevicePlugin,
    options: Mapping[str, Any] | None = None,
    *,
    configure: bool = True,
    kv_store: Any = None,
) -> Client:
    """Create a :class:`Client` on ``plugin``'s library, honouring every hook.

    ``options`` are laid over ``plugin.client_create_options()`` and the result is
    checked against ``plugin.option_schema()`` before ``PJRT_Client_Create``.
    """
    name = plugin_label(plugin)
    prepare_process(plugin, configure=configure)
    timeout = plugin.initialize_timeout()  # bounds opening, initializing and creating the client
    library = load_library(plugin.library_path(), timeout=timeout)
    library.initialize(timeout=timeout)
    if kv_store is None and plugin.requires_coordinator() and plugin.local_world_size() > 1:
        logger.warning(
            "plugin %s needs a key-value store shared by its processes but none was given; "
            "use pjrt_plugins.distributed to create the client",
            name,
        )
    merged, schema = checked_create_options(plugin, options)
    environment = dict(plugin.hook.pjrt_client_create_environment(options=dict(merged)) or {})
    try:
        with _environment(environment):
            client = Client(
                library, merged, schema=schema, kv_store=kv_store, plugin_name=name, initialize_timeout=timeout
            )
    except PjrtError as error:
        raise _with_plugin_hint(error, plugin) from None
    client.stall_timeout = plugin.hook.pjrt_stall_timeout()
    return client


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in ``os.environ`` for the duration of the block, then the previous values back."""
    if not values:
        yield
        return
    with _environment_lock:
        saved = {key: os.environ.get(key) for key in values}
        logger.debug("client creation environment: %s", dict(values))
        try:
            os.environ.update({key: str(value) for key, value in values.items()})
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def _with_plugin_hint(error: PjrtError, plugin: DevicePlugin) -> PjrtError:
    """The error with the plugin's own explanation (its ``unavailable_reason``) as the hint.

    The library says what failed ("No visible GPU devices."); the plugin knows
    what to do about it ("check nvidia-smi and CUDA_VISIBLE_DEVICES ...").
    """
    if error.hint is not None:
        return error
    reason = plugin.unavailable_reason()  # cheap, and never raises
    if not reason:
        return error
    hinted = PjrtError(error.code, error.message, function=error.function, hint=reason)
    return hinted.with_traceback(error.__traceback__)
