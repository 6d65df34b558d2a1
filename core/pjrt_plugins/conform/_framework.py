"""How a conformance check is declared and run: the registry of checks, their outcomes, prerequisites.

Runs inside the check process only. A check never lets an exception escape:
whatever it raises becomes its result.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import PjrtError, PluginInitializeTimeoutError, UnsupportedFunctionError
from ._report import CheckResult, Status

if TYPE_CHECKING:  # pragma: no cover
    from ._context import Context

logger = logging.getLogger(__name__)


class Outcome(Exception):
    """Raised by a check to end with a status other than PASS."""

    status: Status = Status.FAIL

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Fail(Outcome):
    status = Status.FAIL


class Unsupported(Outcome):
    status = Status.UNSUPPORTED


class Skip(Outcome):
    status = Status.SKIP


@dataclass(frozen=True)
class Check:
    """One check. ``func(ctx)`` returns the PASS detail or raises an :class:`Outcome`.

    ``requires``: checks that must PASS first. ``essential``: the PJRT C API cannot
    work without it, so a missing function or UNIMPLEMENTED is a FAIL, not UNSUPPORTED.
    ``python``: checks the plugin's Python side (not run for a bare library path).
    """

    id: str
    title: str
    func: Callable[[Context], str]
    requires: tuple[str, ...] = ()
    essential: bool = False
    python: bool = False


_CHECKS: dict[str, Check] = {}


def check(
    check_id: str, title: str, *, requires: tuple[str, ...] = (), essential: bool = False, python: bool = False
) -> Callable[[Callable[[Context], str]], Callable[[Context], str]]:
    """Register the decorated function as check ``check_id`` (run in registration order)."""

    def register(func: Callable[[Context], str]) -> Callable[[Context], str]:
        add_check(Check(check_id, title, func, tuple(requires), essential, python))
        return func

    return register


def add_check(item: Check) -> None:
    if item.id in _CHECKS:
        raise ValueError(f"conformance check {item.id!r} is declared twice")
    unknown = [r for r in item.requires if r not in _CHECKS]
    if unknown:
        raise ValueError(f"check {item.id!r} requires {unknown}, which are not declared before it")
    _CHECKS[item.id] = item


def registered_checks() -> list[Check]:
    """The checks declared so far, in order (``_catalog.all_checks`` declares them all first)."""
    return list(_CHECKS.values())


def blocking_prerequisite(item: Check, statuses: Mapping[str, Status], *, has_python: bool) -> Outcome | None:
    """Why ``item`` cannot run given the statuses so far (SKIP or UNSUPPORTED), or ``None``."""
    unsupported = None
    for required in item.requires:
        prerequisite = _CHECKS[required]
        if prerequisite.python and not has_python:
            continue  # a bare library has no Python side to wait for
        status = statuses.get(required)
        if status is Status.PASS:
            continue
        if status is Status.UNSUPPORTED:
            unsupported = unsupported or Unsupported(f"needs {required}, which the plugin does not offer")
            continue
        state = "did not run" if status is None else status.value
        return Skip(f"needs {required} ({state})")
    return unsupported


def run_check(item: Check, ctx: Context, statuses: Mapping[str, Status]) -> CheckResult:
    """Run one check and turn whatever happens into a :class:`CheckResult`."""
    if item.python and not ctx.has_python:
        return CheckResult(item.id, item.title, Status.SKIP, "no Python plugin: a bare library path was given")
    blocked = blocking_prerequisite(item, statuses, has_python=ctx.has_python)
    if blocked is not None:
        return CheckResult(item.id, item.title, blocked.status, blocked.reason)
    started = time.monotonic()
    try:
        detail = item.func(ctx)
        status, reason = Status.PASS, detail or ""
    except Outcome as outcome:
        status, reason = outcome.status, outcome.reason
    except PluginInitializeTimeoutError as exc:
        status, reason = Status.FAIL, f"{type(exc).__name__}: {exc}"
    except UnsupportedFunctionError as exc:
        status = Status.FAIL if item.essential else Status.UNSUPPORTED
        reason = str(exc)
    except PjrtError as exc:
        # UNIMPLEMENTED: the plugin says it does not offer the function.
        status = Status.UNSUPPORTED if exc.code_name == "UNIMPLEMENTED" and not item.essential else Status.FAIL
        reason = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a check reports, it never crashes the harness
        logger.debug("check %s raised", item.id, exc_info=True)
        status, reason = Status.FAIL, f"{type(exc).__name__}: {exc}"
    return CheckResult(item.id, item.title, status, reason, time.monotonic() - started)


def describe(value: Any) -> str:
    """A short repr for messages."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
