"""Build the stub's PJRT C API library (libpjrt_stub_neuron.so) with the system C compiler, or ship a prebuilt one.

With ``csrc/`` present the library is compiled from it. The official ``pjrt_c_api.h``
is never copied into this repository: the build takes it from ``PJRT_C_API_HEADER``
(a vendor's own XLA checkout) or from the installed ``xla-cpu-pjrt`` wheel, a build
requirement. Without ``csrc/`` the wheel ships a prebuilt library: the file named
by ``STUB_NEURON_PREBUILT_LIBRARY``, else the one already in the package folder.
Either way the wheel is a platform wheel (``py3-none-<platform>``), never
``py3-none-any``: it holds native code. Metadata is in pyproject.toml.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path

from setuptools import Distribution, Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

try:  # setuptools >= 70.1 ships bdist_wheel itself (pyproject.toml asks for >= 77)
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # pragma: no cover - older setuptools with the wheel package
    from wheel.bdist_wheel import bdist_wheel

LIBRARY = "pjrt_plugin_stub_neuron.libpjrt_stub_neuron"  # -> pjrt_plugin_stub_neuron/libpjrt_stub_neuron.so
LIBRARY_FILE = Path(*LIBRARY.split(".")).with_suffix(".so")
SOURCES = ["csrc/api.c", "csrc/client.c", "csrc/buffer.c", "csrc/topology.c"]
HERE = Path(__file__).resolve().parent
#: Without csrc/: the prebuilt library to ship (else LIBRARY_FILE must already be in the package).
PREBUILT_ENV = "STUB_NEURON_PREBUILT_LIBRARY"
HEADER_ENV = "PJRT_C_API_HEADER"
OLDEST_TESTED_MINOR = 81
#: The one symbol a PJRT plugin exports; everything else stays local, whatever the sources declare.
EXPORTED_SYMBOLS = ["GetPjrtApi"]
#: Set to 1 at build time to also export the debug counter the stub's own tests read
#: (scripts/setup does); release builds leave it unset.
TEST_EXPORTS_ENV = "STUB_NEURON_TEST_EXPORTS"
TEST_SYMBOLS = ["StubNeuron_LiveObjectCount"]


def find_pjrt_header() -> Path:
    """The pjrt_c_api.h to compile against: $PJRT_C_API_HEADER, else the xla-cpu-pjrt wheel's."""
    override = os.environ.get(HEADER_ENV, "").strip()
    if override:
        path = Path(override).expanduser()
        if path.is_dir():
            path = path / "pjrt_c_api.h"
        if not path.is_file():
            raise SystemExit(f"{HEADER_ENV}={override!r} does not name a pjrt_c_api.h file (or a folder holding one)")
        return path.resolve()
    try:
        spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")  # finds the package without importing it
    except ModuleNotFoundError:  # no xla_plugins namespace at all: xla-cpu-pjrt is not installed
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "include" / "pjrt_c_api.h"
        if candidate.is_file():
            return candidate.resolve()
    raise SystemExit(
        "cannot find pjrt_c_api.h to build the stub_neuron PJRT library. Either install the build "
        "requirement xla-cpu-pjrt into the build environment (pip does this unless you pass "
        f"--no-build-isolation), or set {HEADER_ENV}=/path/to/xla/pjrt/c/pjrt_c_api.h"
    )


def header_version(header: Path) -> tuple[int, int]:
    text = header.read_text(encoding="utf-8", errors="replace")
    major = re.search(r"^#define PJRT_API_MAJOR (\d+)", text, re.M)
    minor = re.search(r"^#define PJRT_API_MINOR (\d+)", text, re.M)
    if not (major and minor):
        raise SystemExit(f"{header} does not look like the PJRT C API header (no PJRT_API_MAJOR/MINOR)")
    return int(major.group(1)), int(minor.group(1))


