"""Fixtures for the distributed tests: a scrubbed environment and a real TCPStore on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from distributed_support import is_scrubbed


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: takes more than ~20 s (here: a torchrun job of two agents)")


@pytest.fixture(autouse=True)
def scrubbed_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No rank, launcher or device variable of the developer's shell reaches a test."""
    for name in list(os.environ):
        if is_scrubbed(name):
            monkeypatch.delenv(name)


@pytest.fixture
def tcp_store() -> Iterator[Any]:
    """A real TCPStore server on 127.0.0.1 (a free port), hosted by this process."""
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    yield server


@pytest.fixture
def store_client(tcp_store: Any) -> Any:
    """A second connection to ``tcp_store``, as another process of the job would have."""
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", tcp_store.port, 1, False, timeout=timedelta(seconds=30))
