"""Helpers the core tests import by name (a conftest is not importable reliably: every test
directory has one, and ``from conftest import ...`` gets whichever pytest imported first)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import pjrt_plugins

CORE_DIR = Path(pjrt_plugins.__file__).resolve().parent.parent
#: Variables that change discovery or selection; every child starts without them.
SCRUBBED_ENV_VARS = (
    "PJRT_DEVICE",
    "PJRT_LIBRARY_PATH",
    "PJRT_NAMES_AND_LIBRARY_PATHS",
    "PJRT_PLUGINS_AUTOLOAD",
    "PJRT_PLUGINS_PREFER",
    "PYTHONPATH",
    "PYTHONWARNINGS",
    "XLA_DENSE_GATHER_FACTOR",
    "XLA_RNG_BIT_GENERATOR",
    "PJRT_LOCAL_PROCESS_RANK",
    "PJRT_LOCAL_PROCESS_COUNT",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
)


def child_env(paths: Sequence[Path | str] = (), env: Mapping[str, str] | None = None) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in SCRUBBED_ENV_VARS}
    base["PYTHONPATH"] = os.pathsep.join(str(p) for p in paths)
    base.update(env or {})
    return base
