"""`pjrt-plugins doctor`: check each plugin (loaded, available, library, API version, client, memory, partitioner).

Whatever touches a vendor library runs in a child process with a timeout, so a
library that hangs or aborts is reported, never able to hang or kill the doctor.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pjrt_plugins

from ._child_process import EventChannel, EventChild, describe_exit, open_channel, output_tail
from ._discovery import discover_for_tools
from .errors import UnsupportedFunctionError
from ._registry import PluginRecord, plugin_record

_MARK = "@@pjrt-plugins-doctor@@ "
_channel: EventChannel | None = None  # the child's private event channel (set in __main__)
DEFAULT_TIMEOUT_S = 60.0
STAGES = ("loaded", "available", "library", "api version", "client", "memory", "partitioner")


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
    if record.on_request_only and record.status == "deferred" and not explicit:
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
    checks, cut_short = _probe_in_child(record.name, timeout)
    report.checks.extend(checks)
    failed = [c for c in report.checks if c.ok is False]
    unavailable = not cut_short and any(c.check == "available" and not c.detail.startswith("misconfigured:") for c in failed)
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


def _probe_in_child(name: str, timeout: float) -> tuple[list[Check], bool]:
    """The checks the child reported, and whether it was cut short (hung, crashed or exited early)."""
    started = time.monotonic()
    child = EventChild("pjrt_plugins._doctor", name, mark=_MARK)
    try:
        checks, current, done = _read_checks(child.events(timeout, total=timeout))
        returncode = child.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
        stderr = child.stderr_text()
    finally:
        child.close()
    if child.timed_out:
        checks.append(
            Check(
                current or "loaded",
                False,
                f"timed out after {time.monotonic() - started:.0f} s (the plugin did not answer)",
                "a vendor library probing for hardware can hang: check the device and driver, "
                "raise --timeout if it is only slow, or pick another plugin with PJRT_DEVICE",
            )
        )
        return checks, True
    if returncode != 0 or not done:
        # A stage that never finished died with the process (even one that exited with status 0, as
        # os._exit(0) in plugin code does); otherwise it died on the way out.
        stage = current or ("loaded" if not checks else "process exit")
        early = "" if done else " before the checks finished"
        detail = f"the process {describe_exit(returncode)}{early}{output_tail(stderr)}"
        checks.append(Check(stage, False, detail, _crash_fix(returncode, name)))
        return checks, True
    return checks, False


_STAGE_NAMES = frozenset(STAGES)


def _read_checks(events: Any) -> tuple[list[Check], str | None, bool]:
    """The finished checks, the stage that started but never finished (if any), and whether the probe ended."""
    checks: list[Check] = []
    current = None
    for event in events:
        if event == {"done": True}:
            return checks, current, True
        if "start" in event:
            current = str(event["start"]) if event["start"] in _STAGE_NAMES else current
            continue
        check = _checked(event)
        if check is None:  # not one of ours: ignore it, as any other stray line
            continue
        checks.append(check)
        current = None
    return checks, current, False


def _checked(event: dict[str, Any]) -> Check | None:
    """A Check from an event whose fields all have their types, else ``None``."""
    if set(event) - {"check", "ok", "detail", "fix"} or event.get("check") not in _STAGE_NAMES:
        return None
    if event.get("ok") not in (True, False, None):
        return None
    if not all(isinstance(event.get(key, ""), str) for key in ("detail", "fix")):
        return None
    return Check(**event)


def _crash_fix(returncode: int, name: str) -> str:
    if returncode < 0:
        return (
            "the plugin library crashed the process (a bug in the library or a PJRT ABI mismatch); "
            "report it to the plugin's maintainers with this output. pjrt_plugins cannot catch a crash inside the library"
        )
    return f"run `python -m pjrt_plugins._doctor {name}` to see the whole output"


# -- child side ---------------------------------------------------------------------


def _emit(**event: Any) -> None:
    global _channel
    if _channel is None:
        _channel = open_channel()
    _channel.emit(_MARK, **event)


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
    """Run the checks for ``name`` in this (child) process, reporting each on its event channel."""
    discover_for_tools()
    _emit(start="loaded")
    try:
        plugin = pjrt_plugins.get_plugin(name)
    except pjrt_plugins.PluginLoadError as exc:  # the original error, and the hint the loader wrote
        detail = plugin_record(name).failure or str(exc)
        _emit(check="loaded", ok=False, detail=detail, fix=_hint_of(exc) or "reinstall the plugin's package")
        return
    except Exception as exc:
        _emit(check="loaded", ok=False, detail=f"{type(exc).__name__}: {exc}", fix=_hint_of(exc))
        return
    _emit(check="loaded", ok=True, detail=type(getattr(plugin, "wrapped", plugin)).__qualname__)
    _emit(start="available")
    reason, misconfigured = plugin._availability()
    if misconfigured is not None:
        fix = "fix or unset the setting named above; default selection stops at this plugin until then"
    else:
        fix = "" if reason is None else "default selection skips this plugin; on a host without its hardware that is expected"
    _emit(check="available", ok=reason is None, detail=reason or "", fix=fix)
    path = _run_stage(
        "library", lambda: (True, (lp := plugin.library_path()), lp), f"reinstall {plugin.distribution or 'the plugin'}"
    )
    if path is None:
        return

    def api_version() -> tuple[bool, str, Any]:
        from .runtime import load_library  # the lazy seam: only the doctor's child loads the runtime

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

    later: list[dict[str, Any]] = []

    def client() -> tuple[bool, str, Any]:
        started = time.monotonic()
        with plugin.create_client() as created:
            devices = created.devices
            detail = f"{created.platform_name}, {len(devices)} device{'s' if len(devices) != 1 else ''}"
            elapsed = time.monotonic() - started
            later.append(_memory_check(created))
            later.append(_partitioner_check(created))
        return True, f"{detail} ({elapsed:.2f} s)", True

    if _run_stage(
        "client",
        client,
        "check the device, its driver and the plugin's create options (pjrt-plugins devices NAME -o KEY=VALUE)",
    ):
        for check in later:
            _emit(start=check["check"])
            _emit(**check)


def _memory_check(client: Any) -> dict[str, Any]:
    """The ``memory`` check: the first addressable device's memory statistics (skipped where the plugin has none)."""
    devices = client.addressable_devices
    if not devices:
        return {"check": "memory", "ok": None, "detail": "skipped: no addressable device", "fix": ""}
    device = devices[0]
    try:
        info = device.get_memory_info()
    except UnsupportedFunctionError as exc:
        return {"check": "memory", "ok": None, "detail": f"skipped: {exc}", "fix": ""}
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure
        return {"check": "memory", "ok": False, "detail": f"{type(exc).__name__}: {exc}",
                "fix": "the plugin failed to report device memory statistics"}
    parts = [f"{_size(info['bytes_used'])} in use"]
    if info["peak_bytes_used"] is not None:
        parts.append(f"peak {_size(info['peak_bytes_used'])}")
    if info["bytes_limit"] is not None:
        parts.append(f"limit {_size(info['bytes_limit'])}")
    return {"check": "memory", "ok": True, "detail": f"device {device.id}: " + ", ".join(parts), "fix": ""}


