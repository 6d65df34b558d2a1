"""Conformance results: the four statuses, one result per check, the report and its JSON form, and diffs.

Pure data: nothing here loads a plugin or starts a process.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

#: Identifies the JSON layout written by ``pjrt-plugins conform --report``.
REPORT_FORMAT = "pjrt-plugins-conform/1"


class Status(str, enum.Enum):
    """How one check ended."""

    PASS = "PASS"  # the plugin does what the PJRT C API (or the hook contract) asks
    FAIL = "FAIL"  # a defect: wrong answer, crash, hang, or a contract broken
    UNSUPPORTED = "UNSUPPORTED"  # the plugin does not offer this capability (allowed)
    SKIP = "SKIP"  # not run: a prerequisite failed or is absent here (no hardware, one device)

    def __str__(self) -> str:
        return self.value


@dataclass
class CheckResult:
    """The outcome of one check: ``id`` (e.g. ``buffers.float32``), its status and the reason."""

    id: str
    title: str
    status: Status
    reason: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        data["seconds"] = round(self.seconds, 4)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckResult:
        return cls(
            id=str(data["id"]),
            title=str(data.get("title", "")),
            status=Status(data["status"]),
            reason=str(data.get("reason", "")),
            seconds=float(data.get("seconds", 0.0)),
        )


@dataclass
class Report:
    """Everything one ``conform`` run found about one plugin.

    ``target`` describes what was checked (``argument``, ``plugin``, ``distribution``,
    ``version``, ``library_path``, ``api_version``, ``mode``); ``ok`` is false only when
    some check FAILed. ``verdict`` is ``"defects"`` (a FAIL), ``"inconclusive"`` (no FAIL,
    but most checks were skipped here, e.g. for lack of hardware) or ``"conforms"``.
    """

    target: dict[str, Any]
    checks: list[CheckResult] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    pjrt_plugins_version: str = ""
    created: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.status is Status.FAIL for c in self.checks)

    @property
    def verdict(self) -> str:
        if not self.ok:
            return "defects"
        return "inconclusive" if self.inconclusive_reason() is not None else "conforms"

    def inconclusive_reason(self) -> str | None:
        """Why a report without FAIL vouches for little: more checks were skipped than ran, and the first cause."""
        if not self.ok:
            return None
        counts = self.counts()
        if counts[Status.SKIP.value] <= counts[Status.PASS.value] + counts[Status.UNSUPPORTED.value]:
            return None
        # The root skips; the others only say "needs <the check that was skipped>".
        roots = [c for c in self.checks if c.status is Status.SKIP and not c.reason.startswith("needs ")]
        why = f": {roots[0].id}: {roots[0].reason}" if roots else ""
        return f"{counts[Status.SKIP.value]} of {len(self.checks)} checks could not run here{why}"

    def counts(self) -> dict[str, int]:
        return {s.value: sum(c.status is s for c in self.checks) for s in Status}

    def get(self, check_id: str) -> CheckResult | None:
        return next((c for c in self.checks if c.id == check_id), None)

    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status is Status.FAIL]

    def to_json(self) -> dict[str, Any]:
        return {
            "format": REPORT_FORMAT,
            "pjrt_plugins_version": self.pjrt_plugins_version,
            "created": self.created,
            "target": self.target,
            "options": self.options,
            "ok": self.ok,
            "verdict": self.verdict,
            "inconclusive_reason": self.inconclusive_reason(),
            "summary": self.counts(),
            "notes": list(self.notes),
            "checks": [c.to_json() for c in self.checks],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Report:
        if not isinstance(data, Mapping) or data.get("format") != REPORT_FORMAT:
            found = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(
                f"not a conformance report (format {found!r}, expected {REPORT_FORMAT!r}); "
                "write one with `pjrt-plugins conform NAME --report FILE`"
            )
        return cls(
            target=dict(data.get("target") or {}),
            checks=[CheckResult.from_json(c) for c in data.get("checks") or []],
            options=dict(data.get("options") or {}),
            pjrt_plugins_version=str(data.get("pjrt_plugins_version", "")),
            created=str(data.get("created", "")),
            notes=[str(n) for n in data.get("notes") or []],
        )

    def write(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, indent=2, default=str)
            f.write("\n")


#: The largest report ``--diff`` reads (one is some tens of kB): past it, the file is not a report.
MAX_REPORT_BYTES = 16 << 20


def load_report(path: str | os.PathLike[str]) -> Report:
    """Read a report written by ``conform --report`` (or ``--json``); ValueError if it is not one.

    At most :data:`MAX_REPORT_BYTES` are read (``/dev/zero`` or a huge file is refused,
    not read to the end), and JSON nested too deeply to be a report is refused too.
    """
    name = os.fspath(path)
    with open(path, "rb") as f:  # a pipe works too (--diff <(...) after.json)
        raw = f.read(MAX_REPORT_BYTES + 1)
    if len(raw) > MAX_REPORT_BYTES:
        raise ValueError(f"{name!r} is larger than {MAX_REPORT_BYTES >> 20} MiB: not a conformance report")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name!r} is not UTF-8 text (byte {exc.start}): not a conformance report") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name!r} is not JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{name!r} is JSON nested too deeply to be a conformance report") from None
    try:
        return Report.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{name!r}: {exc}") from None


@dataclass
class CheckChange:
    """One check whose status differs between two reports (``None``: absent from that report)."""

    id: str
    before: Status | None
    after: Status | None
    reason: str = ""

    @property
    def kind(self) -> str:
        """``regression`` (now FAIL), ``fixed`` (was FAIL), ``added``, ``removed`` or ``changed``."""
        if self.after is Status.FAIL and self.before is not Status.FAIL:
            return "regression"
        if self.before is Status.FAIL and self.after is not Status.FAIL:
            return "fixed"
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        return "changed"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "before": self.before.value if self.before else None,
            "after": self.after.value if self.after else None,
            "reason": self.reason,
        }


@dataclass
class ReportDiff:
    """What changed from report ``before`` to report ``after``."""

    before: Report
    after: Report
    changes: list[CheckChange]

    @property
    def regressions(self) -> list[CheckChange]:
        return [c for c in self.changes if c.kind == "regression"]

    def to_json(self) -> dict[str, Any]:
        return {
            "before": self.before.target,
            "after": self.after.target,
            "regressions": len(self.regressions),
            "changes": [c.to_json() for c in self.changes],
            "summary": {"before": self.before.counts(), "after": self.after.counts()},
        }


def diff_reports(before: Report, after: Report) -> ReportDiff:
    """Compare two reports check by check, in the order the checks appear."""
    old = {c.id: c for c in before.checks}
    new = {c.id: c for c in after.checks}
    order = _merged_order(before.checks, after.checks)
    changes = []
    for check_id in order:
        a, b = old.get(check_id), new.get(check_id)
        if a is not None and b is not None and a.status is b.status:
            continue
        reason = (b.reason if b is not None else "") or (a.reason if a is not None else "")
        changes.append(CheckChange(check_id, a.status if a else None, b.status if b else None, reason))
    return ReportDiff(before, after, changes)


def _merged_order(first: Iterable[CheckResult], second: Iterable[CheckResult]) -> list[str]:
    seen: dict[str, None] = {}
    for check in (*first, *second):
        seen.setdefault(check.id, None)
    return list(seen)
