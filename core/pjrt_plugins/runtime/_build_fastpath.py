"""setuptools hooks: compile the runtime's C fast path (``csrc/fastpath.c``) into a plain shared library.

The library has no Python API: the runtime loads it with cffi like a plugin, so the wheel is
tagged ``py3-none-<platform>`` (any Python 3, one platform). Its header is written here from
``_cdef.CDEF`` and ``_cdef.FASTPATH_DECLARATIONS``, the text the runtime gives cffi, with the
checksum the runtime compares before calling it. Loaded by setuptools by file path, so it imports
nothing from pjrt_plugins (``_cdef.py`` is read by path; it needs only cffi, a build requirement).
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


def header_text() -> str:
    """The C header of the fast path: the PJRT declarations, the fast path's, and their checksum."""
    path = Path(__file__).with_name("_cdef.py")
    spec = importlib.util.spec_from_file_location("_pjrt_plugins_build_cdef", path)
    assert spec is not None and spec.loader is not None
    cdef: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cdef)
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
        self.compiler.link_shared_object(objects, self.get_ext_fullpath(ext.name), debug=self.debug)


class PlatformWheel(bdist_wheel):
    """Tag the wheel ``py3-none-<platform>``: its library runs under any Python 3 on that platform."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform
