"""pjrt-plugin-gpu: the ``gpu`` backend of pjrt-plugins (XLA CUDA PJRT plugin from jax-cuda13/12-pjrt).

Importing this package must stay cheap: it never opens the library and never imports jax.
"""

from __future__ import annotations

from ._plugin import (
    ALLOCATOR_CUDA_ASYNC_ENV,
    ALLOCATOR_FRACTION_ENV,
    ALLOCATOR_PREALLOCATE_ENV,
    LIBRARY_PATH_ENV,
    NUM_DEVICES_ENV,
    OPTION_SCHEMA,
    GpuPlugin,
)

__version__ = "0.1.0"
__all__ = [
    "ALLOCATOR_CUDA_ASYNC_ENV",
    "ALLOCATOR_FRACTION_ENV",
    "ALLOCATOR_PREALLOCATE_ENV",
    "LIBRARY_PATH_ENV",
    "NUM_DEVICES_ENV",
    "OPTION_SCHEMA",
    "GpuPlugin",
]
