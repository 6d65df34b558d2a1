"""Layer 3 of the SPMD engine: where a tensor's value lives (``TensorData``) and how it moves (upload, gather).

May use the sharding and device layers and the runtime's buffers; must not record, lower or run
computations, and never makes torch tensors on the ``pjrt`` device (the frontend does). Not a public
API: use ``pjrt_plugins.spmd``.
"""

from __future__ import annotations

from ._tensor_data import TensorData, TensorState, host_empty
from ._transfer import (
    check_current,
    download_buffer,
    download_shard,
    gather,
    gather_shards,
    reshard_buffers,
    upload,
    upload_host_tensor,
    upload_shards,
)

__all__ = [
    "TensorData",
    "TensorState",
    "check_current",
    "download_buffer",
    "download_shard",
    "gather",
    "gather_shards",
    "host_empty",
    "reshard_buffers",
    "upload",
    "upload_host_tensor",
    "upload_shards",
]
