"""What ``conform`` is pointed at: a registered plugin by name, or a PJRT library file.

Resolution reads the registry and calls only cheap hooks (``pjrt_library_path``);
it never opens a library.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import pjrt_plugins

from .._listing import plugin_rows
from .._registry import plugin_record
from ..errors import PluginNotFoundError

logger = logging.getLogger(__name__)

_LIBRARY_SUFFIXES = (".so", ".dylib", ".dll")


@dataclass
class Target:
    """``mode`` is ``"plugin"`` (hooks and library) or ``"library"`` (a bare PJRT library)."""

    argument: str
    mode: str
    plugin: str | None = None
    library_path: str | None = None
    note: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    timeout: float = 60.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Target:
        return cls(**data)


def looks_like_path(argument: str) -> bool:
    """A library path rather than a plugin name: it contains ``/`` or ends in ``.so`` (``.dylib``, ``.dll``).

    Whether a file of that name exists does not matter: a file called ``cpu`` in the
    working directory must never be taken for the ``cpu`` plugin (write ``./cpu``).
    """
    return "/" in argument or os.sep in argument or argument.endswith(_LIBRARY_SUFFIXES)


def resolve_target(argument: str, *, bare: bool = False) -> Target:
    """Turn the command-line argument into a :class:`Target`.

    A registered plugin name wins; anything else must look like a path
    (:func:`looks_like_path`). A path to the library of a registered plugin is
    checked through that plugin (its hooks, its preflight: libtpu off a TPU VM must
    never be initialized). An unknown name raises
    :class:`~pjrt_plugins.PluginNotFoundError` listing the installed ones; a plugin
    that fails to load is still a target (its load check then FAILs). ``bare=True``
    checks a library path without any plugin's hooks, even when a plugin owns it.
    """
    if bare and not looks_like_path(argument):
        raise ValueError(f"--bare needs the path of a PJRT library (containing '/' or ending in .so), not {argument!r}")
    if not looks_like_path(argument):
        try:
            return Target(argument, "plugin", plugin=plugin_record(argument).name)
        except PluginNotFoundError as exc:
            hint = f" To check the file {argument!r} in this directory, write ./{argument}." if os.path.isfile(argument) else ""
            raise PluginNotFoundError(f"{exc}{hint}") from None
    path = os.path.abspath(os.path.expanduser(argument))
    owner = None if bare else _plugin_owning(path)
    if owner is not None:
        return Target(
            argument,
            "plugin",
            plugin=owner,
            note=f"{path} is the library of the registered plugin {owner!r}; checked through that plugin's hooks",
        )
    return Target(argument, "library", library_path=path)


def _plugin_owning(path: str) -> str | None:
    """The registered plugin whose library is ``path``; the plugins' code runs in a child (as for `list`)."""
    rows, _default, _error = plugin_rows()
    for row in rows:
        candidate = row["library_path"]
        if row["status"] in ("shadowed", "failed", "deferred") or not candidate or candidate.startswith("<error"):
            continue
        try:
            if os.path.exists(candidate) and os.path.samefile(candidate, path):
                return str(row["name"])
        except OSError as exc:
            logger.debug("plugin %s: cannot compare %s: %r", row["name"], candidate, exc)
    return None


def option_schema_of(target: Target) -> dict[str, Any] | None:
    """The plugin's option schema (to type ``-o KEY=VALUE``), or ``None`` for a library or a broken plugin."""
    if target.mode != "plugin" or target.plugin is None:
        return None
    try:
        return pjrt_plugins.get_plugin(target.plugin).option_schema()
    except Exception as exc:  # noqa: BLE001 - the checks report it; options are then read untyped
        logger.debug("no option schema for %s: %r", target.plugin, exc)
        return None
