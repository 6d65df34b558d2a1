"""Registers the ``e2e`` marker: tests that build wheels and install them into a new virtual environment."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: builds the wheels and pip-installs them into a fresh virtual environment (offline, ~1 min)"
    )
