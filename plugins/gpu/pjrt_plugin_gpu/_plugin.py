"""The GPU backend: finds the CUDA PJRT library of the jax-cuda PJRT wheels and maps torchrun's ranks to options.

Those wheels are extras (``pjrt-plugin-gpu[cuda13]``), not dependencies: see pyproject.toml.

Never imports ``jax_plugins.xla_cuda13`` (its ``__init__`` imports jax) and never
opens the library: the path comes from installed-package metadata.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from pjrt_plugins import DevicePlugin, env_bool, env_int, env_value, find_library, hookimpl

from ._devices import installed_gpu_count, visible_gpu_count

logger = logging.getLogger(__name__)

#: Overrides the library found in the jax-cuda PJRT distributions.
LIBRARY_PATH_ENV = "PJRT_GPU_LIBRARY_PATH"
#: PyTorch/XLA's explicit chip count; when set, /proc and /dev are not consulted.
NUM_DEVICES_ENV = "GPU_NUM_DEVICES"
#: PyTorch/XLA's allocator settings, mapped to the create options of the same meaning.
ALLOCATOR_CUDA_ASYNC_ENV = "PJRT_ALLOCATOR_CUDA_ASYNC"
ALLOCATOR_FRACTION_ENV = "PJRT_ALLOCATOR_FRACTION"
ALLOCATOR_PREALLOCATE_ENV = "PJRT_ALLOCATOR_PREALLOCATE"
#: Tried in order: (distribution, library file inside it).
LIBRARY_DISTRIBUTIONS = (
    ("jax-cuda13-pjrt", "jax_plugins/xla_cuda13/xla_cuda_plugin.so"),
    ("jax-cuda12-pjrt", "jax_plugins/xla_cuda12/xla_cuda_plugin.so"),
)

#: Every create option the XLA GPU plugin accepts, with its type (checked against
#: jax-cuda13-pjrt 0.11.1, the newest release pyproject.toml allows: it validates names
#: and types itself before looking for a GPU). Checking here too gives the error in
#: Python, with the list of known names. Older library builds reject the newer names
#: with "Unexpected option name"; 0.12 adds memory_fraction_policy and abort_collectives_timeout.
OPTION_SCHEMA: dict[str, Any] = {
    "platform_name": str,
    "allocator": str,  # "default", "platform", "bfc", "cuda_async", "vmm", "address"
    "memory_fraction": float,
    "preallocate": bool,
    "collective_memory_size": int,
    "visible_devices": list[int],
    "node_id": int,
    "num_nodes": int,
    "enable_mock_nccl": bool,
    "mock_gpu_topology": str,
    "should_stage_host_to_device_transfers": bool,
    "abort_collectives_on_failure": bool,
    "use_tfrt_gpu_client": bool,
    "max_inflight_computations": int,
}

NO_GPU_HINT = (
    "No NVIDIA GPU is visible to this process. Check `nvidia-smi`, that the NVIDIA driver is loaded, "
    "and CUDA_VISIBLE_DEVICES; to run on the CPU instead, install pjrt-plugin-cpu and select 'cpu' "
    "(PJRT_DEVICE=CPU)."
)

def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:  # also refuses nan
        raise ValueError(text)
    return value


def env_fraction(name: str) -> float | None:
    """A memory fraction in (0, 1] from the environment, or ``None`` if unset."""
    return env_value(name, _fraction, default=None, expected="a number in (0, 1]")


def gpu_count() -> int:
    """GPUs this process may use: ``GPU_NUM_DEVICES``, else the driver's GPUs filtered by CUDA_VISIBLE_DEVICES."""
    explicit = env_int(NUM_DEVICES_ENV, default=-1, minimum=0)  # -1: unset
    if explicit >= 0:
        return explicit
    return visible_gpu_count(installed_gpu_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))


class GpuPlugin(DevicePlugin):
    """NVIDIA GPUs through the XLA CUDA PJRT plugin (from jax-cuda13-pjrt or jax-cuda12-pjrt).

    Under torchrun each process sees one GPU (``visible_devices=[local_rank]``)
    and the processes find each other through the key-value store, so a
    coordinator is required when the world size is above 1.
    """

    # -- ranks (torchrun's RANK / WORLD_SIZE / GROUP_RANK over the local values) --

    def global_rank(self) -> int:
        return env_int("RANK", default=self.local_process_rank())

    def global_world_size(self) -> int:
        return env_int("WORLD_SIZE", default=self.local_world_size())

    # -- hooks ---------------------------------------------------------------------

    @hookimpl
    def pjrt_library_path(self) -> str | None:
        # A PJRT_GPU_LIBRARY_PATH naming no regular file raises PluginConfigurationError (find_library).
        return find_library(LIBRARY_PATH_ENV, LIBRARY_DISTRIBUTIONS)

    @hookimpl
    def pjrt_library_missing_hint(self) -> str:
        return (
            "neither jax-cuda13-pjrt nor jax-cuda12-pjrt is installed; choose your CUDA major with an extra: "
            "`pip install 'pjrt-plugin-gpu[cuda13]'` (or [cuda12]; [cuda13-local] / [cuda12-local] with a "
            f"system-wide CUDA), or set {LIBRARY_PATH_ENV}; with JAX in this environment, add "
            "`'jax[cuda13]==<your jax version>'` to the same command"
        )

    @hookimpl
    def pjrt_client_option_schema(self) -> dict[str, Any]:
        return dict(OPTION_SCHEMA)

    @hookimpl
    def pjrt_client_create_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "allocator": "cuda_async" if env_bool(ALLOCATOR_CUDA_ASYNC_ENV) else "default",
            "node_id": self.global_rank(),
            "num_nodes": self.global_world_size(),
        }
        fraction = env_fraction(ALLOCATOR_FRACTION_ENV)
        if fraction is not None:
            options["memory_fraction"] = fraction
        preallocate = env_bool(ALLOCATOR_PREALLOCATE_ENV)
        if preallocate is not None:
            options["preallocate"] = preallocate
        if self.local_world_size() > 1:
            # One GPU per process; never leave every process on device 0.
            options["visible_devices"] = [self.local_process_rank()]
        return options

    @hookimpl
    def pjrt_requires_coordinator(self) -> bool:
        return self.global_world_size() > 1

    @hookimpl
    def pjrt_host_index(self) -> int:
        local = max(self.local_world_size(), 1)
        return env_int("GROUP_RANK", default=self.global_rank() // local)

    @hookimpl
    def pjrt_rng_default(self) -> str:
        return "three_fry"

    @hookimpl
    def pjrt_physical_chip_count(self) -> int:
        return gpu_count()

    @hookimpl
    def pjrt_priority(self) -> int:
        return 200

    @hookimpl
    def pjrt_unavailable_reason(self) -> str | None:
        # No preflight: with no GPU the library itself says so within a second ("No visible GPU
        # devices."), and only it knows for sure; the core refuses a missing library before that.
        return NO_GPU_HINT if gpu_count() == 0 else None
