"""``pjrt-plugins conform``: check a PJRT plugin against the C API and the hook contract.

Loaded by :mod:`pjrt_plugins.cli` (``HELP``, ``add_arguments``, ``run``). Exit
status 0 when nothing FAILed (UNSUPPORTED and SKIP are not defects), 1 when a
check FAILed (or ``--diff`` found a regression), 2 for a usage error.
"""

from __future__ import annotations

import argparse
from typing import Any

from .._cli_common import EXIT_FAILURE, EXIT_OK, UsageError, parse_options, print_json, seconds
from ._packaging import WARNING_PREFIX
from ._report import CheckResult, Report, ReportDiff, Status, diff_reports, load_report
from ._runner import DEFAULT_TIMEOUT_S, run_conformance
from ._target import option_schema_of, resolve_target

HELP = "check a plugin (name or library path) against the PJRT C API and the hook contract"

_WIDTH = 11  # len("UNSUPPORTED")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check a PJRT plugin: ABI and version, initialize and attributes, client, devices, memories, "
        "error reporting, buffers of every dtype, compile and execute, multi-device execution, and (for "
        "a registered plugin) its Python hooks. Each check ends PASS, FAIL, UNSUPPORTED (the plugin does "
        "not offer it) or SKIP (a prerequisite failed or is absent here). Risky checks run in a separate "
        "process with a time limit, so a plugin that aborts or hangs is reported, not fatal."
    )
    parser.epilog = (
        "Exit status: 0 no check FAILed, 1 a check FAILed (or --diff found a regression), 2 usage error. "
        "A run without FAIL where more checks were skipped than ran (no hardware here) ends 'inconclusive here', "
        "with exit status 0."
    )
    parser.add_argument("target", nargs="?", metavar="PLUGIN|LIBRARY",
                        help="a registered plugin name (see `pjrt-plugins list`) or the path of a PJRT library (.so)")
    parser.add_argument("-o", "--option", action="append", metavar="KEY=VALUE",
                        help="client create option (repeatable), typed by the plugin's schema, e.g. -o cpu_device_count=4")
    parser.add_argument("--timeout", type=seconds, default=DEFAULT_TIMEOUT_S, metavar="S",
                        help="seconds allowed for each check before the plugin is declared hung "
                        f"(default: {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--report", metavar="FILE", help="also write the JSON report to FILE (for --diff later)")
    parser.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"),
                        help="compare two JSON reports instead of running checks; exit 1 if AFTER has new FAILs")
    parser.add_argument("--bare", action="store_true",
                        help="check a library path as a bare library, even if a registered plugin ships it "
                        "(no hooks, no preflight: a library that waits for absent hardware hangs until --timeout)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print every check, including those skipped because a prerequisite did not pass")


def run(args: argparse.Namespace) -> int:
    if args.diff:
        if args.target or args.option or args.report:
            raise UsageError("--diff compares two reports; give no plugin, -o or --report with it")
        return _run_diff(args, EXIT_OK, EXIT_FAILURE)
    if not args.target:
        raise UsageError("give a plugin name or a library path (or --diff BEFORE AFTER)")
    report = _run_checks(args)
    if args.report:
        report.write(args.report)
    if args.json:
        print_json(report.to_json())
    return EXIT_OK if report.ok else EXIT_FAILURE


def _run_checks(args: argparse.Namespace) -> Report:
    try:
        target = resolve_target(args.target, bare=args.bare)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    # The schema needs the plugin imported here: only for -o, so that without it no plugin code runs in this process.
    options = parse_options(args.option, option_schema_of(target)) if args.option else {}
    if args.json:
        return run_conformance(target, options, timeout=args.timeout)
    print(f"conform {args.target}" + (f"  (options: {options})" if options else ""), flush=True)
    if target.note:
        print(f"  note: {target.note}", flush=True)
    print(flush=True)
    folded: list[CheckResult] = []

    def show(result: CheckResult) -> None:
        if not args.verbose and _is_cascade(result):
            folded.append(result)
        else:
            print(format_result(result), flush=True)

    report = run_conformance(target, options, timeout=args.timeout, progress=show)
    for status in (Status.UNSUPPORTED, Status.SKIP):
        ids = [r.id for r in folded if r.status is status]
        if ids:
            why = "need a check that did not pass" if status is Status.SKIP else "need a capability the plugin lacks"
            print(f"  {status.value:<{_WIDTH}} {len(ids)} more that {why} (-v lists them): " + ", ".join(ids))
    print()
    print(_describe(report))
    return report


def _is_cascade(result: CheckResult) -> bool:
    """A SKIP or UNSUPPORTED inherited from a prerequisite (the prerequisite's own line says why)."""
    inherited = result.reason.startswith(("needs ", "no Python plugin"))
    return result.status in (Status.SKIP, Status.UNSUPPORTED) and inherited


def format_result(result: CheckResult) -> str:
    """One line per check: status, id, reason (long reasons wrap onto indented lines)."""
    reason = result.reason.replace("\n", "\n" + " " * (_WIDTH + 4))
    return f"  {result.status.value:<{_WIDTH}} {result.id:<26} {reason}".rstrip()


def _describe(report: Report) -> str:
    target = report.target
    who = target.get("plugin") or target.get("library_path") or target.get("argument")
    bits = [b for b in (target.get("distribution"), target.get("version")) if b]
    if target.get("api_version"):
        bits.append(f"PJRT C API {target['api_version']}")
    counts = report.counts()
    summary = ", ".join(f"{counts[s.value]} {s.value}" for s in Status)
    verdict = {
        "defects": f"{counts['FAIL']} defect{'s' if counts['FAIL'] != 1 else ''} found",
        "inconclusive": "inconclusive here",
        "conforms": "conforms",
    }[report.verdict]
    lines = [f"{who} ({', '.join(bits)})" if bits else str(who), f"{len(report.checks)} checks: {summary} => {verdict}"]
    if report.verdict == "inconclusive":
        lines.append(f"no defect found, but {report.inconclusive_reason()}; run it where the plugin's devices are")
    elif target.get("unavailable_reason"):
        lines.append(f"the plugin reports it cannot run on this host: {target['unavailable_reason']}")
    lines += [note for note in report.notes if note.startswith(WARNING_PREFIX)]
    return "\n".join(lines)


def _run_diff(args: argparse.Namespace, ok: int, failure: int) -> int:
    before, after = (load_report(path) for path in args.diff)
    diff = diff_reports(before, after)
    if args.json:
        print_json(diff.to_json())
    else:
        print(format_diff(diff, *args.diff))
    return failure if diff.regressions else ok


def format_diff(diff: ReportDiff, before_name: str = "before", after_name: str = "after") -> str:
    def label(report: Report, name: str) -> str:
        target: dict[str, Any] = report.target
        who = target.get("plugin") or target.get("library_path") or target.get("argument")
        return f"{name}: {who} (API {target.get('api_version') or '?'}, {report.created or 'undated'})"

    lines = [label(diff.before, before_name), label(diff.after, after_name), ""]
    if not diff.changes:
        lines.append("no check changed status")
    for change in diff.changes:
        was = change.before.value if change.before else "-"
        now = change.after.value if change.after else "-"
        lines.append(f"  {change.kind:<10} {change.id:<26} {was} -> {now}  {change.reason}".rstrip())
    regressions = len(diff.regressions)
    lines.append("")
    lines.append(f"{len(diff.changes)} changed, {regressions} regression{'s' if regressions != 1 else ''}")
    return "\n".join(lines)
