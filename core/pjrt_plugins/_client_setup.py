"""Before a client is created: the process configured for its plugin, the preflight, and the
create options merged and checked.

Shared by our own client creation (:mod:`._plugin_client`) and by JAX's (:mod:`.jax_plugin`),
so a plugin's hooks run the same way whichever framework creates the client. Opens no library:
nothing here may import the runtime.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .options import OptionType, validate_options

if TYPE_CHECKING:  # pragma: no cover
    from ._plugin import DevicePlugin

logger = logging.getLogger(__name__)


def plugin_label(plugin: DevicePlugin) -> str:
    """The plugin's registered name, or its class name when it was built outside the registry."""
    return plugin.name or type(plugin).__name__


def prepare_process(plugin: DevicePlugin, *, configure: bool = True) -> None:
    """Configure this process for the plugin (its local rank, or single process), then run its preflight."""
    if configure:
        world = plugin.local_world_size()
        if world > 1:
            rank = plugin.local_process_rank()
            logger.debug("configuring plugin %s for local rank %d of %d", plugin_label(plugin), rank, world)
            plugin.configure_multiprocess(rank, world)
        else:
            plugin.configure_single_process()
    plugin.preflight()


def checked_create_options(
    plugin: DevicePlugin, options: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], dict[str, OptionType] | None]:
    """``(options, schema)``: ``options`` over the plugin's own, typed and checked by its schema and hook.

    Also what other consumers of the library (JAX, see :mod:`pjrt_plugins.jax_plugin`)
    pass to ``PJRT_Client_Create``, so a plugin's options are validated the same way there.
    """
    merged = dict(plugin.client_create_options())
    if options:
        merged.update(options)
    schema = plugin.option_schema()
    validate_options(merged, schema, plugin=f"plugin {plugin_label(plugin)!r}")  # types first: the hook reads typed values
    plugin.hook.pjrt_check_client_options(options=dict(merged))
    return merged, schema
