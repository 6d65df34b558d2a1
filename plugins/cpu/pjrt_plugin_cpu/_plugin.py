"""The CPU backend: finds the OpenXLA CPU PJRT library and says how many CPU devices to create.

Never opens the library and never imports a heavy module: everything here is
answered from environment variables and installed-package metadata.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pjrt_plugins import DevicePlugin, PluginConfigurationError, PluginUnavailableError, env_int, find_library, hookimpl

logger = logging.getLogger(__name__)

#: Overrides the library found in the ``xla-cpu-pjrt`` distribution (e.g. a newer build).
LIBRARY_PATH_ENV = "PJRT_CPU_LIBRARY_PATH"
#: PyTorch/XLA's variable for the number of CPU devices; maps to ``cpu_device_count``.
NUM_DEVICES_ENV = "CPU_NUM_DEVICES"
#: The distribution that ships the library, and where the library sits inside it.
LIBRARY_DISTRIBUTION = "xla-cpu-pjrt"
LIBRARY_IN_DISTRIBUTION = "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"
LIBRARY_DISTRIBUTIONS = ((LIBRARY_DISTRIBUTION, LIBRARY_IN_DISTRIBUTION),)
#: Devices per client when ``CPU_NUM_DEVICES`` is unset (PyTorch/XLA and JAX also default to 1).
DEFAULT_NUM_DEVICES = 1
#: More devices than this make client creation take minutes (see check_device_count).
MAX_NUM_DEVICES = 1024


def library_problem() -> str | None:
    """Why no library is installed, with the fix, or ``None``. Cheap: nothing is opened.

    A ``PJRT_CPU_LIBRARY_PATH`` that names no regular file raises
    ``PluginConfigurationError`` (from ``find_library``): the user meant this plugin.
    """
    if find_library(LIBRARY_PATH_ENV, LIBRARY_DISTRIBUTIONS) is None:
        return (
            f"the PJRT CPU library was not found: the {LIBRARY_DISTRIBUTION} package is not installed "
            f"(or lacks {LIBRARY_IN_DISTRIBUTION}); run `pip install {LIBRARY_DISTRIBUTION}` "
            f"or set {LIBRARY_PATH_ENV}"
        )
    return None


def check_device_count(count: int, source: str) -> int:
    """Refuse a device count the library mishandles; ``source`` names where it came from.

    The library silently makes a client with no devices for a count below 1, and
    its client creation grows quadratically with the count (1024 devices take
    seconds, 4096 nearly a minute, 100000 never finish).
    """
    if not 1 <= count <= MAX_NUM_DEVICES:
        raise PluginConfigurationError(f"{source}={count} must be between 1 and {MAX_NUM_DEVICES} CPU devices")
    return count


def num_devices() -> int:
    """Devices per client: ``CPU_NUM_DEVICES`` or 1; raises ``ValueError`` for a bad value."""
    count = env_int(NUM_DEVICES_ENV, default=DEFAULT_NUM_DEVICES)
    return check_device_count(count, f"environment variable {NUM_DEVICES_ENV}")


class CpuPlugin(DevicePlugin):
    """PJRT on the host CPU, through the OpenXLA CPU plugin (PJRT C API 0.81 in xla-cpu-pjrt 0.0.1).

    The library ignores the key-value store and ``num_nodes``: every process gets
    its own independent set of ``cpu_device_count`` devices.
    """

    @hookimpl
    def pjrt_library_path(self) -> str | None:
        return find_library(LIBRARY_PATH_ENV, LIBRARY_DISTRIBUTIONS)

    @hookimpl
    def pjrt_client_option_schema(self) -> dict[str, Any]:
        # This build reads only ``cpu_device_count``, ignores unknown names and
        # aborts the process on a wrong type: only a schema keeps that out.
        return {"cpu_device_count": int}

    @hookimpl
    def pjrt_client_create_options(self) -> dict[str, Any]:
        return {"cpu_device_count": num_devices()}

    @hookimpl
    def pjrt_check_client_options(self, options: Mapping[str, Any]) -> None:
        if "cpu_device_count" in options:
            check_device_count(options["cpu_device_count"], "client option cpu_device_count")

    @hookimpl
    def pjrt_physical_chip_count(self) -> int:
        # The brief's convention: a CPU client's devices count as its chips.
        return num_devices()

    @hookimpl
    def pjrt_priority(self) -> int:
        return 0

    @hookimpl
    def pjrt_unavailable_reason(self) -> str | None:
        return library_problem()

    @hookimpl
    def pjrt_preflight(self) -> None:
        problem = library_problem()
        if problem is not None:
            raise PluginUnavailableError(f"plugin 'cpu': {problem}")
        num_devices()  # a malformed CPU_NUM_DEVICES fails here, before anything is opened