def _partitioner_check(client: Any) -> dict[str, Any]:
    """The ``partitioner`` check: Shardy or GSPMD for sharded programs, as the plugin answers a tiny Shardy program."""
    from .runtime import shardy_refusal

    devices = client.addressable_devices
    if not devices:
        return {"check": "partitioner", "ok": None, "detail": "skipped: no addressable device", "fix": ""}
    try:
        reason = shardy_refusal(client, [int(d.id) for d in devices])
    except Exception as exc:  # noqa: BLE001 - reported as the check's failure
        return {"check": "partitioner", "ok": False, "detail": f"{type(exc).__name__}: {exc}",
                "fix": "the plugin failed while compiling a tiny sharded program"}
    detail = "shardy" if reason is None else f"gspmd ({reason})"
    if len(devices) == 1:
        detail += " (probed on the client's one device)"
    forced = os.environ.get("PJRT_PLUGINS_PARTITIONER", "").strip().lower()
    if forced in ("shardy", "gspmd"):
        detail += f"; PJRT_PLUGINS_PARTITIONER forces {forced}"
    return {"check": "partitioner", "ok": True, "detail": detail, "fix": ""}


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


if __name__ == "__main__":  # python -m pjrt_plugins._doctor NAME
    _channel = open_channel()  # before any plugin code runs: what plugins print never reaches it
    probe(sys.argv[1])
    _emit(done=True)  # a probe that ends without it was cut short (os._exit in plugin code)
