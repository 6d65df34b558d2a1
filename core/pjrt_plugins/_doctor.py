"""`pjrt-plugins doctor`: check each plugin (loaded, available, library, API version, client).

Whatever touches a vendor library runs in a child process with a timeout, so a
library that hangs or aborts is reported, never able to hang or kill the doctor.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

from ._child_process import child_environment, describe_exit, open_event_channel, output_tail, parse_event, python_command
from ._child_process import emit as emit_event
from ._registry import PluginRecord

_MARK = "@@pjrt-plugins-doctor@@ "
_channel: TextIO | None = None  # the child's private event channel (set by probe)
DEFAULT_TIMEOUT_S = 60.0
STAGES = ("loaded", "available", "library", "api version", "client")


@dataclass
class Check:
    """One line of the report; ``ok`` is None when the check was skipped."""

    check: str
    ok: bool | None
    detail: str = ""
    fix: str = ""


@dataclass
class PluginReport:
    name: str
    provider: str
    origin: str
    status: str = "ok"  # ok | unavailable | broken | skipped
    checks: list[Check] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def diagnose(record: PluginRecord, *, timeout: float = DEFAULT_TIMEOUT_S, explicit: bool = False) -> PluginReport:
    """Check one registered plugin; library work happens in a child process."""
    report = PluginReport(record.name, record.provider, record.origin)
    if record.status == "failed":
        report.checks.append(Check("loaded", False, record.failure or "", _hint_of(record.error)))
        report.status = "broken"
        return report
    if record.status == "deferred" and not explicit:
        report.checks.append(
            Check(
                "loaded",
                None,
                f"not loaded: {record.deferred_reason}",
                f"run `pjrt-plugins doctor {record.name}` to load and check it",
            )
        )
        report.status = "skipped"
        return report
    report.checks.extend(_probe_in_child(record.name, timeout))
    failed = [c for c in report.checks if c.ok is False]
    unavailable = any(c.check == "available" for c in failed)
    # An unavailable plugin's library stage fails for the same reason; that is not a second problem.
    if unavailable and all(c.check == "available" or c.detail.startswith("PluginUnavailableError") for c in failed):
        report.status = "unavailable"
    elif failed:
        report.status = "broken"
    return report


def _hint_of(error: BaseException | None) -> str:
    text = str(error or "")
    _, sep, hint = text.partition("Hint: ")
    return hint.strip() if sep else ""


def _probe_in_child(name: str, timeout: float) -> list[Check]:
    command = python_command("pjrt_plugins._doctor", name)
    started = time.monotonic()
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=child_environment(), stdin=subprocess.DEVNULL
        )
        stdout, stderr, returncode, timed_out = proc.stdout, proc.stderr, proc.returncode, False
    except subprocess.TimeoutExpired as exc:
        stdout = _text(exc.stdout)
        stderr, returncode, timed_out = _text(exc.stderr), None, True
    checks, current = _parse_child_output(stdout)
    if timed_out:
        checks.append(
            Check(
                current or "loaded",
                False,
                f"timed out after {time.monotonic() - started:.0f} s (the plugin did not answer)",
                "a vendor library probing for hardware can hang: check the device and driver, "
                "raise --timeout if it is only slow, or pick another plugin with PJRT_DEVICE",
            )
        )
    elif returncode != 0:
        # A stage that never finished died with the process; otherwise it died on the way out.
        stage = current or ("loaded" if not checks else "process exit")
        checks.append(Check(stage, False, f"the process {describe_exit(returncode)}{output_tail(stderr)}", _crash_fix(returncode, name)))
    return checks


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def _parse_child_output(stdout: str) -> tuple[list[Check], str | None]:
    """The finished checks, and the stage that started but never finished (if any)."""
    checks: list[Check] = []
    current = None
    for line in stdout.splitlines():
        event = parse_event(line, _MARK)
        if event is None:
            continue
        if "start" in event:
            current = str(event["start"])
            continue
        try:
            checks.append(Check(**event))
        except TypeError:  # not one of ours: ignore it, as any other stray line
            continue
        current = None
    return checks, current


def _crash_fix(returncode: int, name: str) -> str:
    if returncode < 0:
        return (
            "the plugin library crashed the process (a bug in the library or a PJRT ABI mismatch); "
            "report it to the plugin's maintainers with this output. pjrt_plugins cannot catch a crash inside the library"
        )
    return f"run `python -m pjrt_plugins._doctor {name}` to see the whole output"


# -- child side ---------------------------------------------------------------------


def _emit(**event: Any) -> None:
    emit_event(_channel if _channel is not None else sys.stdout, _MARK, **event)


def _run_stage(stage: str, action: Any, fix: str) -> Any:
    _emit(start=stage)
    try:
        ok, detail, value = action()
    except Exception as exc:
        _emit(check=stage, ok=False, detail=f"{type(exc).__name__}: {exc}", fix=_hint_of(exc) or fix)
        return None
    _emit(check=stage, ok=ok, detail=detail, fix="" if ok else fix)
    return value if ok else None


def probe(name: str) -> None:
    """Run the checks for ``name`` in this (child) process, reporting each on stdout."""
    import pjrt_plugins

    if not pjrt_plugins.autoload_enabled():
        pjrt_plugins.discover_plugins()
    plugin = _run_stage(
        "loaded",
        lambda: (True, type(getattr(p := pjrt_plugins.get_plugin(name), "wrapped", p)).__qualname__, p),
        "reinstall the plugin's package",
    )
    if plugin is None:
        return
    reason = plugin.unavailable_reason()
    _emit(start="available")
    _emit(
        check="available",
        ok=reason is None,
        detail=reason or "",
        fix="" if reason is None else "default selection skips this plugin; on a host without its hardware that is expected",
    )
    path = _run_stage(
        "library", lambda: (True, (lp := plugin.library_path()), lp), f"reinstall {plugin.distribution or 'the plugin'}"
    )
    if path is None:
        return

    def api_version() -> tuple[bool, str, Any]:
        from .runtime import load_library

        major, minor = load_library(path).api_version
        return True, f"{major}.{minor}", (major, minor)

    if _run_stage(
        "api version",
        api_version,
        "the file is not a PJRT plugin, or speaks a PJRT C API version this pjrt-plugins cannot use; "
        "upgrade pjrt-plugins or the plugin",
    ) is None:
        return
    if reason is not None:
        _emit(start="client")
        _emit(check="client", ok=None, detail="skipped: the plugin is unavailable here", fix="")
        return

    def client() -> tuple[bool, str, Any]:
        started = time.monotonic()
        with plugin.create_client() as created:
            devices = created.devices
            detail = f"{created.platform_name}, {len(devices)} device{'s' if len(devices) != 1 else ''}"
        return True, f"{detail} ({time.monotonic() - started:.2f} s)", True

    _run_stage(
        "client",
        client,
        "check the device, its driver and the plugin's create options (pjrt-plugins devices NAME -o KEY=VALUE)",
    )


if __name__ == "__main__":  # python -m pjrt_plugins._doctor NAME
    _channel = open_event_channel()  # the plugin's own prints go to stderr, never among the events
    probe(sys.argv[1])
