"""What ``list``, ``doctor`` and ``conform`` share about their child processes: how one starts, how it talks, how a death is told.

They run plugin code in a child so a crash or hang cannot take the parent down.
The child reports on a pipe of its own, each event signed with a token the parent
sends on stdin: what plugin code prints can never pass for a report.
A child starts isolated (``python -I``: no current directory, no ``PYTHON*``
variables, no user site) with exactly the parent's import path, so a ``json.py``
in an untrusted working directory is never imported while the installed
packages, editable installs included, are found as in the parent. Nothing here
imports the runtime.
"""

from __future__ import annotations

import json
import math
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
    """A private duplicate of stdout (for ``--json`` output); fd 1 and sys.stdout then point at stderr.

    Whatever plugin code prints (Python or C) afterwards lands on stderr, so it cannot
    corrupt the JSON the CLI writes.
    """
    channel = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    sys.stdout.flush()
    os.dup2(2, 1)
    return channel


#: Names the file descriptor of the child's event channel (set by :class:`EventChild`, removed by :func:`open_channel`).
CHANNEL_FD_VAR = "PJRT_PLUGINS_EVENT_FD"
#: Longest event line the parent reads; a longer line is dropped, as any stray line.
MAX_EVENT_BYTES = 1 << 20


class EventChannel:
    """The child's end of the channel: a pipe only the parent reads, and the token that signs each event.

    Events never travel on stdout, where plugin code prints: the parent opens a pipe, passes
    its write end to the child (``pass_fds``) and sends a random token on the child's stdin.
    An event line carries the token, so neither a print nor a write to a guessed descriptor
    can pass for an event.
    """

    def __init__(self, stream: TextIO, token: str) -> None:
        self.stream = stream
        self.token = token

    def emit(self, mark: str, **event: Any) -> None:
        self.stream.write(_prefix(mark, self.token) + json.dumps(event, default=str) + "\n")
        self.stream.flush()


def _prefix(mark: str, token: str) -> str:
    return f"{mark}{token} " if token else mark


def open_channel() -> EventChannel:
    """Child side: the channel :class:`EventChild` opened, read before any plugin code runs.

    Started by hand (``python -m pjrt_plugins._doctor NAME``), with no channel, events go
    to stdout unsigned, so a person can read them.
    """
    raw = os.environ.pop(CHANNEL_FD_VAR, None)
    if raw is None:
        return EventChannel(private_stdout(), "")
    fd = int(raw)
    os.set_inheritable(fd, False)  # a process the plugin starts does not get it
    token = sys.stdin.readline().strip()
    return EventChannel(os.fdopen(fd, "w", buffering=1, encoding="utf-8"), token)


def emit(channel: TextIO | EventChannel, mark: str, **event: Any) -> None:
    if isinstance(channel, EventChannel):
        channel.emit(mark, **event)
        return
    channel.write(mark + json.dumps(event, default=str) + "\n")
    channel.flush()


def parse_event(line: str, mark: str, token: str = "") -> dict[str, Any] | None:
    """The event on ``line``, or ``None`` for anything else (a stray or unsigned line is never fatal)."""
    prefix = _prefix(mark, token)
    if not line.startswith(prefix):
        return None
    try:
        event = json.loads(line[len(prefix) :])
    except (ValueError, RecursionError):
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

    The child writes events with :func:`emit` on the channel :func:`open_channel` gives
    it (a pipe of its own, never its stdout); its stdout and stderr are kept together
    for the failure message. ``stdin`` is sent after the channel's token. ``command``
    and ``environ`` replace :func:`python_command` and :func:`child_environment` (another
    interpreter; the child must then read the channel as :func:`open_channel` does). Iterate
    :meth:`events`: each event must come within ``limit`` seconds of the previous one
    (the caller may change ``limit`` between events), and all within ``total`` seconds
    when given; past either the child's whole process group is killed and ``timed_out``
    is set.
    """

    def __init__(
        self,
        module: str,
        *args: str,
        mark: str,
        stdin: bytes | None = None,
        command: list[str] | None = None,
        environ: dict[str, str] | None = None,
    ) -> None:
        import queue
        import secrets
        import subprocess
        import tempfile
        import threading

        self.mark = mark
        self.timed_out = False
        self._token = secrets.token_hex(16)
        self._stderr = tempfile.TemporaryFile(mode="w+b")
        read_fd, write_fd = os.pipe()
        if write_fd <= 2:  # this process runs without a stdin/stdout/stderr: keep clear of the child's 0-2
            import fcntl

            moved = fcntl.fcntl(write_fd, fcntl.F_DUPFD_CLOEXEC, 3)
            os.close(write_fd)
            write_fd = moved
        try:
            env = dict(environ) if environ is not None else child_environment()
            env[CHANNEL_FD_VAR] = str(write_fd)
            self._process = subprocess.Popen(
                command or python_command(module, *args),
                stdin=subprocess.PIPE,
                stdout=self._stderr,
                stderr=self._stderr,
                pass_fds=(write_fd,),
                env=env,
                start_new_session=True,  # so a hung plugin's threads and children can be killed as a group
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the child holds the only write end: its exit ends the channel
        self._events = os.fdopen(read_fd, "rb")
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._read, name=f"{module}-events", daemon=True).start()
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(self._token.encode() + b"\n" + (stdin or b""))
            self._process.stdin.close()
        except OSError:  # the child died at once; events() ends and returncode says how
            pass

    def _read(self) -> None:
        while True:
            line = self._events.readline(MAX_EVENT_BYTES)
            if not line:
                break
            if not line.endswith(b"\n"):  # longer than any event: drop it, up to its end
                while line and not line.endswith(b"\n"):
                    line = self._events.readline(MAX_EVENT_BYTES)
                continue
            self._lines.put(line)
        self._events.close()
        self._lines.put(None)

    def events(self, limit: float, *, total: float | None = None) -> Any:
        """Yield each event until the child closes its channel or falls silent for ``limit`` seconds."""
        import queue
        import time

        self.limit = limit
        started = time.monotonic()
        end = started + total if total is not None else math.inf
        deadline = min(started + self.limit, end)
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.timed_out = True
                self.kill()
                return
            if line is None:
                return
            event = parse_event(line.decode("utf-8", "replace"), self.mark, self._token)
            if event is not None:
                yield event
                deadline = min(time.monotonic() + self.limit, end)

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
        """What the child wrote on stdout and stderr (its own messages and whatever plugin code printed)."""
        self._stderr.seek(0)
        return self._stderr.read().decode("utf-8", "replace")

    def close(self) -> None:
        self._stderr.close()  # the channel is closed by its reader, at its end
