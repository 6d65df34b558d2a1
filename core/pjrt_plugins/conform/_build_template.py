"""setuptools hooks: the sdist and the wheels of pjrt-plugins carry the plugin template for ``pjrt-plugins new-plugin``.

The template's only copy in the repository is ``plugins/stub_neuron``. The sdist carries
its files (``_template_files.TEMPLATE_FILES``) at the same place, so that a wheel built
from the sdist (as ``python -m build`` does) finds them; every wheel copies them into
``pjrt_plugins/conform/_template``. Editable installs skip it: new-plugin reads the
source tree directly. Loaded by setuptools by file path, so it imports nothing from pjrt_plugins.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist


def _template_constants() -> dict[str, Any]:
    source = Path(__file__).with_name("_template_files.py").read_text(encoding="utf-8")
    constants: dict[str, Any] = {}
    exec(compile(source, "_template_files.py", "exec"), constants)  # plain constants, see that module
    return constants


def copy_template(source: Path, destination: Path) -> list[Path]:
    """Copy the template files from ``source`` to ``destination``; returns the files written."""
    constants = _template_constants()
    written = []
    for pattern in constants["TEMPLATE_FILES"]:
        for path in sorted(source.glob(pattern)):
            if not path.is_file():
                continue
            target = destination / path.relative_to(source)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
            written.append(target)
    return written


class BuildPyWithTemplate(build_py):
    """build_py that also packs ``plugins/stub_neuron`` as package data (non-editable builds only)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        constants = _template_constants()
        source = Path(constants["TEMPLATE_SOURCE"])  # setuptools builds from the project root
        destination = Path(self.build_lib) / "pjrt_plugins" / "conform" / constants["PACKAGED_TEMPLATE"]
        markers = [source / marker for marker in constants["TEMPLATE_MARKERS"]]
        if not all(marker.is_file() for marker in markers):
            self.warn(
                f"{source} is not here, so this build of pjrt-plugins carries no plugin template; "
                "`pjrt-plugins new-plugin` will then need --template"
            )
            return
        written = copy_template(source, destination)
        self.announce(f"packed {len(written)} template files from {source} into {destination}", level=2)


class SdistWithTemplate(sdist):
    """sdist that also carries ``plugins/stub_neuron``'s template files, so wheels built from it have the template."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        source = Path(_template_constants()["TEMPLATE_SOURCE"])
        if not source.is_dir():
            return  # building from an sdist that lacks it: build_py warns
        written = copy_template(source, Path(base_dir) / source)
        self.announce(f"added {len(written)} template files from {source} to the sdist", level=2)
