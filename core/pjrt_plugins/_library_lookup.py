"""Where a backend's PJRT library file is: an environment override, else a file inside an installed distribution.

Reads only environment variables and installed-package metadata: never imports the
distribution that ships the library, and never opens the library.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import PluginConfigurationError

if TYPE_CHECKING:  # pragma: no cover
    import logging


def _logger() -> logging.Logger:
    import logging  # on the first log record: `import pjrt_plugins` does not pay for logging

    return logging.getLogger(__name__)


def installed_library(distributions: Iterable[tuple[str, str]]) -> Path | None:
    """The library file from the first installed distribution that has it, or ``None``.

    ``distributions`` are ``(distribution name, file path inside it)`` pairs, tried in
    order, e.g. ``[("xla-cpu-pjrt", "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")]``.
    A distribution that is installed without that file is logged and skipped.
    """
    for distribution, relative in distributions:
        try:
            dist = importlib.metadata.distribution(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
        path = Path(str(dist.locate_file(relative))).absolute()
        if path.is_file():
            return path
        _logger().warning("%s is installed but %s is missing from it", distribution, relative)
    return None


def find_library(env_var: str, distributions: Iterable[tuple[str, str]]) -> str | None:
    """The PJRT library a backend's ``pjrt_library_path`` hook should return.

    If the environment variable ``env_var`` is set (non-blank), its value, with ``~``
    expanded and made absolute; when that is not a regular file, the user's setting
    is broken and :class:`~pjrt_plugins.PluginConfigurationError` names the variable
    (so default selection reports it instead of quietly choosing another plugin).
    Otherwise the file found by :func:`installed_library` in ``distributions``, or
    ``None`` when none has it (``distributions`` may be empty: a backend whose default
    library sits in its own package checks only the override, then uses its own)::

        @hookimpl
        def pjrt_library_path(self):
            return pjrt_plugins.find_library("PJRT_CPU_LIBRARY_PATH",
                                             [("xla-cpu-pjrt", "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so")])
    """
    override = os.environ.get(env_var, "").strip()
    if override:
        path = Path(override).expanduser().absolute()
        if not path.is_file():
            what = "does not exist" if not path.exists() else "is not a regular file"
            raise PluginConfigurationError(
                f"environment variable {env_var}={override!r} names a PJRT library that {what}; "
                f"point it at the plugin's shared library, or unset it to use the installed one"
            )
        return str(path)
    installed = installed_library(distributions)
    return str(installed) if installed is not None else None
