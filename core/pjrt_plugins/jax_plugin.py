"""Make a pjrt-plugins plugin visible to JAX: the body of its ``jax_plugins`` entry point.

JAX finds plugin modules through the entry-point group ``jax_plugins``, imports
each and calls its ``initialize()``, which must call
``jax._src.xla_bridge.register_plugin(name, library_path=..., options=...)``.
A plugin package publishes a small module whose ``initialize()`` calls
:func:`register_with_jax` with its plugin name; the library path and the create
options then come from the plugin's own hooks, exactly as for our runtime.

Importing this module imports neither jax, the runtime nor the library. :func:`register_with_jax`
imports jax only when JAX itself calls ``initialize()``; the library is opened
by JAX (``register_plugin`` loads it), and the options hooks run only when JAX
creates the client.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pjrt_plugins

from ._client_setup import checked_create_options, prepare_process
from ._native_logs import apply_native_log_settings

logger = logging.getLogger(__name__)

#: Platforms JAX brings itself (jaxlib's CPU client, JAX's CUDA/ROCm/TPU packages).
#: Our cpu, gpu and tpu backends wrap the same libraries, so they publish no JAX entry point,
#: and no plugin may register under these names.
JAX_OWN_PLATFORMS = frozenset({"cpu", "gpu", "cuda", "rocm", "tpu"})


def register_with_jax(name: str) -> bool:
    """Register plugin ``name`` with JAX (call it from the plugin's JAX ``initialize()``).

    Returns whether it registered. It does not when JAX already has a platform
    of that name, when the plugin says it cannot run here (its
    ``unavailable_reason``), or when its priority is negative (a plugin never
    chosen by default, such as the stub) and ``JAX_PLATFORMS`` does not name it:
    JAX would otherwise create its client, and warn, on every ``jax.devices()``.
    Nothing is printed unless the user asked for the platform with
    ``JAX_PLATFORMS``. Raises ``ValueError`` for a name JAX owns (``cpu``,
    ``cuda``, ``tpu``, ...).
    """
    from jax._src import xla_bridge  # JAX is importing us: it is already loaded

    if name in JAX_OWN_PLATFORMS:
        raise ValueError(
            f"plugin {name!r} cannot be registered with JAX under a name JAX owns ({', '.join(sorted(JAX_OWN_PLATFORMS))}); "
            "JAX's own packages provide those platforms"
        )
    if name in xla_bridge._backend_factories:  # noqa: SLF001 - JAX's registry has no public view
        logger.debug("JAX already has a platform %r; not registering plugin %r again", name, name)
        return False
    plugin = pjrt_plugins.get_plugin(name)
    requested = _requested(name)
    if plugin.priority() < 0 and not requested:
        logger.debug("plugin %r has a negative priority: registered with JAX only when JAX_PLATFORMS names it", name)
        return False
    reason = plugin.unavailable_reason()
    if reason is not None:
        log = logger.warning if requested else logger.debug
        log("plugin %r is not registered with JAX: %s", name, reason)
        return False
    apply_native_log_settings()  # JAX opens the library in register_plugin
    xla_bridge.register_plugin(
        name,
        priority=plugin.priority(),
        library_path=plugin.library_path(),
        options=lambda: _create_options(plugin),
    )
    logger.debug("registered plugin %r with JAX (library %s)", name, plugin.library_path())
    return True


def _create_options(plugin: Any) -> dict[str, Any]:
    """Called by JAX when it creates the client: configure the process, preflight, then the checked options."""
    prepare_process(plugin)
    options, _ = checked_create_options(plugin)
    return options


def _requested(name: str) -> bool:
    """Whether ``JAX_PLATFORMS`` names this platform."""
    return name in {p.strip() for p in os.environ.get("JAX_PLATFORMS", "").split(",")}
