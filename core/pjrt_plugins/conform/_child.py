"""The check process: ``python -m pjrt_plugins.conform._child`` reads a plan on stdin and runs it.

Each check is announced before it starts and reported when it ends, one JSON
line each on the private channel the parent opened (never stdout, where the
plugin's own prints go), so the parent knows which check a plugin crash or hang
interrupted.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from .._child_process import EventChannel, open_channel
from .._discovery import discover_for_tools
from ._catalog import all_checks
from ._context import Context
from ._framework import run_check
from ._report import Status
from ._runner import EVENT_MARK
from ._target import Target


def emit(channel: EventChannel, **event: Any) -> None:
    channel.emit(EVENT_MARK, **event)


def run_plan(plan: dict[str, Any], channel: EventChannel) -> None:
    """Run the checks named in ``plan["pending"]``, given the statuses of those already done."""
    discover_for_tools()
    target = Target.from_json(plan["target"])
    statuses = {k: Status(v) for k, v in plan.get("statuses", {}).items()}
    pending = set(plan["pending"])
    ctx = Context(target)
    try:
        for item in all_checks():
            if item.id not in pending:
                continue
            emit(channel, event="start", id=item.id)
            result = run_check(item, ctx, statuses)
            statuses[item.id] = result.status
            emit(channel, event="result", **result.to_json())
            if item.id == "abi.version" and result.status is Status.PASS:
                major, minor = ctx.library.api_version
                emit(channel, event="fact", api_version=f"{major}.{minor}", library_path=ctx.library.path)
            if item.id == "python.load" and result.status is Status.PASS:
                plugin = ctx.plugin
                emit(
                    channel,
                    event="fact",
                    plugin=plugin.name,
                    distribution=plugin.distribution,
                    version=plugin.distribution_version,
                    unavailable_reason=plugin.unavailable_reason(),
                )
    finally:
        try:
            ctx.close()
        except Exception:  # noqa: BLE001 - the client.close check already reported a failure
            pass
    emit(channel, event="done")


def main() -> None:
    channel = open_channel()  # reads the token from stdin; the plan follows it
    plan = json.loads(sys.stdin.read())
    run_plan(plan, channel)
    channel.stream.flush()


if __name__ == "__main__":
    main()
