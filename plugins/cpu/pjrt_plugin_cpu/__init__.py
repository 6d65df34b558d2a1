"""pjrt-plugin-cpu: the ``cpu`` backend of pjrt-plugins (OpenXLA CPU PJRT plugin from xla-cpu-pjrt).

Importing this package must stay cheap: it never opens the library.
"""

from __future__ import annotations

from ._plugin import (
    DEFAULT_NUM_DEVICES,
    LIBRARY_DISTRIBUTION,
    LIBRARY_PATH_ENV,
    MAX_NUM_DEVICES,
    NUM_DEVICES_ENV,
    CpuPlugin,
)

__version__ = "0.1.0"
__all__ = [
    "DEFAULT_NUM_DEVICES",
    "LIBRARY_DISTRIBUTION",
    "LIBRARY_PATH_ENV",
    "MAX_NUM_DEVICES",
    "NUM_DEVICES_ENV",
    "CpuPlugin",
]
