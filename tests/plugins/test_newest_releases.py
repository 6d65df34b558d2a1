"""The newest release of every PJRT library in docs/releasing.md, downloaded from the index, loads with our runtime.

Each is fetched with ``pip download --no-deps`` (cached in the system's temporary folder, so a
second run downloads nothing) and probed in a child process by ``scripts/probe_release.py``:
it must report the API version the docs give, one the core knows; CPU builds must run a
program; GPU and TPU builds off their hardware must fail client creation with a PjrtError
(never a crash or a hang). The test skips only when the package index cannot be reached.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from pjrt_plugins.runtime._cdef import HEADER_MINOR, MIN_SUPPORTED_MINOR

REPO = Path(__file__).resolve().parents[2]
RELEASING = REPO / "docs" / "releasing.md"
#: Builds without a GPU or TPU behind them: each must create a client and run a program here.
CPU_BUILDS = {"xla-cpu-pjrt", "lammps-jax-pjrt-cpu", "fastatomstruct-xla-cpu"}


def _load_probe_module():
    spec = importlib.util.spec_from_file_location("probe_release", REPO / "scripts" / "probe_release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


probe_release = _load_probe_module()


def measured_releases() -> dict[str, dict[Version, int]]:
    """{distribution: {release: minor}} from both tables of docs/releasing.md (backends' libraries, other CPU builds)."""
    table: dict[str, dict[Version, int]] = {}
    current = None
    for line in RELEASING.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"0\.\d+", cells[4]):  # distribution | backend | bound | release | API
            name, release, api = cells[0], cells[3], cells[4]
        elif len(cells) == 4 and re.fullmatch(r"0\.\d+", cells[2]):  # distribution | release | API | measured
            name, release, api = cells[0], cells[1], cells[2]
        else:
            continue
        if name:
            current = name.strip("`")
        table.setdefault(current, {})[Version(release)] = int(api.split(".")[1])
    return table


def newest_releases() -> list[tuple[str, Version, int]]:
    return [(name, max(releases), releases[max(releases)]) for name, releases in sorted(measured_releases().items())]


def test_the_tables_cover_every_backend_library_and_the_cpu_builds():
    assert {name for name, _, _ in newest_releases()} == CPU_BUILDS | {"jax-cuda13-pjrt", "jax-cuda12-pjrt", "libtpu"}


@pytest.mark.parametrize("name, version, minor", newest_releases(), ids=lambda v: str(v))
def test_the_newest_release_loads_and_reports_its_version(name, version, minor):
    requirement = f"{name}=={version}"
    try:
        wheel = probe_release.download(requirement, probe_release.DEFAULT_CACHE)
    except probe_release.IndexUnreachableError as exc:
        pytest.skip(f"the package index is unreachable, so {requirement} cannot be downloaded: {exc}")
    result = probe_release.probe_library(requirement, probe_release.pjrt_library(wheel))
    assert not result.error, f"{requirement} did not load: {result.error}"
    assert result.api_version == (0, minor), f"{requirement} reports {result.api_version}; docs/releasing.md says 0.{minor}"
    assert MIN_SUPPORTED_MINOR <= minor <= HEADER_MINOR
    if name in CPU_BUILDS:
        assert result.client.startswith("created"), result.client
        assert result.program == "ran: [0,1,2,3] + 10 = [10.0, 11.0, 12.0, 13.0]", result.program
    else:  # a GPU or TPU build: runs where its hardware is, fails cleanly (a PjrtError) where it is not
        assert result.client.startswith(("created", "failed cleanly: PJRT_Client_Create failed")), result.client
        if result.client.startswith("created"):
            assert result.program.startswith("ran:"), result.program
