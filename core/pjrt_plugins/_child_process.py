"""What ``list``, ``doctor`` and ``conform`` share about their child processes: how one starts, how it talks, how a death is told.

They run plugin code in a child so a crash or hang cannot take the parent down.
A child starts isolated (``python -I``: no current directory, no ``PYTHON*``
variables, no user site) with exactly the parent's import path, so a ``json.py``
in an untrusted working directory is never imported while the installed
packages, editable installs included, are found as in the parent. Nothing here
imports the runtime.
"""

from __future__ import annotations

import json
import os
import signal
import site
import sys
from typing import Any, TextIO

#: Carries the parent's import path to the child (read and removed by the bootstrap below).
CHILD_PATH_VAR = "PJRT_PLUGINS_CHILD_PATH"

# Runs in the child under -I: take the parent's path, process the user site's .pth files when
# the parent used them (-I skips them), then run the module as `python -m` would.
_BOOTSTRAP = (
    "import json, os, runpy, site, sys\n"
    f"paths, user_site = json.loads(os.environ.pop({CHILD_PATH_VAR!r}))\n"
    "sys.path[:] = paths\n"
    "if user_site:\n"
    "    site.addsitedir(user_site)\n"
    "del sys.argv[0]\n"
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
)


def safe_import_path() -> list[str]:
    """This process's ``sys.path`` without the entries that mean "the current directory".

    Python puts ``''`` (``-c``) or the working directory (``-m``) first; a child must
    not import from there, since the user may be standing in a directory they do not trust.
    """
    cwd = os.getcwd()
    paths = [p for p in sys.path if p]
    if paths and sys.path and sys.path[0] in ("", cwd):
        if sys.path[0] == cwd:
            paths = paths[1:]
    return paths


def python_command(module: str, *args: str) -> list[str]:
    """The argv that runs ``python -m module args...`` isolated; pair it with :func:`child_environment`."""
    return [sys.executable, "-I", "-u", "-c", _BOOTSTRAP, module, *args]


def child_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for :func:`python_command`: this one plus the import path to use."""
    env = dict(os.environ)
    user_site = site.USER_SITE if site.ENABLE_USER_SITE and site.USER_SITE in sys.path else None
    env[CHILD_PATH_VAR] = json.dumps([safe_import_path(), user_site])
    env.update(extra or {})
    return env


def private_stdout() -> TextIO:
    """A private duplicate of stdout (for events, or --json output); fd 1 and sys.stdout then point at stderr.

    Whatever plugin code prints (Python or C) lands on stderr, so it can neither
    corrupt nor imitate the events the parent reads.
    """
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    sys.stdout.flush()
    os.dup2(2, 1)
    return channel


def emit(channel: TextIO, mark: str, **event: Any) -> None:
    channel.write(mark + json.dumps(event, default=str) + "\n")
    channel.flush()


def parse_event(line: str, mark: str) -> dict[str, Any] | None:
    """The event on ``line``, or ``None`` for anything else (a stray line is never fatal)."""
    if not line.startswith(mark):
        return None
    try:
        event = json.loads(line[len(mark) :])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


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


class EventChild:
    """A child started with :func:`python_command`, whose events are read with a time limit per step.

    The child writes events with :func:`emit` on its :func:`private_stdout`; its stderr
    is kept for the failure message. Iterate :meth:`events`: each event must come
    within ``limit`` seconds of the previous one (the caller may change ``limit``
    between events); past it the child's whole process group is killed and
    ``timed_out`` is set.
    """

    def __init__(self, module: str, *args: str, mark: str, stdin: bytes | None = None) -> None:
        import queue
        import subprocess
        import tempfile
        import threading

        self.mark = mark
        self.timed_out = False
        self._stderr = tempfile.TemporaryFile(mode="w+b")
        self._process = subprocess.Popen(
            python_command(module, *args),
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=child_environment(),
            start_new_session=True,  # so a hung plugin's threads and children can be killed as a group
        )
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._read, name=f"{module}-events", daemon=True).start()
        if stdin is not None:
            assert self._process.stdin is not None
            try:
                self._process.stdin.write(stdin)
                self._process.stdin.close()
            except OSError:  # the child died at once; events() ends and returncode says how
                pass

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def events(self, limit: float) -> Any:
        """Yield each event until the child closes its output or falls silent for ``limit`` seconds."""
        import queue
        import time

        self.limit = limit
        deadline = time.monotonic() + self.limit
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.timed_out = True
                self.kill()
                return
            if line is None:
                return
            event = parse_event(line.decode("utf-8", "replace"), self.mark)
            if event is not None:
                yield event
                deadline = time.monotonic() + self.limit

    def wait(self, timeout: float) -> int:
        """The exit status (negative: the signal), killing the child if it does not end within ``timeout``."""
        import subprocess

        try:
            return self._process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self._process.wait()

    def kill(self) -> None:
        try:
            os.killpg(self._process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            self._process.kill()

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def close(self) -> None:
        self._stderr.close()
