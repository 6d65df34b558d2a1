#!/usr/bin/env python
"""Measure PJRT plugin releases from the package index: the PJRT C API each one speaks, and what it does here.

For each requirement (``dist==version``) the wheel is downloaded with ``pip download --no-deps``
into a cache folder, its PJRT library (the shared library in it that exports ``GetPjrtApi``)
is unpacked beside it, and a child process loads it with ``pjrt_plugins.runtime.load_library``,
reads its API version, creates a client and, where that works (CPU builds), compiles and runs
a program. A GPU or TPU build off its hardware must fail client creation with a PjrtError
(libtpu gets ``TPU_SKIP_MDS_QUERY=1``, without which it blocks for minutes off a TPU VM).

    .venv/bin/python scripts/probe_release.py jax-cuda13-pjrt==0.12.0.1 libtpu==0.0.52
    .venv/bin/python scripts/probe_release.py --cache /tmp/pjrt-wheels lammps-jax-pjrt-cpu==0.11.2

It prints one line per release in the format of docs/releasing.md's table, then what the
client did. Exit status: 0 if every release loaded, 1 otherwise (2: the index is unreachable).
``tests/plugins/test_newest_releases.py`` runs the newest releases through the same functions.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

#: Default cache: downloads and unpacked libraries survive between runs (a few hundred MB each).
DEFAULT_CACHE = Path(tempfile.gettempdir()) / "pjrt-plugins-release-probe"
#: Words in pip's output that mean the index could not be reached (not that the release is missing).
_UNREACHABLE = ("Network is unreachable", "Temporary failure in name resolution", "Connection refused",
                "Max retries exceeded", "NewConnectionError", "ConnectTimeoutError", "Could not fetch URL",
                "ProxyError", "SSLError")
_CHILD_TIMEOUT = 300


class IndexUnreachableError(RuntimeError):
    """pip could not reach the package index (as opposed to: the release does not exist)."""


@dataclass
class Probe:
    """What one release did here."""

    requirement: str
    library: str
    api_version: tuple[int, int] | None = None
    client: str = ""  # "created", or the error client creation raised
    program: str = ""  # "ran" (with the checked result), or why not
    error: str = ""  # loading failed: why

    def table_row(self) -> str:
        """The release's row in docs/releasing.md's table (distribution, bound and backend cells left empty)."""
        version = self.requirement.split("==", 1)[1]
        api = f"{self.api_version[0]}.{self.api_version[1]}" if self.api_version else "?"
        return f"| | | | {version} | {api} |"


def download(requirement: str, cache: Path, python: str = sys.executable) -> Path:
    """The wheel of ``requirement`` (``dist==version``), downloaded with ``--no-deps`` into ``cache`` once."""
    name, _, version = requirement.partition("==")
    if not version:
        raise ValueError(f"{requirement!r}: give an exact release, as dist==version")
    cache.mkdir(parents=True, exist_ok=True)
    stem = f"{name.replace('-', '_')}-{version}-"
    for wheel in cache.glob("*.whl"):
        if wheel.name.lower().startswith(stem.lower()):
            return wheel
    command = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "--progress-bar", "off", "--resume-retries", "20", "--dest", str(cache), requirement]
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        output = result.stdout + result.stderr
        if any(word in output for word in _UNREACHABLE):
            raise IndexUnreachableError(f"pip could not reach the package index for {requirement}:\n{output[-2000:]}")
        raise RuntimeError(f"pip download {requirement} failed:\n{output[-3000:]}")
    for wheel in cache.glob("*.whl"):
        if wheel.name.lower().startswith(stem.lower()):
            return wheel
    raise RuntimeError(f"pip download {requirement} succeeded but left no {stem}*.whl in {cache}")


def _exports_get_pjrt_api(path: Path) -> bool:
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(b"\0GetPjrtApi\0") != -1  # the name in the dynamic string table


def pjrt_library(wheel: Path) -> Path:
    """The PJRT library inside ``wheel``, unpacked next to it (once)."""
    target = wheel.with_suffix("")  # <cache>/<wheel name>/
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.namelist() if m.endswith(".so") or ".so." in m.rsplit("/", 1)[-1]]
        for member in sorted(members, key=lambda m: -archive.getinfo(m).file_size):  # the plugin is the big one
            path = target / member
            if not path.is_file() or path.stat().st_size != archive.getinfo(member).file_size:
                archive.extract(member, target)
            if _exports_get_pjrt_api(path):
                return path
    raise RuntimeError(f"{wheel.name} holds no shared library exporting GetPjrtApi (looked at {members})")


# Runs in a child: a plugin library is never unloaded, and a bad one could take the process down.
_CHILD = r"""
import json, sys
import numpy as np
from pjrt_plugins.errors import PjrtError
from pjrt_plugins.runtime import Client, load_library
from pjrt_plugins.conform._programs import ADD_F32

report = {}
library = load_library(sys.argv[1])
report["api_version"] = list(library.api_version)
try:
    client = Client(library, plugin_name="probe", initialize_timeout=120)
except PjrtError as exc:
    report["client"] = f"failed cleanly: {exc}"
else:
    report["client"] = f"created ({client.platform_name}, {len(client.addressable_devices)} devices)"
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 10, dtype=np.float32)
    executable = client.compile(ADD_F32)
    (out,), = executable.execute([[client.buffer_from_host(a), client.buffer_from_host(b)]])
    result = out.to_numpy()
    report["program"] = "ran: [0,1,2,3] + 10 = " + str(result.tolist()) if np.array_equal(result, a + b) else f"WRONG: {result}"
    client.close()
print("PROBE " + json.dumps(report))
"""


def probe_library(requirement: str, library: Path, python: str = sys.executable) -> Probe:
    """Load ``library`` in a child interpreter and report what it did."""
    env = {**os.environ, "TPU_SKIP_MDS_QUERY": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run([python, "-c", _CHILD, str(library)], capture_output=True, text=True,
                            timeout=_CHILD_TIMEOUT, env=env)
    probe = Probe(requirement, str(library))
    lines = [line for line in result.stdout.splitlines() if line.startswith("PROBE ")]
    if result.returncode != 0 or not lines:
        probe.error = f"exit status {result.returncode}: {(result.stderr or result.stdout)[-1500:]}"
        return probe
    report = json.loads(lines[-1].removeprefix("PROBE "))
    probe.api_version = tuple(report["api_version"])  # type: ignore[assignment]
    probe.client = report["client"]
    probe.program = report.get("program", "")
    return probe


def probe(requirement: str, cache: Path = DEFAULT_CACHE) -> Probe:
    """Download, unpack and probe one release."""
    return probe_library(requirement, pjrt_library(download(requirement, cache)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("requirements", nargs="+", metavar="DIST==VERSION")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"download folder (default {DEFAULT_CACHE})")
    args = parser.parse_args(argv)
    status = 0
    for requirement in args.requirements:
        try:
            result = probe(requirement, args.cache)
        except IndexUnreachableError as exc:
            print(exc, file=sys.stderr)
            return 2
        print(result.table_row().replace("| | | |", f"| `{requirement.split('==')[0]}` | | |", 1))
        if result.error:
            print(f"    did not load: {result.error}")
            status = 1
            continue
        print(f"    client: {result.client}")
        if result.program:
            print(f"    program: {result.program}")
    return status


if __name__ == "__main__":
    sys.exit(main())
