"""What `list` shows: each plugin described by a child process, one plugin at a time, within a time limit.

Describing a plugin runs its code (its import, its cheap hooks). A package that
calls ``os._exit()``, crashes or sleeps at import must not take ``list`` down,
so the parent never runs plugin code: a child describes the plugins one by one,
announcing each before it starts; when the child dies or falls silent past the
limit, that plugin is reported failed with the reason, and a fresh child goes on
with the rest (skipping the culprit, also when it picks the default plugin).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pjrt_plugins

from . import _registry
from ._child_process import EventChild, describe_exit, emit, open_channel, output_tail
from ._discovery import discover_for_tools
from ._registry import PJRT_DEVICE_VAR, PluginRecord, plugin_record
from ._torch_xla import torch_xla_name_note
from .errors import PluginLoadError

_MARK = "@@pjrt-plugins-list@@ "
#: Seconds a plugin may take to import and answer its cheap hooks (``list --timeout``).
DEFAULT_TIMEOUT_S = 30.0
#: Seconds a fresh child may take to start and discover, on top of the first plugin's limit.
STARTUP_TIMEOUT_S = 60.0


def _row(record: PluginRecord, status: str, reason: str | None, **facts: Any) -> dict[str, Any]:
    return {
        "name": record.name,
        "default": False,
        "distribution": record.distribution,
        "version": record.version,
        "origin": record.origin,
        "library_path": None,
        "priority": None,
        "status": status,
        "reason": reason,
        "torch_xla": torch_xla_name_note(record.entry_name, record.distribution) if record.entry_name else None,
        "aliases": record.aliases if status != "shadowed" else [],
        "also": list(record.also) if status != "shadowed" else [],
        **facts,
    }


def describe(record: PluginRecord) -> dict[str, Any]:
    """One row of `list` for ``record``, importing its plugin if needed (runs plugin code: child side)."""
    if record.on_request_only:
        return _row(record, "deferred", record.deferred_reason)
    try:
        plugin = pjrt_plugins.get_plugin(record.name)
    except pjrt_plugins.PjrtPluginsError:
        return _row(record, "failed", record.failure)
    facts: dict[str, Any] = {}
    try:
        path = plugin.hook.pjrt_library_path()
        facts["library_path"] = None if path is None else str(path)
    except Exception as exc:  # noqa: BLE001 - shown, not fatal
        facts["library_path"] = f"<error: {type(exc).__name__}: {exc}>"
    problem = None
    try:
        facts["priority"] = plugin.priority()
    except Exception as exc:  # noqa: BLE001
        problem = f"priority() raised {type(exc).__name__}: {exc}"
    reason, misconfigured = plugin._availability()
    status = "misconfigured" if misconfigured is not None else ("available" if reason is None else "unavailable")
    return _row(record, status, problem or reason, **facts)


def shadowed_rows(record: PluginRecord) -> list[dict[str, Any]]:
    return [_row(loser, "shadowed", f"the name is taken by {record.provider}") for loser in record.shadowed]


def plugin_rows(timeout: float = DEFAULT_TIMEOUT_S) -> tuple[list[dict[str, Any]], str | None, dict[str, str] | None]:
    """Every row of `list`, the default plugin's name, and why there is none (``{"type", "message"}``) if so."""
    records = pjrt_plugins.plugin_records()  # metadata only: nothing is imported here
    by_name = {record.name: record for record in records}
    described: dict[str, dict[str, Any]] = {}
    pending = list(by_name)
    broken: dict[str, str] = {}
    default: str | None = None
    default_error: dict[str, str] | None = None
    while True:
        child = EventChild("pjrt_plugins._listing", json.dumps({"names": pending, "broken": broken}), mark=_MARK)
        current: str | None = None
        finished = False
        limit = STARTUP_TIMEOUT_S + timeout
        for event in child.events(limit):
            child.limit = timeout
            if "start" in event:
                current = event["start"] if event["start"] in pending else None
            elif "row" in event:
                row = _checked_row(event["row"], by_name)
                if row is None:
                    continue
                described[row["name"]] = row
                if row["name"] in pending:
                    pending.remove(row["name"])
                current = None
            elif "default" in event and not finished:
                default, default_error = _checked_default(event.get("default"), event.get("error"), by_name)
                finished = True
        returncode = child.wait(timeout=10)
        why = f"timed out after {timeout:g} s" if child.timed_out else f"the process {describe_exit(returncode)}"
        why += output_tail(child.stderr_text(), lines=3)
        child.close()
        if finished:
            for name in pending:  # the child ended without describing it: never a missing row
                described[name] = _row(by_name[name], "failed", f"listing it failed: {why}")
            break
        if current not in pending:  # died outside any plugin: at start-up, or choosing the default
            for name in pending:
                described[name] = _row(by_name[name], "failed", f"listing it failed: {why}")
            default_error = {"type": "PluginLoadError", "message": f"the default plugin could not be chosen: {why}"}
            break
        reason = f"loading it and calling its hooks {why}; `pjrt-plugins doctor {current}` shows more"
        broken[current] = reason
        described[current] = _row(by_name[current], "failed", reason)
        pending.remove(current)
    rows = []
    for record in records:
        row = described[record.name]
        row["default"] = record.name == default
        rows.append(row)
        rows.extend(shadowed_rows(record))
    return rows, default, default_error


