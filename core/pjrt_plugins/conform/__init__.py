"""The vendor kit: a conformance harness for PJRT plugins and the plugin-package generator.

``pjrt-plugins conform NAME|LIBRARY`` and ``pjrt-plugins new-plugin NAME`` are the
command-line faces of :func:`run_conformance` and :func:`write_plugin`. Importing
this package opens no library and starts no process.

Part of the tools, the top layer: it may import every layer below (the checks use the
runtime and the plugins' hooks) but nothing of ``spmd``, and no layer imports it. The checks
(and with them the runtime) load only when a plan is made or checks run (``_catalog``).
"""

from __future__ import annotations

from ._report import CheckChange, CheckResult, Report, ReportDiff, Status, diff_reports, load_report
from ._runner import DEFAULT_TIMEOUT_S, check_plan, run_conformance
from ._target import Target, resolve_target

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "CheckChange",
    "CheckResult",
    "Report",
    "ReportDiff",
    "Status",
    "Target",
    "check_plan",
    "diff_reports",
    "load_report",
    "resolve_target",
    "run_conformance",
]
