"""scripts/release end to end: its wheelhouse is checked, installs for a new user from PyPI plus the wheelhouse alone,
and lets a new vendor generate, build, install and conform a plugin.

Uses the package index for public dependencies (numpy, cffi, xla-cpu-pjrt, setuptools for the
vendor's isolated build), as a user would; pip's cache makes the repeated runs cheap.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import zipfile
import zlib
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name, parse_wheel_filename

from e2e_support import FreshVenv, run_release, wheels_in

pytestmark = pytest.mark.e2e

USER_INSTALL = ("pjrt-plugins", "pjrt-plugin-cpu", "pjrt-plugin-stub-neuron")


def test_the_wheelhouse_holds_a_checked_sdist_and_wheel_of_each_project(release_wheelhouse):
    names = sorted(p.name for p in release_wheelhouse.iterdir())
    assert len(names) == 10, names
    wheels = wheels_in(release_wheelhouse)
    for name in ("pjrt-plugin-stub-neuron", "pjrt-plugins"):  # a PJRT library; the runtime's fast path
        tags = parse_wheel_filename(wheels[name].name)[3]
        assert {(t.interpreter, t.abi) for t in tags} == {("py3", "none")}, tags
        assert all(t.platform.startswith("manylinux") for t in tags), tags
    for name in ("pjrt-plugin-cpu", "pjrt-plugin-gpu", "pjrt-plugin-tpu"):
        assert wheels[name].name.endswith("-py3-none-any.whl"), wheels[name]
    with zipfile.ZipFile(wheels["pjrt-plugins"]) as archive:
        assert "pjrt_plugins/conform/_template/csrc/api.c" in archive.namelist()
        assert "pjrt_plugins/runtime/libpjrt_plugins_fastpath.so" in archive.namelist()
        # The checksum the runtime checks before it opens the library matches the repaired wheel's file.
        library = archive.read("pjrt_plugins/runtime/libpjrt_plugins_fastpath.so")
        recorded = archive.read("pjrt_plugins/runtime/libpjrt_plugins_fastpath.so.crc32").decode().strip()
        assert recorded == f"size {len(library)} crc32 {zlib.crc32(library):08x}"
        assert "pjrt_plugins/py.typed" in archive.namelist()


def _rewrite_wheel(wheel: Path, target: Path, change) -> None:
    """Copy ``wheel`` to ``target`` with ``change(name, data)`` applied to each member (None drops it)."""
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w") as out:
        for item in source.infolist():
            data = change(item.filename, source.read(item))
            if data is not None:
                out.writestr(item, data)


def test_the_check_reports_each_kind_of_problem(release_wheelhouse, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(release_wheelhouse, broken)
    wheels = wheels_in(broken)
    # the native wheel as the build left it, before auditwheel: linux_x86_64
    stub = wheels["pjrt-plugin-stub-neuron"]
    name, version, python, abi, _platform = stub.stem.split("-")
    stub.rename(broken / f"{name}-{version}-{python}-{abi}-linux_x86_64.whl")
    # a core wheel without the template, as a plain `python -m build` made before
    core = wheels["pjrt-plugins"]
    _rewrite_wheel(release_wheelhouse / core.name, core, lambda n, d: None if "/_template/" in n else d)
    # a wheel whose module is not its sdist's
    cpu = wheels["pjrt-plugin-cpu"]
    _rewrite_wheel(release_wheelhouse / cpu.name, cpu,
                   lambda n, d: d + b"\n# changed\n" if n == "pjrt_plugin_cpu/_plugin.py" else d)
    result = run_release("--check", str(broken))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "repair it to manylinux" in result.stderr
    assert "carries no plugin template" in result.stderr
    assert "pjrt_plugin_cpu/_plugin.py differs from" in result.stderr


@pytest.fixture(scope="module")
def user(release_wheelhouse, tmp_path_factory) -> FreshVenv:
    """A new environment with the three distributions installed from the wheelhouse (the rest from the index)."""
    workdir = tmp_path_factory.mktemp("user")
    fresh = FreshVenv.create(workdir / "venv", workdir / "work")
    report = workdir / "install.json"
    fresh.pip("install", "--find-links", str(release_wheelhouse), "--report", str(report), *USER_INSTALL)
    installed = {canonicalize_name(i["metadata"]["name"]): i["download_info"]["url"] for i in json.loads(report.read_text())["install"]}
    for name in USER_INSTALL:
        assert installed[name].startswith(release_wheelhouse.as_uri()), f"{name} came from {installed[name]}"
    assert "torch" not in installed and "jaxlib" not in installed  # the core install needs neither
    return fresh


def test_list_shows_the_installed_backends(user):
    result = user.command(["pjrt-plugins", "list"])
    assert result.returncode == 0, result.stderr
    names = {line.split()[0] for line in result.stdout.splitlines()[2:] if line.strip() and not line.startswith(" ")}
    assert {"cpu", "stub-neuron"} <= names, result.stdout


def test_devices_cpu_creates_a_client(user):
    result = user.command(["pjrt-plugins", "devices", "cpu", "-o", "cpu_device_count=2"])
    assert result.returncode == 0, result.stderr
    assert "platform cpu" in result.stdout, result.stdout


def test_a_vendor_generates_builds_installs_and_conforms_a_plugin(user, release_wheelhouse):
    made = user.command(["pjrt-plugins", "new-plugin", "acme"])
    assert made.returncode == 0, made.stderr
    source = user.workdir / "pjrt-plugin-acme"
    # As a vendor builds it: an isolated build that fetches setuptools and xla-cpu-pjrt from the index.
    user.pip("wheel", "--no-deps", "--wheel-dir", str(user.workdir / "dist"), str(source))
    (wheel,) = (user.workdir / "dist").glob("pjrt_plugin_acme-*.whl")
    platforms = {t.platform for t in parse_wheel_filename(wheel.name)[3]}
    assert platforms != {"any"}, f"{wheel.name}: a wheel holding libpjrt_acme.so must be a platform wheel"
    user.pip("install", "--find-links", str(release_wheelhouse), str(wheel))
    conform = user.command(["pjrt-plugins", "conform", "acme"], timeout=300)
    assert conform.returncode == 0, conform.stdout[-4000:] + conform.stderr[-2000:]
    assert "=> conforms" in conform.stdout and "0 FAIL" in conform.stdout, conform.stdout[-2000:]
    assert "warning:" not in conform.stdout  # the library ships in a platform wheel


def _cpu_torch_wheelhouse() -> Path:
    """The local folder holding torch's CPU build for this Python (this machine's stand-in for PyTorch's CPU index)."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    folders = [Path(folder) for folder in os.environ.get("PIP_FIND_LINKS", "").split()]
    for folder in folders:
        if any(folder.glob(f"torch-*+cpu-{tag}-*.whl")):
            return folder
    if any(any(folder.glob("torch-*+cpu-*.whl")) for folder in folders):  # scripts/test-matrix on 3.12+
        pytest.skip(f"PIP_FIND_LINKS has torch CPU wheels, none for {tag}; this test runs where scripts/setup's does")
    pytest.fail("no torch CPU wheel in PIP_FIND_LINKS: scripts/setup installs torch's CPU build from there")


def test_spmd_resolves_to_the_cpu_torch_when_asked(user, release_wheelhouse, tmp_path):
    """The user guide's CPU-only [spmd] install, resolved (not installed) against a local CPU wheel.

    Without ``torch==...+cpu`` the index's torch is the CUDA build, with its nvidia-* wheels.
    """
    report = tmp_path / "report.json"
    user.pip("install", "--dry-run", "--report", str(report), "--find-links", str(release_wheelhouse),
             "--find-links", str(_cpu_torch_wheelhouse()), "pjrt-plugins[spmd]", "torch==2.13.0+cpu")
    picked = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert picked["torch"] == "2.13.0+cpu" and "jaxlib" in picked
    assert not [name for name in picked if name.startswith("nvidia-")], sorted(picked)
