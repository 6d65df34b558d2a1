"""The core's answer to every hook, registered below each backend (``trylast``).

A backend overrides only what differs from these. Nothing here may open a
library or import torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ._env import env_int
from ._marker import hookimpl
from ._timeouts import DEFAULT_INITIALIZE_TIMEOUT_S


class CoreDefaults:
    """Defaults shared by every backend (PyTorch/XLA's conventions)."""

    @hookimpl(trylast=True)
    def pjrt_library_path(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_library_missing_hint(self) -> None:
        return None  # DevicePlugin names the plugin's distribution instead

    @hookimpl(trylast=True)
    def pjrt_client_option_schema(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_client_create_options(self) -> dict[str, Any]:
        return {}

    @hookimpl(trylast=True)
    def pjrt_client_create_environment(self, options: dict[str, Any]) -> dict[str, str]:
        return {}

    @hookimpl(trylast=True)
    def pjrt_stall_timeout(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_local_process_rank(self) -> int:
        return env_int("PJRT_LOCAL_PROCESS_RANK", "LOCAL_RANK", default=0)

    @hookimpl(trylast=True)
    def pjrt_local_world_size(self) -> int:
        return env_int("PJRT_LOCAL_PROCESS_COUNT", "LOCAL_WORLD_SIZE", default=1)

    @hookimpl(trylast=True)
    def pjrt_host_index(self) -> int:
        # torchrun's node rank: without it every host of a multi-host job would claim index 0.
        return env_int("GROUP_RANK", default=0)

    @hookimpl(trylast=True)
    def pjrt_dense_gather_factor(self) -> int:
        return 0

    @hookimpl(trylast=True)
    def pjrt_rng_default(self) -> str:
        return "default"

    @hookimpl(trylast=True)
    def pjrt_physical_chip_count(self) -> int:
        return 1

    @hookimpl(trylast=True)
    def pjrt_configure_single_process(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_requires_coordinator(self) -> bool:
        return False

    @hookimpl(trylast=True)
    def pjrt_priority(self) -> int:
        return 0

    @hookimpl(trylast=True)
    def pjrt_unavailable_reason(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_preflight(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_initialize_timeout(self) -> float:
        return DEFAULT_INITIALIZE_TIMEOUT_S


def library_path_problem(path: str | os.PathLike[str] | None) -> str | None:
    """Why ``path`` cannot be a plugin library (cheap checks only), or ``None``."""
    if path is None:
        return "its PJRT library could not be found"
    p = Path(path)
    if not p.is_absolute():
        return f"its library path {str(p)!r} is not absolute"
    if not p.exists():
        return f"its library {str(p)!r} does not exist"
    if not p.is_file():
        return f"its library path {str(p)!r} is not a regular file"
    return None
