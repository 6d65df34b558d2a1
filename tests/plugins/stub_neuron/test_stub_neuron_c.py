"""The stub's C library, driven from C: every function, bad arguments, KV exchange, threads, leaks.

``stub_neuron_driver.c`` is compiled here with gcc, once against the installed
library (dlopen, the shipped artifact) and once linked with the C sources under
sanitizers, which turn any crash, undefined behaviour, data race or leak into a failure.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from stub_neuron_testkit import HERE, STUB_SOURCE, sanitizer_available

DRIVER = HERE / "stub_neuron_driver.c"
C_SOURCES = sorted((STUB_SOURCE / "csrc").glob("*.c"))


def _build(gcc: str, header: Path, out: Path, *flags: str, with_sources: bool) -> Path:
    command = [gcc, "-std=c11", "-g", "-O1", "-Wall", "-Wextra", "-Wno-unused-parameter"]
    command += ["-isystem", str(header.parent), "-I", str(STUB_SOURCE / "csrc"), *flags, str(DRIVER)]
    if with_sources:
        command += [str(s) for s in C_SOURCES]
    command += ["-o", str(out), "-pthread", "-ldl"]
    built = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, f"compiling the driver failed:\n{' '.join(command)}\n{built.stderr}"
    return out


def _run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, f"the driver failed (exit {done.returncode}):\n{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    assert "PASSED: 0 failure(s), 0 live objects" in done.stdout
    return done


def test_installed_library_passes_the_c_driver(gcc, pjrt_header, stub_library, tmp_path):
    exe = _build(gcc, pjrt_header, tmp_path / "driver", "-DSTUB_DRIVER_DLOPEN", with_sources=False)
    done = _run([str(exe), str(stub_library)])
    # A few of the behaviours it proved, visible in its log:
    assert "ok   19 element types round-trip" in done.stdout
    assert "ok   3 nodes exchanged devices through the KV store" in done.stdout
    assert "kv stub_neuron/devices/2 = v1 num_devices=3" in done.stdout
    assert "missing peer -> 4" in done.stdout  # DEADLINE_EXCEEDED
    assert "num_devices given as a string -> 3" in done.stdout  # INVALID_ARGUMENT, no abort


def test_c_sources_are_clean_under_address_and_undefined_behaviour_sanitizers(gcc, pjrt_header, tmp_path):
    if not sanitizer_available(gcc, "address,undefined", tmp_path):
        pytest.skip("this gcc has no AddressSanitizer/UBSan runtime (libasan, libubsan)")
    exe = _build(
        gcc, pjrt_header, tmp_path / "driver_asan",
        "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer",
        with_sources=True,
    )
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1"}
    done = _run([str(exe)], env=env)
    assert "Sanitizer" not in done.stderr


def test_c_sources_have_no_data_races_under_thread_sanitizer(gcc, pjrt_header, tmp_path):
    if not sanitizer_available(gcc, "thread", tmp_path):
        pytest.skip("this gcc has no ThreadSanitizer runtime (libtsan)")
    exe = _build(gcc, pjrt_header, tmp_path / "driver_tsan", "-fsanitize=thread", with_sources=True)
    done = _run([str(exe)], env={"TSAN_OPTIONS": "halt_on_error=1"})
    assert "ThreadSanitizer" not in done.stderr