class BuildPjrtLibrary(build_ext):
    """Compiles the C sources into a plain shared library that exports GetPjrtApi."""

    def get_ext_filename(self, fullname: str) -> str:
        # A PJRT plugin, not a Python module: no ABI tag in its name. setuptools asks
        # both with the dotted name and with its last part.
        if fullname in (LIBRARY, LIBRARY.rsplit(".", 1)[-1]):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        header = find_pjrt_header()
        major, minor = header_version(header)
        if minor < OLDEST_TESTED_MINOR:
            print(f"warning: PJRT C API {major}.{minor} is older than 0.{OLDEST_TESTED_MINOR}, the oldest tested")
        print(f"stub_neuron: compiling against {header} (PJRT C API {major}.{minor})")
        ext.include_dirs = [str(header.parent), *ext.include_dirs]
        version = self.distribution.get_version()
        ext.define_macros = [*ext.define_macros, ("STUB_NEURON_VERSION", f'"{version}"')]
        # Python's link line carries an rpath to its own lib folder; a PJRT plugin has no use for it.
        linker = getattr(self.compiler, "linker_so", None)
        if isinstance(linker, list):
            self.compiler.linker_so = [arg for arg in linker if not arg.startswith("-Wl,-rpath")]
        ext.extra_link_args = [*ext.extra_link_args, f"-Wl,--version-script={self._version_script()}"]
        super().build_extension(ext)

    def _version_script(self) -> Path:
        """A linker version script that exports GetPjrtApi (and the test counter if asked) and nothing else."""
        symbols = list(EXPORTED_SYMBOLS)
        if os.environ.get(TEST_EXPORTS_ENV, "").strip() == "1":
            symbols += TEST_SYMBOLS
        script = Path(self.build_temp) / "exports.map"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text("{\n  global: " + " ".join(f"{name};" for name in symbols) + "\n  local: *;\n};\n")
        return script


def prebuilt_library() -> Path:
    """The library a build without csrc/ ships: $STUB_NEURON_PREBUILT_LIBRARY, else the package's own file."""
    override = os.environ.get(PREBUILT_ENV, "").strip()
    path = Path(override).expanduser() if override else HERE / LIBRARY_FILE
    if not path.is_file():
        raise SystemExit(
            f"no csrc/ to compile and no prebuilt PJRT library at {path}: copy your library to {LIBRARY_FILE} "
            f"or set {PREBUILT_ENV}=/path/to/your/libpjrt.so"
        )
    return path.resolve()


class BuildPyWithPrebuilt(build_py):
    """Without csrc/: put the prebuilt library into the package, where the hooks look for it."""

    def run(self) -> None:
        super().run()
        if (HERE / "csrc").is_dir() or getattr(self, "editable_mode", False):
            return
        source, target = prebuilt_library(), Path(self.build_lib) / LIBRARY_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        print(f"stub_neuron: shipping the prebuilt library {source}")


class NativeDistribution(Distribution):
    """The wheel always holds native code (compiled or prebuilt), so it is never a pure-Python wheel."""

    def has_ext_modules(self) -> bool:
        return True


class PlatformWheel(bdist_wheel):
    """The library does not link against Python: tag the wheel py3-none-<platform>."""

    def get_tag(self) -> tuple[str, str, str]:
        _, _, platform = super().get_tag()
        return "py3", "none", platform


if not sys.platform.startswith("linux"):
    raise SystemExit("pjrt-plugin-stub-neuron builds on Linux only (the PJRT plugin is an ELF shared library)")

extensions = [
    Extension(
        LIBRARY,
        sources=SOURCES,
        depends=["csrc/stub_neuron.h"],
        # -g0 after Python's own CFLAGS (which carry -g): a release library without debug info.
        extra_compile_args=["-std=c11", "-O2", "-g0", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        extra_link_args=["-pthread", "-Wl,--strip-debug"],
    )
]
setup(
    distclass=NativeDistribution,
    ext_modules=extensions if (HERE / "csrc").is_dir() else [],
    cmdclass={"build_ext": BuildPjrtLibrary, "build_py": BuildPyWithPrebuilt, "bdist_wheel": PlatformWheel},
)
