"""What ``doctor`` and ``conform`` share about their child processes: the environment, and how a death is told.

Both run vendor-library work in a child so a crash or hang cannot take the parent down.
Nothing here starts a process or imports the runtime.
"""

from __future__ import annotations

import os
import signal
import sys


def child_environment() -> dict[str, str]:
    """This process's environment for a child that must see exactly the distributions this process sees."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def describe_exit(returncode: int) -> str:
    """``"was killed by SIGSEGV"`` or ``"exited with status 3"``: to follow "the process"."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def output_tail(stderr: str, lines: int = 6) -> str:
    """The last non-blank ``lines`` of a child's output, as an indented ``; last output:`` suffix ("" if none)."""
    kept = [line for line in stderr.strip().splitlines() if line.strip()][-lines:]
    return ("; last output:\n      " + "\n      ".join(kept)) if kept else ""
