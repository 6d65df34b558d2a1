"""setuptools hooks: compile the runtime's C fast path (``csrc/fastpath.c``) into a plain shared library.

The library has no Python API: the runtime loads it with cffi like a plugin, so the wheel is
tagged ``py3-none-<platform>`` (any Python 3, one platform). Its header is written here from
``_cdef.CDEF`` and ``_cdef.FASTPATH_DECLARATIONS``, the text the runtime gives cffi, with the
checksum the runtime compares before calling it; after linking, the library's own checksum is
recorded next to it (``_file_checksum``), which the runtime checks before opening it. Loaded by
setuptools by file path, so it imports nothing from pjrt_plugins (``_cdef.py`` and
``_file_checksum.py`` are read by path; they need only cffi, a build requirement, and zlib).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from setuptools.command.build_ext import build_ext

try:  # setuptools >= 70.1 ships bdist_wheel itself (pyproject.toml asks for >= 77)
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - older setuptools with the wheel package
    from wheel.bdist_wheel import bdist_wheel

HEADER = "pjrt_fastpath.h"


def _sibling(name: str) -> Any:
    """The runtime module ``name`` of this directory, loaded by path (never through pjrt_plugins)."""
    spec = importlib.util.spec_from_file_location(f"_pjrt_plugins_build_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record_checksum(library: Path) -> Path:
    """Record the checksum of a freshly linked ``library`` next to it (the runtime checks it first)."""
    recorded: Path = _sibling("_file_checksum").record(library)
    return recorded


def header_text() -> str:
    """The C header of the fast path: the PJRT declarations, the fast path's, and their checksum."""
    cdef = _sibling("_cdef")
    return (
        "/* Written by pjrt_plugins/runtime/_build_fastpath.py from _cdef.py; do not edit. */\n"
        "#ifndef PJRT_FASTPATH_H_\n#define PJRT_FASTPATH_H_\n"
        "#include <stdbool.h>\n#include <stddef.h>\n#include <stdint.h>\n"
        f"{cdef.CDEF}\n{cdef.FASTPATH_DECLARATIONS}\n"
        f"#define PJRTP_DECLARATIONS_CRC {cdef.FASTPATH_CRC}UL\n"
        "#endif\n"
    )


class BuildFastPath(build_ext):
    """Builds each extension as a plain shared library named ``<name>.so`` (no Python ABI suffix)."""

    def get_ext_filename(self, fullname: str) -> str:
        return str(Path(*fullname.split("."))) + ".so"

    def build_extension(self, ext: Any) -> None:
        include = Path(self.build_temp) / "fastpath-include"
        include.mkdir(parents=True, exist_ok=True)
        (include / HEADER).write_text(header_text(), encoding="utf-8")
        objects = self.compiler.compile(
            ext.sources,
            output_dir=self.build_temp,
            include_dirs=[str(include)],
            extra_postargs=["-O2", "-std=c11", "-Wall", "-Werror"],
            debug=self.debug,
        )
        library = self.get_ext_fullpath(ext.name)
        self.compiler.link_shared_object(objects, library, debug=self.debug)
        record_checksum(Path(library))

    def copy_extensions_to_source(self) -> None:
        """In-place builds (``pip install -e .``): the library is copied into the source tree; so is
        its checksum, recorded again from the copy."""
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            package = ext.name.rpartition(".")[0]
            record_checksum(Path(build_py.get_package_dir(package)) / Path(self.get_ext_filename(ext.name)).name)


class PlatformWheel(bdist_wheel):
    """Tag the wheel ``py3-none-<platform>``: its library runs under any Python 3 on that platform."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform
