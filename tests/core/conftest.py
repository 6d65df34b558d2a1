"""Fixtures for the core tests: real test distributions on disk, and fresh Python processes.

A test distribution is a ``<name>-<version>.dist-info`` folder (METADATA and
entry_points.txt) plus its modules, in a temporary directory put on the child's
path, so importlib.metadata finds it exactly as it finds an installed wheel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pluggy
import pytest

import pjrt_plugins
from core_support import CORE_DIR, SCRUBBED_ENV_VARS, child_env  # noqa: F401  (shared with the tests)
from _support import session_site_dirs

class SiteDir:
    """A directory of test distributions, as pip would lay them out in site-packages."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(
        self,
        name: str,
        version: str = "1.0",
        *,
        modules: Mapping[str, str] | None = None,
        plugins: Mapping[str, str] | None = None,
        overrides: Mapping[str, str] | None = None,
        requires: Sequence[str] = (),
    ) -> Path:
        """Write one distribution; ``plugins``/``overrides`` map entry names to targets."""
        dist_info = self.root / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
        dist_info.mkdir()
        metadata = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        metadata += [f"Requires-Dist: {r}" for r in requires]
        (dist_info / "METADATA").write_text("\n".join(metadata) + "\n")
        groups = {"torch_xla.plugins": plugins or {}, "pjrt_plugins.overrides": overrides or {}}
        text = ""
        for group, entries in groups.items():
            if entries:
                text += f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
        (dist_info / "entry_points.txt").write_text(text)
        for module, source in (modules or {}).items():
            path = self.root / (module.replace(".", "/") + ".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
        return dist_info


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> object:
        """The last stdout line, parsed (the child prints its findings as JSON there)."""
        return json.loads(self.stdout.strip().splitlines()[-1])

    def __str__(self) -> str:
        return f"exit {self.returncode}\n--- stdout\n{self.stdout}\n--- stderr\n{self.stderr}"


@pytest.fixture(scope="session")
def deps_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Only pluggy, so an isolated child (python -S) sees no installed distribution at all."""
    root = tmp_path_factory.mktemp("deps")
    (root / "pluggy").symlink_to(Path(pluggy.__file__).resolve().parent)
    return root


@pytest.fixture
def site(tmp_path: Path) -> SiteDir:
    return SiteDir(tmp_path / "site")


@pytest.fixture
def make_site(tmp_path: Path):
    """Another directory of test distributions (for sys.path order tests)."""
    return lambda name: SiteDir(tmp_path / name)


@pytest.fixture
def run_isolated(site: SiteDir, deps_dir: Path):
    """Run code in ``python -S`` that sees only the test site, the core and pluggy."""

    def run(
        code: str, env: Mapping[str, str] | None = None, *, extra_paths: Sequence[Path] = (), timeout: float = 60
    ) -> Result:
        paths = [*extra_paths, site.root, CORE_DIR, deps_dir]
        proc = subprocess.run(
            [sys.executable, "-S", "-c", textwrap.dedent(code)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env(paths, env),
            cwd=site.root.parent,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def run_installed(site: SiteDir):
    """Run code (or ``-m module args``) with the whole installed environment plus the test site
    (and the session's site directories; a ``PYTHONPATH`` in ``env`` comes first)."""

    def run(args: Sequence[str] | str, env: Mapping[str, str] | None = None, *, timeout: float = 120) -> Result:
        argv = ["-c", textwrap.dedent(args)] if isinstance(args, str) else list(args)
        extra = dict(env or {})
        paths = [*filter(None, [extra.pop("PYTHONPATH", None)]), site.root, *session_site_dirs()]
        proc = subprocess.run(
            [sys.executable, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env(paths, extra),
            cwd=site.root.parent,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def cpu_library(cpu_library_path: Path) -> str:
    """The real CPU plugin's path resolved, as /proc/self/maps shows it."""
    return str(cpu_library_path.resolve())


@pytest.fixture
def clean_registry():
    """Let an in-process test register plugins; the registry is restored afterwards."""
    from pjrt_plugins import _registry

    saved = dict(_registry._records)
    yield _registry
    _registry._records.clear()
    _registry._records.update(saved)


def plugin_source(
    cls: str = "Plugin",
    *,
    priority: int = 0,
    chips: int = 1,
    library: str = "__file__",
    body: str = "",
    prelude: str = "",
) -> str:
    """Source of a module defining a real DevicePlugin subclass.

    Its "library" is the module file itself: an absolute regular file, which is
    all availability checks look at (no library is ever opened by discovery).
    """
    return (
        "from pjrt_plugins import DevicePlugin, hookimpl\n"
        f"{textwrap.dedent(prelude)}\n"
        f"class {cls}(DevicePlugin):\n"
        "    @hookimpl\n"
        f"    def pjrt_library_path(self):\n        return {library}\n\n"
        "    @hookimpl\n"
        f"    def pjrt_priority(self):\n        return {priority}\n\n"
        "    @hookimpl\n"
        f"    def pjrt_physical_chip_count(self):\n        return {chips}\n"
        + textwrap.indent(textwrap.dedent(body), "    ")
    )


@pytest.fixture(name="plugin_source")
def plugin_source_fixture():
    return plugin_source
