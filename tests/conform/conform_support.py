"""Helpers for the vendor-kit tests: paths, a clean environment, and CLI results."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
#: Variables that would change which plugin or how many devices the CLI sees.
LEAKY_ENV = ("PJRT_DEVICE", "PJRT_LIBRARY_PATH", "PJRT_NAMES_AND_LIBRARY_PATHS", "CPU_NUM_DEVICES",
             "NEURONCORE_NUM_DEVICES", "NEURON_RT_VISIBLE_CORES", "NEURON_LIBRARY_PATH", "LOCAL_WORLD_SIZE",
             "PJRT_LOCAL_PROCESS_COUNT", "WORLD_SIZE")


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LEAKY_ENV}
    env.update(extra or {})
    return env


class CliRun:
    """The result of one ``python -m pjrt_plugins ...`` run."""

    def __init__(self, completed: subprocess.CompletedProcess[str]) -> None:
        self.returncode = completed.returncode
        self.stdout = completed.stdout
        self.stderr = completed.stderr

    def json(self) -> Any:
        return json.loads(self.stdout)

    def report(self) -> dict[str, Any]:
        """The --json report as {check id: (status, reason)} plus the raw data under "_raw"."""
        data = self.json()
        checks = {c["id"]: (c["status"], c["reason"]) for c in data["checks"]}
        checks["_raw"] = data
        return checks

    def __repr__(self) -> str:
        return f"<exit {self.returncode}>\nstdout:\n{self.stdout[-4000:]}\nstderr:\n{self.stderr[-4000:]}"
