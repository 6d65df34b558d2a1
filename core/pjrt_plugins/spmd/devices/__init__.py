"""Layer 2 of the SPMD engine: the virtual device (plugin, client, devices, SPMD mode), its RNG stream,
its meshes and what the engine counts.

May use the sharding layer, the plugin registry and the runtime's client; must not move tensor data,
lower or run programs, or know torch's device registration (the frontend layer's job). Not a public
API: use ``pjrt_plugins.spmd``.
"""

from __future__ import annotations

from ._meshes import HybridMesh, Mesh, check_mesh_fits, get_1d_mesh, get_global_mesh, set_global_mesh
from ._metrics import (
    Metrics,
    TransferCounters,
    count,
    count_download,
    count_fallback,
    count_upload,
    metrics,
    metrics_report,
    reset_metrics,
    reset_transfer_counters,
    transfer_counters,
)
from ._rng import (
    decode_rng_state,
    encode_rng_state,
    get_seed,
    next_rng_key,
    next_rng_keys,
    rng_key_rows,
    rng_keys_tensor,
    rng_state,
    set_rng_state,
    set_seed,
)
from ._virtual_device import (
    DEFAULT_SPMD,
    DEVICE_NAME,
    USE_SPMD_ENV,
    VirtualDevice,
    chosen_plugin,
    is_spmd,
    peek_virtual_device,
    reset_choices,
    set_plugin,
    set_spmd,
    spmd_from_environment,
    virtual_device,
)

__all__ = [
    "DEFAULT_SPMD",
    "DEVICE_NAME",
    "HybridMesh",
    "Mesh",
    "USE_SPMD_ENV",
    "Metrics",
    "TransferCounters",
    "VirtualDevice",
    "check_mesh_fits",
    "chosen_plugin",
    "count",
    "count_download",
    "count_fallback",
    "count_upload",
    "decode_rng_state",
    "encode_rng_state",
    "get_1d_mesh",
    "get_global_mesh",
    "get_seed",
    "is_spmd",
    "metrics",
    "metrics_report",
    "next_rng_key",
    "next_rng_keys",
    "peek_virtual_device",
    "reset_choices",
    "reset_metrics",
    "reset_transfer_counters",
    "rng_key_rows",
    "rng_keys_tensor",
    "rng_state",
    "set_global_mesh",
    "set_plugin",
    "set_rng_state",
    "set_seed",
    "set_spmd",
    "spmd_from_environment",
    "transfer_counters",
    "virtual_device",
]
