"""The `pjrt-plugins` command (also `python -m pjrt_plugins`): list, devices, doctor, and room for more.

Exit status: 0 success; 1 the command ran and found a failure (plugin missing,
broken or unavailable, client creation failed, doctor found a problem), or its
output could not be written; 2 usage error. Every command takes ``--json`` for
machine-readable output, and ``--log-level`` (or ``-v`` before the command) shows
the library's own log records.

The top of the package: it may import every layer, but loads the runtime (cffi, numpy)
only in the commands that open a library.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any, TextIO, cast

import pjrt_plugins

from . import _registry, errors
from .errors import PjrtPluginsError, UnsupportedExtensionError
from ._child_process import private_stdout
from ._cli_common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    json_output,
    parse_options,
    print_json,
    seconds,
    set_json_output,
    table,
)
from ._discovery import discover_for_tools
from ._doctor import DEFAULT_TIMEOUT_S as DOCTOR_TIMEOUT_S
from ._doctor import diagnose
from ._listing import DEFAULT_TIMEOUT_S as LIST_TIMEOUT_S
from ._listing import plugin_rows

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "UsageError", "build_parser", "main", "parse_options", "print_json", "seconds"]

#: ``--log-level`` values, and the level ``-v`` stands for.
LOG_LEVELS = ("debug", "info", "warning", "error")
VERBOSE_LEVEL = "debug"

#: Commands other modules provide: each module defines HELP, add_arguments(parser) and run(args) -> int.
EXTENSION_COMMANDS: tuple[tuple[str, str], ...] = (
    ("conform", "pjrt_plugins.conform.cli"),
    ("new-plugin", "pjrt_plugins.conform.new_plugin"),
    ("cache", "pjrt_plugins._cache_command"),
)


class OutputError(Exception):
    """Writing the command's output failed (a full disk, an I/O error): said on stderr, exit status 1."""


class _GuardedOutput:
    """A text stream whose write and flush failures become :class:`OutputError`.

    So no handler can mistake them for its own failure (and try to report them on the
    same output), and argparse, which ignores an OSError while printing help, cannot
    lose them. A closed pipe stays a BrokenPipeError: the reader has what it wanted.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            written = self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(exc) from exc
        return len(text) if written is None else int(written)  # some replacement streams return None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(exc) from exc

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


# -- list ------------------------------------------------------------------------------


def cmd_list(args: argparse.Namespace) -> int:
    rows, _default, _error = plugin_rows(args.timeout)
    if args.json:
        print_json({"plugins": rows, "installed_plugins_discovered": _installed_discovered()})
        return EXIT_OK
    if not rows:
        if not _installed_discovered():
            print("No PJRT library is named in the environment, and installed plugins are not looked for "
                  "(PJRT_PLUGINS_AUTOLOAD is off).")
        else:
            print("No PJRT plugins are installed. Install a backend package, or set PJRT_LIBRARY_PATH.")
        return EXIT_OK
    table_rows, notes, names, torch_xla = [], [], [], {}
    for row in rows:
        dist = row["distribution"] or row["origin"]
        if row["distribution"] and row["version"]:
            dist = f"{row['distribution']} {row['version']}"
        table_rows.append([row["name"] + (" *" if row["default"] else ""), dist, row["library_path"], row["priority"], row["status"]])
        if row["reason"]:
            notes.append(f"  {row['name']} ({row['status']}): {row['reason']}")
        if row.get("torch_xla"):
            torch_xla[row["name"]] = f"  {row['name']}: {row['torch_xla']}"
        if row.get("aliases") or row.get("also"):
            said = [f"also named {', '.join(row['aliases'])}"] if row.get("aliases") else []
            said += [f"also {origin}" for origin in row.get("also", [])]
            names.append(f"  {row['name']}: " + "; ".join(said))
    print(table(["NAME", "DISTRIBUTION", "LIBRARY", "PRIORITY", "STATUS"], table_rows))
    print("\n* = default plugin (PJRT_DEVICE, else the available plugin with the highest priority)")
    if not _installed_discovered():
        print("Installed plugins are not shown: PJRT_PLUGINS_AUTOLOAD is off.")
    if notes:
        print("\nReasons:\n" + "\n".join(notes))
    if names:
        print("\nOther names and origins:\n" + "\n".join(names))
    if torch_xla:
        print("\nPyTorch/XLA:\n" + "\n".join(torch_xla.values()))
    return EXIT_OK


# -- devices ---------------------------------------------------------------------------


def _installed_discovered() -> bool:
    return bool(_registry._state["discovered"])


def _default_plugin(timeout: float) -> Any:
    """default_plugin(), with the choice made in a child: only the chosen plugin's code runs in this process."""
    if os.environ.get(_registry.PJRT_DEVICE_VAR, "").strip():
        return pjrt_plugins.default_plugin()
    _rows, name, error = plugin_rows(timeout)
    if name is None:
        error = error or {"type": "PluginNotFoundError", "message": "no default plugin"}
        kind = getattr(errors, error["type"], None)
        kind = kind if isinstance(kind, type) and issubclass(kind, pjrt_plugins.PjrtPluginsError) else pjrt_plugins.PjrtPluginsError
        raise kind(error["message"])
    return pjrt_plugins.get_plugin(name)


