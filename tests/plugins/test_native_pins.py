"""Each backend bounds its native library to releases whose PJRT C API the core knows (docs/releasing.md).

The measured releases come from the table in docs/releasing.md. The resolver test asks the
package index (as scripts/setup does) which release each bound picks, without downloading it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from _support import clean_environment, package_file
from pjrt_plugins.runtime._cdef import HEADER_MINOR, MIN_SUPPORTED_MINOR

REPO = Path(__file__).resolve().parents[2]
RELEASING = REPO / "docs" / "releasing.md"
#: Native distribution -> (module holding its library, the library inside it).
NATIVE_LIBRARIES = {
    "xla-cpu-pjrt": ("xla_plugins.xla_cpu_pjrt", "xla_cpu_pjrt.so"),
    "jax-cuda13-pjrt": ("jax_plugins.xla_cuda13", "xla_cuda_plugin.so"),
    "jax-cuda12-pjrt": ("jax_plugins.xla_cuda12", "xla_cuda_plugin.so"),
    "libtpu": ("libtpu", "libtpu.so"),
}
#: The ones scripts/setup installs, so the installed-library test must find them.
INSTALLED_BY_SETUP = ("xla-cpu-pjrt", "jax-cuda13-pjrt", "libtpu")


def measured_minors() -> dict[str, dict[Version, int]]:
    """{distribution: {release: PJRT C API minor}} from the table in docs/releasing.md."""
    table: dict[str, dict[Version, int]] = {}
    current = None
    for line in RELEASING.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not re.fullmatch(r"0\.\d+", cells[4]):
            continue
        if cells[0]:
            current = cells[0].strip("`")
        table.setdefault(current, {})[Version(cells[3])] = int(cells[4].split(".")[1])
    return table


def native_requirements() -> list[tuple[str, Requirement]]:
    """(where, requirement) for every requirement on a native library in the five pyproject.toml files."""
    found = []
    for pyproject in [REPO / "pyproject.toml", *sorted(REPO.glob("plugins/*/pyproject.toml"))]:
        data = tomllib.loads(pyproject.read_text())
        project = data["project"]
        groups = {"dependencies": project.get("dependencies", []), "build-system": data["build-system"]["requires"]}
        groups.update({f"[{k}]": v for k, v in project.get("optional-dependencies", {}).items()})
        for group, requirements in groups.items():
            for text in requirements:
                requirement = Requirement(text)
                if requirement.name in NATIVE_LIBRARIES:
                    found.append((f"{pyproject.relative_to(REPO)} {group}", requirement))
    return found


def test_the_table_covers_every_native_library():
    table = measured_minors()
    assert set(table) == set(NATIVE_LIBRARIES), table.keys()
    assert {r.name for _, r in native_requirements()} == set(NATIVE_LIBRARIES)


@pytest.mark.parametrize("where, requirement", native_requirements(), ids=lambda v: str(v))
def test_each_bound_admits_only_releases_the_core_knows(where, requirement):
    assert any(s.operator in ("<", "<=", "==", "~=") for s in requirement.specifier), (
        f"{where}: {requirement} has no upper bound; a new release could speak a PJRT C API the core does not know"
    )
    measured = measured_minors()[requirement.name]
    admitted = {release: minor for release, minor in measured.items() if requirement.specifier.contains(release)}
    assert admitted, f"{where}: {requirement} admits none of the releases measured in docs/releasing.md"
    for release, minor in measured.items():
        known = MIN_SUPPORTED_MINOR <= minor <= HEADER_MINOR
        if requirement.specifier.contains(release):
            assert known, f"{where}: {requirement} admits {requirement.name} {release}, which speaks 0.{minor}"


def test_the_gpu_extras_choose_exactly_one_cuda_major():
    project = tomllib.loads((REPO / "plugins" / "gpu" / "pyproject.toml").read_text())["project"]
    base = {Requirement(r).name for r in project["dependencies"]}
    assert not base & {"jax-cuda13-pjrt", "jax-cuda12-pjrt"}, "the base install must not choose a CUDA major"
    extras = {name: {Requirement(r).name for r in reqs} for name, reqs in project["optional-dependencies"].items()}
    assert set(extras) == {"cuda13", "cuda13-local", "cuda12", "cuda12-local"}
    for name, names in extras.items():
        major, other = ("13", "12") if name.startswith("cuda13") else ("12", "13")
        assert f"jax-cuda{major}-pjrt" in names and f"jax-cuda{other}-pjrt" not in names, name
        assert not any(n.endswith(f"-cu{other}") for n in names), f"[{name}] mixes CUDA {other} wheels in"
    # Each extra completes JAX's CUDA support too: jax-cuda1X-pjrt alone is half of it, and JAX then
    # prints "Jax plugin configuration error" on every jax.devices(). Same bounds for both halves.
    assert extras["cuda13-local"] == {"jax-cuda13-pjrt", "jax-cuda13-plugin"}
    assert extras["cuda12-local"] == {"jax-cuda12-pjrt", "jax-cuda12-plugin"}
    for name, requirements in project["optional-dependencies"].items():
        major = "13" if name.startswith("cuda13") else "12"
        parsed = {Requirement(r).name: Requirement(r) for r in requirements}
        pjrt, plugin = parsed[f"jax-cuda{major}-pjrt"], parsed[f"jax-cuda{major}-plugin"]
        assert plugin.specifier == pjrt.specifier, f"[{name}]: {plugin} and {pjrt} must admit the same releases"
    assert {"nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"} <= extras["cuda13"]
    assert {"nvidia-cuda-runtime-cu12", "nvidia-cudnn-cu12", "nvidia-nccl-cu12"} <= extras["cuda12"]


def _api_version(library: Path) -> tuple[int, int]:
    # In a child: loading a vendor library is never undone in this process.
    code = f"from pjrt_plugins.runtime import load_library; print(*load_library({str(library)!r}).api_version)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env=clean_environment())
    assert result.returncode == 0, result.stderr[-3000:]
    major, minor = map(int, result.stdout.split())
    return major, minor


@pytest.mark.parametrize("distribution", INSTALLED_BY_SETUP)
def test_the_installed_library_is_in_range_and_speaks_an_api_the_core_knows(distribution):
    import importlib.metadata

    version = Version(importlib.metadata.version(distribution))
    for where, requirement in native_requirements():
        if requirement.name == distribution:
            assert requirement.specifier.contains(version), f"installed {distribution} {version} is outside {where}: {requirement}"
    library = package_file(*NATIVE_LIBRARIES[distribution])
    assert library is not None, f"{distribution} is installed without its library"
    major, minor = _api_version(library)
    assert major == 0 and MIN_SUPPORTED_MINOR <= minor <= HEADER_MINOR, f"{distribution} {version} speaks {major}.{minor}"
    assert measured_minors()[distribution].get(version, minor) == minor, "docs/releasing.md has another minor for it"


def _index_versions(name: str) -> list[Version]:
    """The releases of ``name`` that the package index offers this interpreter (its page only, no wheel fetched)."""
    command = [sys.executable, "-m", "pip", "index", "versions", "--json", "--disable-pip-version-check", name]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=clean_environment())
    assert result.returncode == 0, f"pip could not list {name} (is the package index reachable?):\n{result.stderr}"
    return [Version(v) for v in json.loads(result.stdout)["versions"]]


def test_the_resolver_picks_measured_releases_the_core_knows():
    """For each bound, the release pip would pick (the newest final one the index offers in range) is measured in range.

    Asked of the index's release list rather than by a dry-run install: a dry run fetches whole
    wheels where the index serves no separate metadata (135 MB for the CUDA plugin).
    """
    measured = measured_minors()
    offered: dict[str, list[Version]] = {}
    for where, requirement in native_requirements():
        name = canonicalize_name(requirement.name)
        assert name in NATIVE_LIBRARIES, f"{where}: {requirement} is not a native library this test knows"
        if name not in offered:
            offered[name] = _index_versions(name)
        in_range = list(requirement.specifier.filter(offered[name]))
        assert in_range, f"{where}: no release of {name} on the index is in {requirement.specifier} ({offered[name]})"
        picked = max(in_range)
        assert picked in measured[name], f"{where}: pip picks {name} {picked}, which docs/releasing.md has not measured"
        assert MIN_SUPPORTED_MINOR <= measured[name][picked] <= HEADER_MINOR, f"{name} {picked}"
    assert set(offered) == set(NATIVE_LIBRARIES), offered
