"""Fixtures for the vendor-kit tests: run the CLI in a subprocess, find installed plugin libraries,
build broken test plugins (``fake_*``) with gcc around the real stub_neuron library."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest
from conform_support import HERE, CliRun, clean_env


@pytest.fixture(scope="session")
def run_cli() -> Callable[..., CliRun]:
    def run(*args: str, env: Mapping[str, str] | None = None, timeout: float = 240, cwd: Path | None = None) -> CliRun:
        completed = subprocess.run(
            [sys.executable, "-m", "pjrt_plugins", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=clean_env(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
        return CliRun(completed)

    return run


@pytest.fixture(scope="session")
def fake_plugin(tmp_path_factory: pytest.TempPathFactory, gcc: str, stub_library: Path, pjrt_header: Path):
    """``fake_plugin("FAKE_SEGV_F16")``: a broken PJRT library wrapping the stub (None: a healthy copy)."""
    out = tmp_path_factory.mktemp("fake-plugins")
    built: dict[str, Path] = {}

    def build(defect: str | None = None) -> Path:
        key = defect or "healthy"
        if key in built:
            return built[key]
        flags = [f"-D{defect}"] if defect else []
        digest = hashlib.sha256(key.encode()).hexdigest()[:8]
        library = out / f"libfake_{key.lower()}_{digest}.so"
        command = [gcc, "-shared", "-fPIC", "-O1", "-std=c11", "-D_DEFAULT_SOURCE", f"-I{pjrt_header.parent}",
                   f'-DFAKE_TARGET="{stub_library}"', *flags, "-o", str(library), str(HERE / "fake_plugin.c"), "-ldl"]
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0, f"gcc failed: {' '.join(command)}\n{result.stderr}"
        built[key] = library
        return library

    return build


@pytest.fixture(scope="session")
def no_get_pjrt_api_library(tmp_path_factory: pytest.TempPathFactory, gcc: str) -> Path:
    """A real shared library that is not a PJRT plugin (no GetPjrtApi)."""
    out = tmp_path_factory.mktemp("not-pjrt")
    source = out / "not_pjrt.c"
    source.write_text("int not_a_pjrt_plugin(void) { return 42; }\n")
    library = out / "libnot_pjrt.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than ~20 s (here: building a wheel of pjrt-plugins)")
