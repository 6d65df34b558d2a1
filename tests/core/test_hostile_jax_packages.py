"""JAX plugin packages that point elsewhere: only a library inside the distribution's own package is ever opened.

A library whose constructor leaves a marker file stands for code we must never run: a
RECORD that climbs out of the package, a link out of it, a distribution claiming a
module another one installs (the real jax-cuda13-pjrt here). Damaged metadata and
symlink loops are skipped with a warning; they never break ``import pjrt_plugins``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

CLI = ["-m", "pjrt_plugins"]
CONSTRUCTOR = r"""
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void ran(void) {
  const char* marker = getenv("PJRT_TEST_CONSTRUCTOR_MARKER");
  if (marker != NULL) close(open(marker, O_CREAT | O_WRONLY, 0600));
}
"""


@pytest.fixture(scope="module")
def marking_library(tmp_path_factory: pytest.TempPathFactory, gcc: str) -> Path:
    """A shared library whose constructor creates the file $PJRT_TEST_CONSTRUCTOR_MARKER (built for the test)."""
    out = tmp_path_factory.mktemp("marking")
    (out / "marking.c").write_text(CONSTRUCTOR)
    library = out / "libmarking_pjrt.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(library), str(out / "marking.c")], check=True)
    return library


def jax_distribution(site, name: str, module: str, record: list[str], files: dict[str, bytes] | None = None) -> Path:
    """A distribution with a ``jax_plugins`` entry point naming ``module`` and the given RECORD lines."""
    info = site.add(name)
    with open(info / "entry_points.txt", "a") as f:
        f.write(f"[jax_plugins]\n{module.rpartition('.')[2]} = {module}\n")
    (info / "RECORD").write_text("".join(line + "\n" for line in record))
    for relative, data in (files or {}).items():
        path = site.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return info


def devices_of(run_installed, name: str, marker: Path) -> dict:
    result = run_installed([*CLI, "devices", name, "--json"], {"PJRT_TEST_CONSTRUCTOR_MARKER": str(marker)})
    assert "Traceback" not in result.stderr, result
    assert not marker.exists(), f"the library's constructor ran:\n{result}"
    return json.loads(result.stdout)


def test_a_record_entry_climbing_out_of_the_package_is_never_opened(site, run_installed, marking_library, tmp_path):
    climb = os.path.relpath(marking_library, site.root / "jax_plugins" / "xla_climb")
    jax_distribution(site, "climber", "jax_plugins.xla_climb", [
        "jax_plugins/xla_climb/__init__.py,,", f"jax_plugins/xla_climb/{climb},,",
    ], {"jax_plugins/xla_climb/__init__.py": b"import jax\n"})  # fmt: skip
    shown = devices_of(run_installed, "climb", tmp_path / "marker")
    assert shown["error"]["type"] == "PluginUnavailableError"
    assert "leaves the package folder jax_plugins/xla_climb/" in shown["error"]["message"]


def test_a_library_that_links_out_of_the_package_is_never_opened(site, run_installed, marking_library, tmp_path):
    jax_distribution(site, "linker", "jax_plugins.xla_link", [
        "jax_plugins/xla_link/__init__.py,,", "jax_plugins/xla_link/xla_link_pjrt.so,,",
    ], {"jax_plugins/xla_link/__init__.py": b"import jax\n"})  # fmt: skip
    (site.root / "jax_plugins" / "xla_link" / "xla_link_pjrt.so").symlink_to(marking_library)
    shown = devices_of(run_installed, "link", tmp_path / "marker")
    assert shown["error"]["type"] == "PluginUnavailableError"
    assert "leads outside its package folder" in shown["error"]["message"]


def test_an_entry_point_naming_a_module_its_distribution_does_not_install_opens_nothing(
    site, run_installed, marking_library, tmp_path
):
    jax_distribution(site, "squatter", "jax_plugins.xla_other", ["jax_plugins/xla_other/xla_other_pjrt.so,,"],
                     {"jax_plugins/xla_other/xla_other_pjrt.so": marking_library.read_bytes()})
    shown = devices_of(run_installed, "other", tmp_path / "marker")
    assert "squatter names jax_plugins.xla_other in its jax_plugins entry point but does not install it" in (
        shown["error"]["message"]
    )


@pytest.mark.parametrize("also_claims_init", [False, True], ids=["library only", "library and __init__"])
def test_a_second_distribution_claiming_cuda13_is_named_and_its_library_never_opened(
    site, run_installed, marking_library, tmp_path, also_claims_init
):
    # The real jax-cuda13-pjrt installs jax_plugins.xla_cuda13; this one claims it too, and ships
    # a library in a jax_plugins/xla_cuda13 folder of its own (found first on the path).
    record = ["jax_plugins/xla_cuda13/aaa_pjrt.so,,"] + (["jax_plugins/xla_cuda13/__init__.py,,"] if also_claims_init else [])
    jax_distribution(site, "cuda13-claimer", "jax_plugins.xla_cuda13", record,
                     {"jax_plugins/xla_cuda13/aaa_pjrt.so": marking_library.read_bytes()})
    marker = tmp_path / "marker"
    listed = run_installed([*CLI, "list", "--json"], {"PJRT_TEST_CONSTRUCTOR_MARKER": str(marker)})
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed
    assert "cuda13-claimer and jax-cuda13-pjrt" in listed.stderr  # the warning names both
    rows = {row["name"]: row for row in json.loads(listed.stdout)["plugins"]}
    if also_claims_init:  # both install it: neither is trusted
        assert rows["cuda13"]["status"] == "unavailable" and "each of them installs it" in rows["cuda13"]["reason"]
    else:  # only jax-cuda13-pjrt installs it: it stays our gpu backend's library, as without the claimer
        assert "only jax-cuda13-pjrt installs it" in listed.stderr
        assert "cuda13" not in rows and "cuda13" in rows["gpu"]["aliases"]
        assert rows["gpu"]["library_path"].endswith("jax_plugins/xla_cuda13/xla_cuda_plugin.so")
    devices_of(run_installed, "cuda13", marker)


def test_a_record_with_nul_bytes_is_a_reason_and_a_warning_not_a_crash(site, run_installed):
    info = jax_distribution(site, "nul-record", "jax_plugins.xla_nul", [], {"jax_plugins/xla_nul/__init__.py": b""})
    (info / "RECORD").write_bytes(b"jax_plugins/xla_nul/__init__.py,,1\x00\njax_plugins/xla_nul/x\x00_pjrt.so,,\n")
    listed = run_installed([*CLI, "list", "--json"])
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed
    row = next(row for row in json.loads(listed.stdout)["plugins"] if row["name"] == "nul")
    assert row["status"] == "unavailable"
    assert "its file list (RECORD) cannot be read" in row["reason"] and "reinstall nul-record" in row["reason"]


@pytest.mark.parametrize("where", ["jax_plugins/loop", "jax_plugins/a", "broken-1.0.dist-info"])
def test_a_symlink_loop_on_the_path_is_skipped_with_a_warning(site, run_isolated, run_installed, where, plugin_source):
    site.add("good", modules={"good_mod": plugin_source("Good")}, plugins={"good": "good_mod:Good"})
    (site.root / "jax_plugins").mkdir()
    link = site.root / where
    if where.endswith("/a"):  # a -> b -> a
        (site.root / "jax_plugins" / "b").symlink_to("a")
        link.symlink_to("b")
    else:
        link.symlink_to(link.name)
    imported = run_isolated("import json, pjrt_plugins as p\nprint(json.dumps([r.name for r in p.plugin_records()]))\n")
    assert imported.returncode == 0, imported
    assert imported.json() == ["good"]
    assert "PluginWarning" in imported.stderr and "Too many levels of symbolic links" in imported.stderr
    assert str(link) in imported.stderr  # names what it skipped
    listed = run_installed([*CLI, "list", "--json"])
    assert listed.returncode == 0 and "good" in {r["name"] for r in json.loads(listed.stdout)["plugins"]}, listed
