"""pjrt-plugin-tpu: the ``tpu`` backend of pjrt-plugins (libtpu), which fails fast instead of hanging off a TPU VM.

Importing this package must stay cheap: it never imports libtpu or opens the library.
"""

from __future__ import annotations

from ._host import count_tpu_chips, on_google_compute_engine
from ._plugin import (
    BASE_PORT_ENV,
    DENSE_GATHER_FACTOR,
    INITIALIZE_TIMEOUT_ENV,
    LIBRARY_PATH_ENV,
    MAX_INFLIGHT_ENV,
    SKIP_CHIP_CHECK_ENV,
    SKIP_MDS_QUERY_ENV,
    TpuPlugin,
)

__version__ = "0.1.0"
__all__ = [
    "BASE_PORT_ENV",
    "DENSE_GATHER_FACTOR",
    "INITIALIZE_TIMEOUT_ENV",
    "LIBRARY_PATH_ENV",
    "MAX_INFLIGHT_ENV",
    "SKIP_CHIP_CHECK_ENV",
    "SKIP_MDS_QUERY_ENV",
    "TpuPlugin",
    "count_tpu_chips",
    "on_google_compute_engine",
]
