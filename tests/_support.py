"""Helpers every test area shares: files inside installed packages, and work run on several threads at once.

A plain module (not conftest) so test files can import it by name; tests/conftest.py puts
this folder on ``sys.path``. Nothing here imports torch, jax or the runtime.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any


#: Variables that must not leak from the developer's shell into a child that stands for a new user's session.
LEAKY_ENV_PREFIXES = ("PJRT_", "TPU_", "CPU_NUM_DEVICES", "GPU_NUM_DEVICES", "CUDA_VISIBLE_DEVICES", "NEURON",
                      "XLA_", "PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                      "RANK", "WORLD_SIZE", "GROUP_RANK")


#: The gpu backend's CUDA wheels (its [cuda13-local] extra), which scripts/setup installs beside the
#: environment's site-packages: there JAX would find a CUDA plugin it cannot use here and print
#: "Jax plugin configuration error" on every jax.devices(). The test session adds this directory
#: to its path and to its children's (tests/conftest.py), so the gpu tests use the real library.
CUDA_SITE = Path(sys.prefix) / "cuda-site"


def session_site_dirs() -> list[str]:
    """The site directories the test session adds to every interpreter it starts (:data:`CUDA_SITE`)."""
    return [str(CUDA_SITE)] if CUDA_SITE.is_dir() else []


def clean_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without :data:`LEAKY_ENV_PREFIXES` (``PYTHONPATH`` holds only
    :func:`session_site_dirs`), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(LEAKY_ENV_PREFIXES)}
    if session_site_dirs():
        env["PYTHONPATH"] = os.pathsep.join(session_site_dirs())
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


def requirement_applies(requirement: Any, extra: str = "") -> bool:
    """Whether a ``packaging`` Requirement applies to an install here with ``extra`` (its markers hold)."""
    from packaging.markers import default_environment

    if requirement.marker is None:
        return True
    return requirement.marker.evaluate({**default_environment(), "extra": extra})


def installed_closure(roots: Iterable[str]) -> list[importlib.metadata.Distribution]:
    """The distributions installed here that ``roots`` name, with everything they need."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, importlib.metadata.Distribution] = {}
    pending = list(roots)
    while pending:
        name = canonicalize_name(pending.pop())
        if name in seen:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise AssertionError(f"{name} is not installed in the test environment, which the test links it from") from None
        seen[name] = dist
        pending.extend(r.name for r in map(Requirement, dist.requires or []) if requirement_applies(r))
    return list(seen.values())


def link_installed_distributions(roots: Iterable[str], site: Path, target_site_packages: Path) -> list[str]:
    """Make ``roots`` and their dependencies, as installed here, importable in another environment.

    Their top-level files (packages, modules, dist-info) are linked into ``site``, which one
    .pth file adds to ``target_site_packages``: offline, and nothing else leaks in.
    Returns the linked distributions' names.
    """
    from packaging.utils import canonicalize_name

    site.mkdir()
    linked = []
    for dist in installed_closure(roots):
        assert dist.files, f"{dist.metadata['Name']} has no RECORD; cannot tell its files"
        top_level = {Path(str(f)).parts[0] for f in dist.files if not str(f).startswith("..")}
        for entry in sorted(top_level - {"__pycache__"}):
            source = Path(str(dist.locate_file(entry)))
            if source.exists() and not (site / entry).exists():
                (site / entry).symlink_to(source)
        linked.append(canonicalize_name(dist.metadata["Name"]))
    (target_site_packages / "_linked_distributions.pth").write_text(f"{site}\n")
    return sorted(linked)