def cmd_devices(args: argparse.Namespace) -> int:
    plugin = pjrt_plugins.get_plugin(args.name) if args.name else _default_plugin(LIST_TIMEOUT_S)
    options = parse_options(args.option or [], plugin.option_schema())
    path = plugin.library_path()
    from .runtime import load_library  # the lazy seam: only the commands that open a library load the runtime

    major, minor = load_library(path, timeout=plugin.initialize_timeout()).api_version
    with plugin.create_client(options) as client:
        devices = [
            {
                "id": d.id,
                "kind": d.kind,
                "process_index": d.process_index,
                "local_hardware_id": d.local_hardware_id,
                "addressable": d.is_addressable,
                **_device_memories(d),
            }
            for d in client.devices
        ]
        result = {
            "plugin": plugin.name,
            "distribution": plugin.distribution,
            "library_path": path,
            "api_version": f"{major}.{minor}",
            "platform_name": client.platform_name,
            "platform_version": client.platform_version,
            "process_index": client.process_index,
            "options": options,
            "devices": devices,
        }
    if args.json:
        print_json(result)
        return EXIT_OK
    print(f"plugin   {result['plugin']} ({result['distribution'] or 'no distribution'})")
    print(f"library  {path} (PJRT C API {result['api_version']})")
    print(f"platform {result['platform_name']} {result['platform_version']}".rstrip())
    print(f"process  {result['process_index']}\n")
    described = any(d["memory_descriptions"] for d in devices)
    print(
        table(
            ["ID", "KIND", "PROCESS", "LOCAL HW ID", "ADDRESSABLE", "MEMORIES", *(["SUPPORTED KINDS"] if described else [])],
            [
                [d["id"], d["kind"], d["process_index"], d["local_hardware_id"], d["addressable"], _kinds(d["memories"]),
                 *([_kinds(d["memory_descriptions"] or [])] if described else [])]
                for d in devices
            ],
        )
    )
    print("\n* = the device's default memory" + ("; SUPPORTED KINDS: the plugin's memory descriptions" if described else ""))
    missing = next((d["memory_descriptions_missing"] for d in devices if d.get("memory_descriptions_missing")), None)
    if missing:
        print(f"memory descriptions: {missing}")
    return EXIT_OK


def _device_memories(device: Any) -> dict[str, Any]:
    """A device's memory spaces and the memory kinds it describes, for `devices` (errors as text)."""
    result: dict[str, Any] = {}
    try:
        default = device.default_memory.id if device.is_addressable else None
        result["memories"] = [{"id": m.id, "kind": m.kind, "default": m.id == default} for m in device.memories]
    except PjrtPluginsError as exc:
        result["memories"], result["memories_error"] = [], str(exc)
    try:
        result["memory_descriptions"] = [
            {"kind": d.kind, "kind_id": d.kind_id, "default": d.is_default} for d in device.memory_descriptions
        ]
    except UnsupportedExtensionError as exc:
        result["memory_descriptions"], result["memory_descriptions_missing"] = None, str(exc)
    except PjrtPluginsError as exc:
        result["memory_descriptions"], result["memory_descriptions_missing"] = None, f"{type(exc).__name__}: {exc}"
    return result


