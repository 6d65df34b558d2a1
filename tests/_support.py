"""Helpers every test area shares: files inside installed packages, and work run on several threads at once.

A plain module (not conftest) so test files can import it by name; tests/conftest.py puts
this folder on ``sys.path``. Nothing here imports torch, jax or the runtime.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any


#: Variables that must not leak from the developer's shell into a child that stands for a new user's session.
LEAKY_ENV_PREFIXES = ("PJRT_", "TPU_", "CPU_NUM_DEVICES", "GPU_NUM_DEVICES", "CUDA_VISIBLE_DEVICES", "NEURON",
                      "XLA_", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                      "RANK", "WORLD_SIZE", "GROUP_RANK")


def clean_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without :data:`LEAKY_ENV_PREFIXES`, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LEAKY_ENV_PREFIXES)}
    env.update(extra or {})
    return env


def package_file(module: str, relative: str) -> Path | None:
    """``relative`` inside the installed package ``module``, found without importing it, if that file exists."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.is_file() else None


def run_on_threads(target: Callable[..., Any], arguments: Iterable[tuple[Any, ...]], *, timeout: float | None = 60) -> None:
    """Call ``target(*args)`` for each ``args`` on its own thread, all at once; fail if any call raised.

    Each thread is joined with ``timeout`` (``None``: wait as long as it takes). The
    exceptions are collected and reported together in the assertion message.
    """
    errors: list[BaseException] = []

    def run(*args: Any) -> None:
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=args) for args in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not errors, errors
