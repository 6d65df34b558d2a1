"""Counts the NVIDIA GPUs this process may use, honouring ``CUDA_VISIBLE_DEVICES``.

Only lists driver directories (``/proc/driver/nvidia/gpus``, ``/dev/nvidiaN``):
it never opens the CUDA library or a device, so it is cheap and cannot hang.
"""

from __future__ import annotations

import re
from pathlib import Path

PROC_GPUS = Path("/proc/driver/nvidia/gpus")
DEV = Path("/dev")
_DEV_NODE = re.compile(r"nvidia(\d+)")


def installed_gpu_count(proc_gpus: Path = PROC_GPUS, dev: Path = DEV) -> int:
    """GPUs the NVIDIA driver exposes on this host (0 when there is no driver).

    ``/proc/driver/nvidia/gpus`` holds one directory per GPU (named by PCI bus
    id); containers often lack it but have the ``/dev/nvidiaN`` nodes.
    """
    try:
        count = sum(1 for entry in proc_gpus.iterdir() if entry.is_dir())
    except OSError:
        count = 0
    if count:
        return count
    try:
        return sum(1 for entry in dev.iterdir() if _DEV_NODE.fullmatch(entry.name))
    except OSError:
        return 0


def visible_gpu_count(installed: int, cuda_visible_devices: str | None) -> int:
    """How many of ``installed`` GPUs CUDA will show, given ``CUDA_VISIBLE_DEVICES``.

    Follows CUDA's rule: entries are device indices or ``GPU-``/``MIG-`` UUIDs,
    and the list ends at the first invalid entry (out of range, duplicate,
    negative, garbage). Unset means every GPU; an empty string means none.
    """
    if cuda_visible_devices is None:
        return installed
    seen: set[str] = set()
    for raw in cuda_visible_devices.split(","):
        entry = raw.strip()
        if entry.isdigit():
            if int(entry) >= installed:
                break
            key = str(int(entry))
        elif entry.startswith(("GPU-", "MIG-")):
            key = entry
        else:
            break
        if key in seen:
            break
        seen.add(key)
    return min(len(seen), installed)