_STATUSES = frozenset({"available", "unavailable", "misconfigured", "failed", "deferred"})


def _checked_row(row: Any, by_name: dict[str, PluginRecord]) -> dict[str, Any] | None:
    """The row the child described, rebuilt from the parent's own record; ``None`` if it is not a row of ours.

    Only what the child alone can know (status, reason, library path, priority) is taken
    from it, each checked for its type; the name, distribution and version are the parent's.
    """
    if not isinstance(row, dict) or not isinstance(row.get("name"), str) or row["name"] not in by_name:
        return None
    status, reason, library, priority = row.get("status"), row.get("reason"), row.get("library_path"), row.get("priority")
    if status not in _STATUSES or not isinstance(reason, (str, type(None))) or not isinstance(library, (str, type(None))):
        return None
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        return None
    return _row(by_name[row["name"]], status, reason, library_path=library, priority=priority)


def _checked_default(name: Any, error: Any, by_name: dict[str, PluginRecord]) -> tuple[str | None, dict[str, str] | None]:
    """The default plugin's name, or why there is none, as the child reported them (anything else: no default)."""
    if isinstance(name, str) and name in by_name:
        return name, None
    if isinstance(error, dict) and all(isinstance(error.get(k), str) for k in ("type", "message")):
        return None, {"type": error["type"], "message": error["message"]}
    return None, {"type": "PluginLoadError", "message": "the listing process named no usable default plugin"}


# -- child side ---------------------------------------------------------------------


def _default() -> tuple[str | None, dict[str, str] | None]:
    """The name default_plugin() picks here, or why none can be picked."""
    requested = os.environ.get(PJRT_DEVICE_VAR, "").strip()
    try:
        if requested:  # named: shown as the default without loading it (it may be PyTorch/XLA's)
            try:
                return plugin_record(requested).name, None
            except pjrt_plugins.PluginNotFoundError as exc:
                raise pjrt_plugins.PluginNotFoundError(f"{PJRT_DEVICE_VAR}={requested!r}: {exc}") from None
        return pjrt_plugins.default_plugin().name, None
    except (pjrt_plugins.PjrtPluginsError, ValueError) as exc:
        return None, {"type": type(exc).__name__, "message": str(exc)}


def main(plan: dict[str, Any]) -> None:
    # Before any plugin code runs (`import pjrt_plugins` above reads metadata only, no plugin
    # module): what plugins print never reaches the channel.
    channel = open_channel()
    discover_for_tools()
    for name, reason in plan.get("broken", {}).items():
        _registry.mark_failed(name, PluginLoadError(f"plugin {name!r}: {reason}"))
    for name in plan.get("names", []):
        emit(channel, _MARK, start=name)
        emit(channel, _MARK, row=describe(plugin_record(name)))
    default, error = _default()
    emit(channel, _MARK, default=default, error=error)


if __name__ == "__main__":  # python -m pjrt_plugins._listing PLAN_JSON
    main(json.loads(sys.argv[1]))
