"""TPU slice topology arithmetic: bounds strings, TPU generations, and the per-process environment.

Pure functions over values passed in: no environment reads, no I/O, so every
rule here is tested alone.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from pjrt_plugins import PluginConfigurationError

#: Host bounds of the v2/v3 slices (their metadata lacks them), as in PyTorch/XLA.
V2_V3_HOST_BOUNDS = {
    "v2-8": "1,1,1",
    "v2-32": "2,2,1",
    "v2-128": "4,4,1",
    "v2-256": "4,8,1",
    "v2-512": "8,8,1",
    "v3-8": "1,1,1",
    "v3-32": "2,2,1",
    "v3-64": "2,4,1",
    "v3-128": "4,4,1",
    "v3-256": "4,8,1",
    "v3-512": "8,8,1",
    "v3-1024": "8,16,1",
    "v3-2048": "16,16,1",
}
V2_V3_CHIPS_PER_HOST = "2,2,1"
#: Chip layout of one host when nothing else says it, by chip count.
CHIPS_PER_HOST_BY_COUNT = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}
#: First port of the per-process TPU runtime servers on each host (PyTorch/XLA's).
DEFAULT_BASE_PORT = 8476


def parse_bounds(text: str, *, what: str = "TPU bounds") -> tuple[int, int, int]:
    """``"2,2,1"`` -> ``(2, 2, 1)``; raises ``PluginConfigurationError`` (a ``ValueError``) unless three positive integers."""
    try:
        dims = tuple(int(part) for part in text.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 3 or any(d < 1 for d in dims):
        raise PluginConfigurationError(f"{what} {text!r} must be three positive integers like '2,2,1'")
    return dims  # type: ignore[return-value]


def format_bounds(dims: tuple[int, ...]) -> str:
    return ",".join(str(d) for d in dims)


def bounds_size(text: str, *, what: str = "TPU bounds") -> int:
    return math.prod(parse_bounds(text, what=what))


def tpu_generation(accelerator_type: str) -> int | None:
    """``"v4-8"`` -> 4, ``"v5litepod-16"`` -> 5, ``"v6e-8"`` -> 6; ``None`` if unrecognised."""
    match = re.fullmatch(r"v(\d+)[a-z]*-\d+", accelerator_type.strip().lower())
    return int(match.group(1)) if match else None


class TpuSlice(NamedTuple):
    """What is known about the slice this host belongs to (any field may be unknown)."""

    accelerator_type: str | None = None
    host_bounds: str | None = None  # how the hosts are laid out, e.g. "1,1,4"
    chips_per_host_bounds: str | None = None  # how one host's chips are laid out, e.g. "2,2,1"
    worker_id: int | None = None  # this host's index in the slice
    worker_addresses: tuple[str, ...] = ()  # every host, in worker order


def host_layout(tpu_slice: TpuSlice, local_chips: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(host bounds, chips-per-host bounds) of the slice, filling in what is unknown.

    v2/v3 slices take their bounds from the accelerator type; later ones from the
    slice description; a lone host with nothing described is laid out from its
    chip count. Raises ``ValueError`` when no layout can be inferred.
    """
    generation = tpu_generation(tpu_slice.accelerator_type) if tpu_slice.accelerator_type else None
    host = tpu_slice.host_bounds
    chips = tpu_slice.chips_per_host_bounds
    if generation is not None and generation <= 3 and tpu_slice.accelerator_type in V2_V3_HOST_BOUNDS:
        host = host or V2_V3_HOST_BOUNDS[tpu_slice.accelerator_type]
        chips = chips or V2_V3_CHIPS_PER_HOST
    host = host or "1,1,1"
    if chips is None:
        chips = CHIPS_PER_HOST_BY_COUNT.get(local_chips)
        if chips is None:
            raise ValueError(
                f"cannot infer the layout of {local_chips} TPU chips on this host; "
                "set TPU_CHIPS_PER_HOST_BOUNDS (e.g. '2,2,1') and TPU_HOST_BOUNDS (e.g. '1,1,1')"
            )
    return parse_bounds(host, what="TPU host bounds"), parse_bounds(chips, what="TPU chips-per-host bounds")


def multiprocess_environment(
    local_rank: int,
    local_world_size: int,
    tpu_slice: TpuSlice,
    local_chips: int,
    base_port: int = DEFAULT_BASE_PORT,
) -> dict[str, str]:
    """The libtpu variables that give process ``local_rank`` of ``local_world_size`` one chip.

    One process per chip on every host: process bounds = host bounds x chips per
    host, one chip per process, ports ``base_port + local_rank``, and the
    address of every process of the slice in task order. Raises ``ValueError``
    when the local world size does not match the host's chips (libtpu would
    otherwise wait for processes that never come).
    """
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local rank {local_rank} is outside the local world size {local_world_size}")
    host_bounds, chips_per_host = host_layout(tpu_slice, local_chips)
    if math.prod(chips_per_host) != local_world_size:
        raise ValueError(
            f"{local_world_size} processes on this host but its TPU layout has {math.prod(chips_per_host)} chips "
            f"({format_bounds(chips_per_host)}); start one process per chip "
            f"(e.g. torchrun --nproc-per-node={math.prod(chips_per_host)}), or one process for all chips (SPMD)"
        )
    process_bounds = tuple(h * c for h, c in zip(host_bounds, chips_per_host))
    worker_id = tpu_slice.worker_id or 0
    hosts = tpu_slice.worker_addresses if len(tpu_slice.worker_addresses) > 1 else ("localhost",)
    ports = range(base_port, base_port + local_world_size)
    return {
        "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1",
        "TPU_PROCESS_BOUNDS": format_bounds(process_bounds),
        "TPU_VISIBLE_CHIPS": str(local_rank),
        "TPU_PROCESS_PORT": str(base_port + local_rank),
        "TPU_PROCESS_ADDRESSES": ",".join(f"{host}:{port}" for host in hosts for port in ports),
        "CLOUD_TPU_TASK_ID": str(worker_id * local_world_size + local_rank),
    }
