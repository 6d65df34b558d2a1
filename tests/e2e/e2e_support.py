"""Helpers of the end-to-end tests: the release wheelhouse and a fresh virtual environment to install into."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename

from _support import clean_environment

REPO = Path(__file__).resolve().parents[2]
RELEASE = REPO / "scripts" / "release"


def run_release(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``scripts/release ARGS`` with this environment's interpreter (it has the [release] tools)."""
    return subprocess.run([sys.executable, str(RELEASE), *args], capture_output=True, text=True, timeout=timeout,
                          env=clean_environment(), cwd=REPO)


def wheels_in(wheelhouse: Path) -> dict[str, Path]:
    """distribution -> its wheel in ``wheelhouse``."""
    return {canonicalize_name(parse_wheel_filename(w.name)[0]): w for w in wheelhouse.glob("*.whl")}


@dataclass
class FreshVenv:
    root: Path
    python: Path
    workdir: Path  # where commands run: outside the repository
    wheels: dict[str, Path] = field(default_factory=dict)  # distribution -> wheel file

    @classmethod
    def create(cls, root: Path, workdir: Path) -> FreshVenv:
        """A new virtual environment without pip (the running interpreter's pip acts on it)."""
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
        workdir.mkdir(parents=True, exist_ok=True)
        return cls(root, root / "bin" / "python", workdir)

    @property
    def site_packages(self) -> Path:
        out = subprocess.run([str(self.python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout
        return Path(out.strip())

    def run(
        self, code: str, env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run a snippet with the new environment's interpreter, from a directory outside the repo."""
        return self.run_args(["-c", textwrap.dedent(code)], env=env, timeout=timeout)

    def run_args(
        self, args: list[str], env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return self.command([str(self.python), *args], env=env, timeout=timeout)

    def command(
        self, argv: list[str], env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run a program with the new environment's bin/ first on PATH, as after activating it."""
        path = f"{self.root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
        return subprocess.run(argv, cwd=self.workdir, env=clean_environment({"PATH": path, **(env or {})}),
                              capture_output=True, text=True, timeout=timeout)

    def pip(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """The running interpreter's pip, acting on the new environment (it has no pip of its own)."""
        command = [sys.executable, "-m", "pip", "--python", str(self.python), "--disable-pip-version-check"]
        command += ["--no-input", *args]
        env = clean_environment({"PIP_CONFIG_FILE": os.devnull})
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"
        return result
