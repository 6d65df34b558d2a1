"""Fixtures for the backend tests: a scrubbed environment and a fresh Python process.

Backends read many environment variables; each test starts with none of them set so
the developer's shell cannot change a result.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping

import pytest

#: Every variable the cpu, gpu and tpu backends (or the core defaults they rely on) read.
BACKEND_ENV_VARS = (
    "PJRT_DEVICE",
    "PJRT_LOCAL_PROCESS_RANK",
    "PJRT_LOCAL_PROCESS_COUNT",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "RANK",
    "WORLD_SIZE",
    "GROUP_RANK",
    "XLA_DENSE_GATHER_FACTOR",
    "XLA_RNG_BIT_GENERATOR",
    "PJRT_LIBRARY_PATH",
    "PJRT_NAMES_AND_LIBRARY_PATHS",
    # cpu
    "CPU_NUM_DEVICES",
    "PJRT_CPU_LIBRARY_PATH",
    "PJRT_CPU_STALL_TIMEOUT",
    "PJRT_CPU_KEEP_FREED_MEMORY",
    "XLA_FLAGS",
    "PJRT_NPROC",
    "NPROC",
    # gpu
    "PJRT_GPU_LIBRARY_PATH",
    "GPU_NUM_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "PJRT_ALLOCATOR_CUDA_ASYNC",
    "PJRT_ALLOCATOR_FRACTION",
    "PJRT_ALLOCATOR_PREALLOCATE",
    # tpu
    "TPU_LIBRARY_PATH",
    "PJRT_TPU_SKIP_CHIP_CHECK",
    "PJRT_TPU_INITIALIZE_TIMEOUT",
    "PJRT_TPU_BASE_PORT",
    "TPU_SKIP_MDS_QUERY",
    "XLA_TPU_MAX_INFLIGHT_COMPUTATIONS",
    "TPU_WORKER_ID",
    "TPU_WORKER_HOSTNAMES",
    "TPU_ACCELERATOR_TYPE",
    "TPU_HOST_BOUNDS",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_PROCESS_BOUNDS",
    "TPU_CHIPS_PER_PROCESS_BOUNDS",
    "TPU_VISIBLE_CHIPS",
    "TPU_PROCESS_PORT",
    "TPU_PROCESS_ADDRESSES",
    "CLOUD_TPU_TASK_ID",
)


@pytest.fixture(autouse=True)
def clean_backend_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Unset every backend variable for the test; afterwards the environment is as it was.

    The configure hooks under test write variables of their own (``TPU_VISIBLE_CHIPS``,
    ``NEURON_RT_VISIBLE_CORES``, ...), which monkeypatch does not know to undo: without
    the restore they would leak into every later test of the session.
    """
    saved = dict(os.environ)
    for name in BACKEND_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    for name in set(os.environ) - set(saved):
        del os.environ[name]
    os.environ.update(saved)


def _scrubbed_environment(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in BACKEND_ENV_VARS}
    env.update(extra or {})
    return env


@pytest.fixture
def run_python() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a snippet in a fresh interpreter with the backend variables scrubbed.

    ``run_python(code, env={...}, timeout=60)`` returns the completed process
    (stdout and stderr as text). A snippet that outlives ``timeout`` fails the
    test instead of hanging it.
    """

    def run(
        code: str, *, env: Mapping[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [sys.executable, "-c", textwrap.dedent(code)],
                env=_scrubbed_environment(env),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"the subprocess did not finish within {timeout} s (it hung):\n{exc.stdout}\n{exc.stderr}")

    return run
