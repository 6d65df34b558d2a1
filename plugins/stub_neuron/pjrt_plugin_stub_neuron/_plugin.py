"""StubNeuronPlugin: the Neuron hooks of PyTorch/XLA over the stub PJRT library.

Every hook is cheap and opens no library; the core opens it when a client is created.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import pjrt_plugins
from pjrt_plugins import PluginUnavailableError, env_int, hookimpl

from . import _library, _topology

logger = logging.getLogger(__name__)

#: The create options the stub library understands (all int64); see csrc/client.c.
OPTION_SCHEMA: dict[str, Any] = {
    "num_devices": int,  # devices of this process, 1..1024 (default 4)
    "node_id": int,  # this process's index among num_nodes (required when num_nodes > 1)
    "num_nodes": int,  # processes exchanging devices through the KV store (default 1)
    "kv_timeout_ms": int,  # how long to wait for each peer's devices (default 30000)
}
#: The stub publishes its devices under KV_KEY_PREFIX + str(node_id), value "v1 num_devices=<n>".
KV_KEY_PREFIX = "stub_neuron/devices/"
DENSE_GATHER_FACTOR = 8192
PRIORITY = -100  # a stub: never chosen over a real device unless asked for by name


class StubNeuronPlugin(pjrt_plugins.DevicePlugin):
    """A Neuron-shaped device plugin backed by the stub PJRT library (or NEURON_LIBRARY_PATH).

    Select it with ``PJRT_DEVICE=STUB-NEURON`` (in PyTorch/XLA too) or ``pjrt_plugins.get_plugin("stub-neuron")``
    (``stub_neuron`` reaches it too; JAX calls it ``stub_neuron``).
    Its devices hold data but cannot compile: ``compile()`` raises a PjrtError
    with code UNIMPLEMENTED unless NEURON_LIBRARY_PATH points at a real library.
    """

    @staticmethod
    def uses_stub_library() -> bool:
        """True unless NEURON_LIBRARY_PATH selects a vendor library."""
        return _library.vendor_library_override() is None

    @hookimpl
    def pjrt_library_path(self) -> str:
        # A NEURON_LIBRARY_PATH naming no regular file raises PluginConfigurationError (find_library).
        return str(_library.library_path())

    @hookimpl
    def pjrt_library_missing_hint(self) -> str:
        return _library.MISSING_LIBRARY_HINT

    @hookimpl
    def pjrt_client_option_schema(self) -> dict[str, Any] | None:
        # A vendor library has its own options; only the stub's are known here.
        return dict(OPTION_SCHEMA) if self.uses_stub_library() else None

    @hookimpl
    def pjrt_client_create_options(self) -> dict[str, Any]:
        if not self.uses_stub_library():
            return {}
        visible = _topology.visible_core_count()
        return {"num_devices": visible if visible is not None else self.physical_chip_count()}

    @hookimpl
    def pjrt_physical_chip_count(self) -> int:
        return _topology.core_count()

    @hookimpl
    def pjrt_configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        _topology.configure_process_environment(local_rank, local_world_size, host_index=self.host_index())

    @hookimpl
    def pjrt_requires_coordinator(self) -> bool:
        world_size = env_int("WORLD_SIZE", default=1)
        return max(world_size, self.local_world_size()) > 1

    @hookimpl
    def pjrt_dense_gather_factor(self) -> int:
        return DENSE_GATHER_FACTOR

    @hookimpl
    def pjrt_priority(self) -> int:
        return PRIORITY

    @hookimpl
    def pjrt_preflight(self) -> None:
        if self.uses_stub_library() and self.physical_chip_count() == 0:
            raise PluginUnavailableError(
                f"plugin 'stub-neuron': {_topology.CHIP_COUNT_ENV}=0 leaves no NeuronCores to create devices on; "
                "unset it or set it to a positive count"
            )
        logger.debug("stub_neuron: using %s", os.fspath(_library.library_path()))
