"""Run the checks in a child process, survive what the plugin does to it, and build the report.

A plugin may abort, crash or hang inside a check. The parent watches each check
with a time limit; when the child dies or is killed it records that check as
FAIL with the reason, then starts a fresh child for the checks still to run.
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pjrt_plugins

from .._child_process import EventChild, describe_exit, output_tail
from ._packaging import pure_wheel_warning
from ._report import CheckResult, Report, Status
from ._target import Target, resolve_target

#: Prefix of every event line the check process writes (anything else on the channel is ignored).
EVENT_MARK = "@@pjrt-plugins-conform@@ "

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 60.0
#: Seconds a fresh child may take to import pjrt_plugins and the plugin before its first check.
STARTUP_TIMEOUT_S = 60.0
#: A plugin that kills this many check processes in a row stops the run (every remaining check is SKIP).
MAX_CRASHES = 8
#: Extra seconds the parent waits past --timeout before killing a check (initialize enforces --timeout itself).
CHECK_GRACE_S = 5.0
EXIT_CHECK = ("process.exit", "the check process exits cleanly after the checks")


def check_plan() -> list[tuple[str, str]]:
    """``[(id, title)]`` of every check, in order (imports the check modules, opens nothing)."""
    from ._catalog import all_checks  # the lazy seam: the checks import the runtime

    return [(c.id, c.title) for c in all_checks()]


def run_conformance(
    target: Target | str,
    options: dict[str, Any] | None = None,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    progress: Callable[[CheckResult], None] | None = None,
) -> Report:
    """Check ``target`` (a plugin name, a library path or a resolved :class:`Target`) and return the report.

    ``options`` are client create options laid over the plugin's defaults.
    ``timeout`` bounds each check (seconds). ``progress`` is called with each result
    as it arrives.
    """
    if isinstance(target, str):
        target = resolve_target(target)
    target.options = dict(options or target.options or {})
    target.timeout = float(timeout)
    plan = check_plan()
    titles = dict(plan)
    results: dict[str, CheckResult] = {}
    facts: dict[str, Any] = {}
    notes: list[str] = [target.note] if target.note else []
    crashes = 0
    clean_exit: tuple[bool, str] | None = None
    while True:
        pending = [check_id for check_id, _ in plan if check_id not in results]
        if not pending:
            break
        if crashes >= MAX_CRASHES:
            for check_id in pending:
                results[check_id] = CheckResult(
                    check_id, titles[check_id], Status.SKIP, f"not run: the plugin killed {crashes} check processes"
                )
            break
        run = _ChildRun(target, pending, {k: r.status.value for k, r in results.items()}, timeout)
        for event in run.events():
            kind = event.get("event")
            if kind == "result":
                result = CheckResult.from_json(event)
                results[result.id] = result
                if progress is not None:
                    progress(result)
            elif kind == "fact":
                facts.update({k: v for k, v in event.items() if k != "event"})
        if run.interrupted is not None:
            check_id = run.interrupted
            results[check_id] = CheckResult(check_id, titles.get(check_id, check_id), Status.FAIL, run.failure_reason())
            crashes += 1
            if progress is not None:
                progress(results[check_id])
            continue
        if not run.done:
            # Died between checks: blame the next one so the run always moves on.
            check_id = next(c for c in pending if c not in results)
            reason = "the check process died before this check started: " + run.failure_reason()
            results[check_id] = CheckResult(check_id, titles[check_id], Status.FAIL, reason)
            crashes += 1
            if progress is not None:
                progress(results[check_id])
            continue
        clean_exit = (run.returncode == 0, run.failure_reason() if run.returncode != 0 else "")
    exit_result = _exit_result(clean_exit)
    if progress is not None:
        progress(exit_result)
    ordered = [results[check_id] for check_id, _ in plan if check_id in results] + [exit_result]
    described = _describe_target(target, facts)
    packaging = pure_wheel_warning(described.get("distribution"), described.get("library_path"))
    if packaging:
        notes.append(packaging)
    return Report(
        target=described,
        checks=ordered,
        options=dict(target.options),
        pjrt_plugins_version=pjrt_plugins.__version__,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        notes=notes,
    )


def _exit_result(clean_exit: tuple[bool, str] | None) -> CheckResult:
    check_id, title = EXIT_CHECK
    if clean_exit is None:
        return CheckResult(check_id, title, Status.SKIP, "no check process ran to the end")
    ok, reason = clean_exit
    if ok:
        return CheckResult(check_id, title, Status.PASS, "exit status 0")
    return CheckResult(
        check_id,
        title,
        Status.FAIL,
        f"after all checks passed through, {reason}. A library that crashes at exit usually tears down "
        "static state twice or runs threads past exit",
    )


def _describe_target(target: Target, facts: dict[str, Any]) -> dict[str, Any]:
    described: dict[str, Any] = {
        "argument": target.argument,
        "mode": target.mode,
        "plugin": facts.get("plugin", target.plugin),
        "distribution": facts.get("distribution"),
        "version": facts.get("version"),
        "library_path": facts.get("library_path", target.library_path),
        "api_version": facts.get("api_version"),
    }
    if facts.get("unavailable_reason"):
        described["unavailable_reason"] = facts["unavailable_reason"]
    return described


class _ChildRun:
    """One check process: feed it the plan, yield its events, watch each check's time."""

    def __init__(self, target: Target, pending: list[str], statuses: dict[str, str], timeout: float) -> None:
        self.timeout = timeout
        self.interrupted: str | None = None  # the check in flight when the process died or was killed
        self.done = False
        self.returncode: int | None = None
        plan = {"target": target.to_json(), "pending": pending, "statuses": statuses}
        self._child = EventChild("pjrt_plugins.conform._child", mark=EVENT_MARK, stdin=json.dumps(plan).encode())

    @property
    def timed_out(self) -> bool:
        return self._child.timed_out

    def events(self) -> Iterator[dict[str, Any]]:
        child = self._child
        current: str | None = None
        for event in child.events(STARTUP_TIMEOUT_S + self.timeout):
            kind = event.get("event")
            if kind == "start":
                current = event.get("id")
                # A little grace, so a check that enforces the same limit itself reports first.
                child.limit = self.timeout + CHECK_GRACE_S
            elif kind == "result":
                current = None
                child.limit = self.timeout
                yield event
            elif kind == "done":
                self.done = True
                child.limit = self.timeout
            else:
                yield event
        self.returncode = child.wait(timeout=self.timeout)
        if current is not None and (child.timed_out or self.returncode != 0):
            self.interrupted = current

    def stderr_text(self) -> str:
        return self._child.stderr_text()

    def failure_reason(self) -> str:
        if self.timed_out:
            return (
                f"timed out after {self.timeout:g} s: the plugin did not answer (a library waiting for hardware "
                "or a service can hang; raise --timeout if it is only slow)"
            )
        code = self.returncode if self.returncode is not None else -1
        crash = " (a crash inside the plugin library)" if code < 0 else ""
        return f"the process {describe_exit(code)}{crash}{output_tail(self.stderr_text())}"
