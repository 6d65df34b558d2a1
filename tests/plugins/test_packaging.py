"""The five distributions' conventions: one version for the set (each package's ``__version__``, which
its pyproject.toml reads), the backends' pin on the core's minor series, ``py.typed`` in every package,
and complete metadata. ``scripts/release`` checks the same at release time; this catches a forgotten
bump or marker in CI."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.resources
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import pjrt_plugins

REPO = Path(__file__).resolve().parents[2]
#: distribution -> (project directory, import package)
DISTRIBUTIONS = {
    "pjrt-plugins": (".", "pjrt_plugins"),
    "pjrt-plugin-cpu": ("plugins/cpu", "pjrt_plugin_cpu"),
    "pjrt-plugin-gpu": ("plugins/gpu", "pjrt_plugin_gpu"),
    "pjrt-plugin-tpu": ("plugins/tpu", "pjrt_plugin_tpu"),
    "pjrt-plugin-stub-neuron": ("plugins/stub_neuron", "pjrt_plugin_stub_neuron"),
}


def _project(directory: str) -> dict:
    return tomllib.loads((REPO / directory / "pyproject.toml").read_text(encoding="utf-8"))


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_the_version_has_one_source_per_package_and_one_value_for_the_set(distribution):
    directory, package = DISTRIBUTIONS[distribution]
    project = _project(directory)
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": f"{package}.__version__"}
    version = importlib.import_module(package).__version__
    assert version == pjrt_plugins.__version__, f"{package} is {version}, the core {pjrt_plugins.__version__}"
    assert importlib.metadata.version(distribution) == version  # the installed metadata agrees


@pytest.mark.parametrize("distribution", sorted(set(DISTRIBUTIONS) - {"pjrt-plugins"}))
def test_each_backend_pins_the_core_to_its_own_minor_series(distribution):
    core = Version(pjrt_plugins.__version__)
    pins = [Requirement(r) for r in importlib.metadata.requires(distribution) or [] if r.startswith("pjrt-plugins")]
    assert len(pins) == 1, pins
    assert core in pins[0].specifier
    assert str(pins[0].specifier) == str(Requirement(f"pjrt-plugins>={core.major}.{core.minor}.0,<{core.major}.{core.minor + 1}").specifier)


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_every_package_is_marked_typed_and_ships_the_marker(distribution):
    directory, package = DISTRIBUTIONS[distribution]
    assert importlib.resources.files(package).joinpath("py.typed").is_file()
    assert "py.typed" in _project(directory)["tool"]["setuptools"]["package-data"][package]
    assert "Typing :: Typed" in _project(directory)["project"]["classifiers"]


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_every_distribution_has_complete_metadata(distribution):
    project = _project(DISTRIBUTIONS[distribution][0])["project"]
    assert project["keywords"] and project["classifiers"] and project["description"]
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(project["urls"])
    # The same repository for the set: moving it is one search-and-replace that this test completes.
    assert project["urls"] == _project(".")["project"]["urls"]
    python = {c.rsplit(" :: ", 1)[1] for c in project["classifiers"] if c.startswith("Programming Language :: Python :: 3.")}
    lowest = Version(project["requires-python"].removeprefix(">="))
    assert python and min(Version(v) for v in python) == lowest, (python, project["requires-python"])