def _kinds(memories: list[dict[str, Any]]) -> str:
    return ", ".join(m["kind"] + ("*" if m["default"] else "") for m in memories) or "-"


# -- doctor ----------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    if args.names:
        wanted = [_registry.plugin_record(name) for name in dict.fromkeys(args.names)]  # PluginNotFoundError lists what is installed
    else:
        wanted = pjrt_plugins.plugin_records()
    reports = []
    for record in wanted:
        if not args.json:
            _say(f"checking {record.name} ...")  # progress: a stderr that cannot be written must not stop the checks
        reports.append(diagnose(record, timeout=args.timeout, explicit=bool(args.names)))
    problems = [r for r in reports if r.status == "broken" or (args.names and r.status == "unavailable")]
    fastpath = _fastpath_state()
    if args.json:
        print_json({"ok": not problems and bool(reports), "runtime": fastpath, "plugins": [r.to_json() for r in reports]})
    else:
        if fastpath["fastpath"]:
            print("runtime: compiled fast path loaded\n")
        else:
            print(f"runtime: Python path, without the compiled fast path ({fastpath['reason']})\n")
        marks = {True: "ok", False: "FAIL", None: "skip"}
        for report in reports:
            print(f"{report.name}  ({report.provider})")
            for check in report.checks:
                mark = "no" if check.check == "available" and check.ok is False else marks[check.ok]
                print(f"  [{mark:>4}] {check.check:<12} {check.detail}".rstrip())
                if check.fix:
                    print(f"         fix: {check.fix}")
            print(f"  => {report.status}\n")
        counts = {s: sum(r.status == s for r in reports) for s in ("ok", "unavailable", "broken", "skipped")}
        summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        print(f"{len(reports)} plugin{'s' if len(reports) != 1 else ''} checked: {summary or 'none installed'}")
    if not reports:
        return EXIT_FAILURE
    return EXIT_FAILURE if problems else EXIT_OK


def _fastpath_state() -> dict[str, Any]:
    """Whether the runtime runs its compiled fast path, and why not (a slower dispatch, not a fault)."""
    with warnings.catch_warnings():  # doctor reports the reason itself
        warnings.simplefilter("ignore", RuntimeWarning)
        from .runtime import _fastpath  # the lazy seam (see cmd_devices)

    return {"fastpath": _fastpath.library is not None, "reason": _fastpath.unavailable_reason}


# -- logging ---------------------------------------------------------------------------

_LOG_LEVEL_ARGS = ("--log-level",)
_LOG_LEVEL_OPTIONS: dict[str, Any] = dict(
    dest="log_level", choices=LOG_LEVELS, type=str.lower, metavar="LEVEL",
    help=f"show the library's log records of this level and above on stderr ({', '.join(LOG_LEVELS)})",
)


def show_library_logs(level: str) -> None:
    """Send pjrt_plugins' log records of ``level`` and above to stderr (other libraries stay at warnings).

    Records of this process only: the checks that run in child processes report through their results.
    """
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("pjrt_plugins").setLevel(level.upper())


# -- wiring ----------------------------------------------------------------------------


