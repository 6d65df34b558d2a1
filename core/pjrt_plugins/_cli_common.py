"""What every ``pjrt-plugins`` command shares: exit statuses, usage errors, time limits, option
values and the ``--json`` output stream.

Below the commands: :mod:`pjrt_plugins.cli` and the commands other modules add
(``conform``, ``new-plugin``) import it, so none of them imports another command's module.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from ._timeouts import seconds_problem
from .options import OptionType

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

_json_out: TextIO | None = None  # where --json output goes: the real stdout, kept apart from what plugin code prints


class UsageError(Exception):
    """Bad command-line input found after parsing (exit status 2)."""


def seconds(text: str) -> float:
    """argparse type of a time limit: a finite number of seconds above zero that the platform can
    wait for (``inf``, ``nan``, ``0`` and ``1e300`` refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    problem = seconds_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}, e.g. 60")
    return value


def json_output() -> TextIO | None:
    """The stream ``--json`` output goes to, once :func:`set_json_output` chose one."""
    return _json_out


def set_json_output(stream: TextIO) -> None:
    """Send ``--json`` output to ``stream`` (the real stdout, while ``sys.stdout`` carries plugin prints to stderr)."""
    global _json_out
    _json_out = stream


def print_json(data: Any) -> None:
    """Write ``--json`` output; every command uses this (sys.stdout carries plugin prints to stderr then)."""
    out = _json_out or sys.stdout
    json.dump(data, out, indent=2, default=str)
    out.write("\n")
    out.flush()


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table: a header row, a rule, then the rows (``None`` shown as ``-``)."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _parse_value(name: str, raw: str, kind: OptionType | None) -> Any:
    try:
        if kind is OptionType.INT64:
            return int(raw, 0)
        if kind is OptionType.FLOAT:
            return float(raw)
        if kind is OptionType.BOOL:
            lowered = raw.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return lowered in ("true", "1", "yes", "on")
        if kind is OptionType.INT64_LIST:
            return [int(part, 0) for part in raw.split(",") if part.strip()]
        if kind is OptionType.STRING:
            return raw
    except ValueError:
        assert kind is not None
        raise UsageError(f"option {name}={raw!r}: expected {kind.name.lower()}") from None
    # No schema: read the value as the most specific type that fits.
    for convert in (lambda v: int(v, 0), float):
        try:
            return convert(raw)
        except ValueError:
            pass
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    if "," in raw:
        try:
            return [int(part, 0) for part in raw.split(",")]
        except ValueError:
            pass
    return raw


def parse_options(items: Sequence[str], schema: dict[str, Any] | None) -> dict[str, Any]:
    """``-o KEY=VALUE`` items as create options, typed by the plugin's ``schema`` (any name without one)."""
    options: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"option {item!r} is not KEY=VALUE")
        name = name.strip()
        kind = schema.get(name) if schema else None
        if schema is not None and kind is None:
            raise UsageError(f"unknown option {name!r}; this plugin takes: {', '.join(sorted(schema)) or '(none)'}")
        options[name] = _parse_value(name, raw, kind)
    return options
