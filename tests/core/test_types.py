"""The core and its runtime type-check under mypy --strict, the SPMD package under mypy's basic checks
(configured in pyproject.toml, targeting Python 3.10, the oldest we support).

CI runs only pytest, so this test is where the types are enforced: a new error fails it with
mypy's own report.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_passes_on_the_whole_package(tmp_path: Path) -> None:
    try:
        import mypy  # noqa: F401
    except ImportError:
        pytest.fail("mypy is not installed: it is in the [test] extra (pip install -e '.[test]', or scripts/setup)")
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = (result.stdout + result.stderr).strip()
    assert result.returncode == 0, f"mypy found type errors:\n{report}"
    assert "Success" in report, report
