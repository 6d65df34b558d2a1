"""The ``e2e`` marker, and the release wheelhouse every end-to-end test installs from (built once per session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from e2e_support import run_release


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: builds the release wheelhouse and pip-installs it into a fresh virtual environment (~2 min)"
    )


@pytest.fixture(scope="session")
def release_wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``scripts/release --no-isolation`` into a temporary wheelhouse: 5 sdists and 5 checked wheels."""
    wheelhouse = tmp_path_factory.mktemp("wheelhouse")
    result = run_release("--no-isolation", str(wheelhouse))
    assert result.returncode == 0, f"scripts/release failed:\n{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    return wheelhouse