def _add_extension_commands(subparsers: Any, common: argparse.ArgumentParser) -> None:
    for command, module_name in EXTENSION_COMMANDS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                continue  # not written / not installed: the command does not exist
            raise
        parser = subparsers.add_parser(command, parents=[common], help=getattr(module, "HELP", None))
        module.add_arguments(parser)
        parser.set_defaults(handler=module.run)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    common.add_argument(*_LOG_LEVEL_ARGS, **_LOG_LEVEL_OPTIONS, default=argparse.SUPPRESS)
    parser = argparse.ArgumentParser(
        prog="pjrt-plugins",
        description="Inspect the PJRT device plugins installed in this Python environment.",
        epilog="Exit status: 0 success, 1 a plugin or check failed (or the output could not be written), 2 usage error.",
    )
    parser.add_argument("--version", action="version", version=f"pjrt-plugins {pjrt_plugins.__version__}")
    parser.add_argument(*_LOG_LEVEL_ARGS, **_LOG_LEVEL_OPTIONS, default=None)
    parser.add_argument(
        "-v", "--verbose", dest="log_level", action="store_const", const=VERBOSE_LEVEL,
        help=f"show the library's debug log on stderr (--log-level {VERBOSE_LEVEL}); give it before the command",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = subparsers.add_parser("list", parents=[common], help="list plugins: name, distribution, library, priority, status")
    p.add_argument(
        "--timeout", type=seconds, default=LIST_TIMEOUT_S,
        help=f"seconds each plugin may take to import and answer (default: {LIST_TIMEOUT_S:g})",
    )
    p.set_defaults(handler=cmd_list)

    p = subparsers.add_parser("devices", parents=[common], help="create a client and list its devices")
    p.add_argument("name", nargs="?", help="plugin name (default: PJRT_DEVICE, else the best available plugin)")
    p.add_argument(
        "-o", "--option", action="append", metavar="KEY=VALUE", help="client create option (repeatable), e.g. -o cpu_device_count=8"
    )
    p.set_defaults(handler=cmd_devices)

    p = subparsers.add_parser(
        "doctor", parents=[common], help="check each plugin: loaded, available, library, API version, client"
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="plugins to check (default: all)")
    p.add_argument(
        "--timeout", type=seconds, default=DOCTOR_TIMEOUT_S,
        help=f"seconds allowed per plugin (default: {DOCTOR_TIMEOUT_S:g})",
    )
    p.set_defaults(handler=cmd_doctor)

    _add_extension_commands(subparsers, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status.

    A reader that stops early (``pjrt-plugins list | head -1``) ends the command quietly
    with status 0, as it got what it asked for. Output that cannot be written (a full
    disk: ``> /dev/full``, or no standard output at all: ``>&-``) is said on stderr,
    with status 1.
    """
    if sys.stdout is None:  # started with descriptor 1 closed: no command can say anything
        _say("pjrt-plugins: standard output is closed, so nothing could be shown; run it with an output "
             "(a terminal, a file or a pipe)")
        return EXIT_FAILURE
    stdout = sys.stdout
    sys.stdout = _GuardedOutput(stdout)
    try:
        status = _main(argv)
        sys.stdout.flush()  # here, where a closed pipe can still be handled, not at interpreter exit
    except BrokenPipeError:
        _discard_stdout()
        return EXIT_OK
    except OutputError as exc:
        _discard_stdout()
        _say(f"pjrt-plugins: cannot write the output: {exc}")
        return EXIT_FAILURE
    finally:
        sys.stdout = stdout
    return status


def _say(message: str) -> None:
    """A line on stderr, if there is one to write to."""
    try:
        print(message, file=sys.stderr, flush=True)
    except (AttributeError, OSError):
        pass


def _discard_stdout() -> None:
    """Point stdout (and the --json stream) at /dev/null so the interpreter's last flush cannot fail on the closed pipe again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, json_output()):
        if stream is not None:
            try:
                os.dup2(devnull, stream.fileno())
            except (OSError, ValueError):  # a stream without a descriptor (a test's capture): nothing to point
                pass
    os.close(devnull)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_level is not None:
        show_library_logs(args.log_level)
    if getattr(args, "json", False) and json_output() is None:
        set_json_output(cast(TextIO, _GuardedOutput(private_stdout())))  # a plugin printing at import lands on stderr, never in the JSON
    discover_for_tools()  # honours PJRT_PLUGINS_AUTOLOAD=0: then only environment-named libraries
    try:
        return int(args.handler(args))
    except UsageError as exc:
        parser.error(str(exc))  # exits with status 2
    except pjrt_plugins.PjrtPluginsError as exc:
        return _fail(args, exc)
    except BrokenPipeError:
        raise  # the reader went away: main() ends quietly
    except (ValueError, TypeError, OSError) as exc:  # e.g. a bad option value refused before the C call
        return _fail(args, exc)
    return EXIT_FAILURE  # pragma: no cover - parser.error does not return


def _fail(args: argparse.Namespace, exc: BaseException) -> int:
    if getattr(args, "json", False):
        print_json({"error": {"type": type(exc).__name__, "message": str(exc)}})
    else:
        _say(f"pjrt-plugins {args.command}: {type(exc).__name__}: {exc}")
    return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
