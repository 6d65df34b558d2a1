"""Building pjrt-plugin-stub-neuron from source: gcc compiles the library against the official header.

Each build runs on a copy of plugins/stub_neuron, with the dev environment's
setuptools (``--no-build-isolation``) so no network is needed.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from stub_neuron_testkit import STUB_SOURCE

from pjrt_plugin_stub_neuron import __version__ as VERSION


@pytest.fixture
def source_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "stub_neuron"
    shutil.copytree(
        STUB_SOURCE, copy, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "*.so", "__pycache__")
    )
    return copy


def _pip_wheel(source: Path, out: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_C_API_HEADER", "STUB_NEURON_TEST_EXPORTS")}
    env.update(env_extra or {})
    command = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out), str(source)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def test_wheel_contains_the_compiled_library_and_no_header(source_copy, tmp_path, gcc, pjrt_header):
    done = _pip_wheel(source_copy, tmp_path / "wheels")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert f"compiling against {pjrt_header.resolve()} (PJRT C API 0.81)" in done.stdout + done.stderr
    (wheel,) = (tmp_path / "wheels").glob("*.whl")
    assert wheel.name.startswith(f"pjrt_plugin_stub_neuron-{VERSION}-py3-none-linux_")  # no Python ABI in the library
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        entry_points = archive.read(f"pjrt_plugin_stub_neuron-{VERSION}.dist-info/entry_points.txt").decode()
        archive.extract("pjrt_plugin_stub_neuron/libpjrt_stub_neuron.so", tmp_path / "unpacked")
    assert "pjrt_plugin_stub_neuron/libpjrt_stub_neuron.so" in names
    assert not any(name.endswith((".h", ".c")) for name in names)
    assert "[torch_xla.plugins]\nstub-neuron = pjrt_plugin_stub_neuron:StubNeuronPlugin" in entry_points  # PJRT_DEVICE=STUB-NEURON
    assert "[jax_plugins]\nstub_neuron = pjrt_plugin_stub_neuron.jax_plugin" in entry_points  # JAX_PLATFORMS=stub_neuron

    built = tmp_path / "unpacked" / "pjrt_plugin_stub_neuron" / "libpjrt_stub_neuron.so"
    assert _dynamic_symbols(built) == ["GetPjrtApi"]  # no debug counter, no internal function
    assert not [s for s in _section_names(built) if s.startswith(".debug")]  # no debug info
    library = ctypes.CDLL(str(built))
    assert library.GetPjrtApi  # the one PJRT export
    with pytest.raises(AttributeError):
        library.StubNeuron_LiveObjectCount  # the tests' counter is in test builds only


def _dynamic_symbols(library: Path) -> list[str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True).stdout
    return sorted(line.split()[-1] for line in out.splitlines() if line.split()[1:2] != ["A"])


def _section_names(library: Path) -> list[str]:
    out = subprocess.run(["readelf", "-SW", str(library)], capture_output=True, text=True, check=True).stdout
    return [line.split("]", 1)[1].split()[0] for line in out.splitlines() if line.lstrip().startswith("[") and "]" in line
            and line.split("]", 1)[1].strip()]


def test_a_test_build_also_exports_the_live_object_counter(source_copy, tmp_path, gcc):
    done = _pip_wheel(source_copy, tmp_path / "wheels", {"STUB_NEURON_TEST_EXPORTS": "1"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (wheel,) = (tmp_path / "wheels").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extract("pjrt_plugin_stub_neuron/libpjrt_stub_neuron.so", tmp_path / "unpacked")
    built = tmp_path / "unpacked" / "pjrt_plugin_stub_neuron" / "libpjrt_stub_neuron.so"
    assert _dynamic_symbols(built) == ["GetPjrtApi", "StubNeuron_LiveObjectCount"]


#: Runs setup.py as if xla-cpu-pjrt were not installed: its xla_plugins namespace cannot be found.
_BUILD_WITHOUT_XLA_CPU_PJRT = """\
import importlib.abc, runpy, sys
class WithoutXlaPlugins(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "xla_plugins":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, WithoutXlaPlugins())
sys.argv = ["setup.py", "build_ext", "--build-temp", "tmp-build", "--build-lib", "tmp-lib"]
runpy.run_path("setup.py", run_name="__main__")
"""


def test_without_isolation_or_xla_cpu_pjrt_the_build_asks_for_the_header(source_copy, gcc):
    """Built with the environment's setuptools (no isolation) where xla-cpu-pjrt is absent: setup.py's own message."""
    done = subprocess.run(
        [sys.executable, "-c", _BUILD_WITHOUT_XLA_CPU_PJRT], cwd=source_copy, capture_output=True, text=True,
        timeout=300, env={k: v for k, v in os.environ.items() if k != "PJRT_C_API_HEADER"},
    )
    assert done.returncode != 0
    assert "ModuleNotFoundError" not in done.stderr, done.stderr[-3000:]
    assert "set PJRT_C_API_HEADER=" in done.stdout + done.stderr, done.stdout[-3000:] + done.stderr[-3000:]


def test_header_from_pjrt_c_api_header_is_used(source_copy, tmp_path, gcc, pjrt_header):
    vendor_checkout = tmp_path / "xla" / "xla" / "pjrt" / "c"
    vendor_checkout.mkdir(parents=True)
    shutil.copy(pjrt_header, vendor_checkout / "pjrt_c_api.h")
    done = _pip_wheel(source_copy, tmp_path / "wheels", {"PJRT_C_API_HEADER": str(vendor_checkout)})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert f"compiling against {vendor_checkout / 'pjrt_c_api.h'}" in done.stdout + done.stderr


def test_a_wrong_header_path_fails_the_build_with_a_clear_message(source_copy, tmp_path, gcc):
    done = _pip_wheel(source_copy, tmp_path / "wheels", {"PJRT_C_API_HEADER": str(tmp_path / "nowhere.h")})
    assert done.returncode != 0
    assert "PJRT_C_API_HEADER=" in done.stdout + done.stderr
    assert "does not name a pjrt_c_api.h file" in done.stdout + done.stderr


def test_sdist_ships_the_c_sources_but_not_the_header(source_copy, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(source_copy)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {Path(*Path(n).parts[1:]).as_posix() for n in archive.getnames()}
    assert {"csrc/api.c", "csrc/client.c", "csrc/buffer.c", "csrc/stub_neuron.h", "setup.py", "README.md"} <= names
    assert not any(name.endswith("pjrt_c_api.h") for name in names)


def test_without_csrc_a_prebuilt_library_ships_in_a_platform_wheel(source_copy, tmp_path, stub_library):
    """The vendor who ships a library built elsewhere: no compiler runs, and the wheel is still py3-none-<platform>."""
    shutil.rmtree(source_copy / "csrc")
    done = _pip_wheel(source_copy, tmp_path / "wheels", {"STUB_NEURON_PREBUILT_LIBRARY": str(stub_library)})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    (wheel,) = (tmp_path / "wheels").glob("*.whl")
    assert wheel.name.startswith(f"pjrt_plugin_stub_neuron-{VERSION}-py3-none-linux_"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read("pjrt_plugin_stub_neuron/libpjrt_stub_neuron.so") == stub_library.read_bytes()
        assert "Root-Is-Purelib: false" in archive.read(f"pjrt_plugin_stub_neuron-{VERSION}.dist-info/WHEEL").decode()


def test_without_csrc_or_a_prebuilt_library_the_build_says_what_to_do(source_copy, tmp_path):
    shutil.rmtree(source_copy / "csrc")
    done = _pip_wheel(source_copy, tmp_path / "wheels")
    assert done.returncode != 0
    assert "no csrc/ to compile and no prebuilt PJRT library" in done.stdout + done.stderr
    assert "STUB_NEURON_PREBUILT_LIBRARY" in done.stdout + done.stderr
