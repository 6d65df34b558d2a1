"""Fixtures every test area shares (an area's own conftest.py may add to them or override them).

Nothing here is autouse: each area scrubs its own environment.
"""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def gcc() -> str:
    """The C compiler that builds the test plugins and libraries (and the stub's own build)."""
    path = shutil.which("gcc")
    if path is None:
        pytest.skip("gcc is not installed (needed to build the test libraries and plugins)")
    return path
