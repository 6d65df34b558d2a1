"""One switch for the plugins' own C++ logging: ``PJRT_PLUGINS_LOG_LEVEL``, applied before a library opens.

XLA's plugins log through absl/TSL and read ``TF_CPP_MIN_LOG_LEVEL``, ``TF_CPP_MAX_VLOG_LEVEL``
and ``TF_CPP_VMODULE`` when the library is loaded; libtpu reads ``TPU_STDERR_LOG_LEVEL``,
``TPU_MIN_LOG_LEVEL`` and ``TPU_VMODULE``. Left alone they print INFO lines on every client
creation. This module turns the one switch into those variables; it never opens a library.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import NamedTuple

from .errors import PluginConfigurationError

logger = logging.getLogger(__name__)

#: The switch. Unset: :data:`DEFAULT_LEVEL`, unless you set XLA's or libtpu's variables yourself.
LOG_LEVEL_ENV = "PJRT_PLUGINS_LOG_LEVEL"
#: Quiet, yet never hiding an error: ERROR and FATAL lines are printed, INFO and WARNING are not.
DEFAULT_LEVEL = "error"

#: Level names (JAX's ``JAX_LOGGING_LEVEL`` names, any case) to absl's minimum severity
#: (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL) and the VLOG verbosity that goes with them.
LEVELS: dict[str, tuple[int, int | None]] = {
    "debug": (0, 1),
    "info": (0, None),
    "warning": (1, None),
    "warn": (1, None),
    "error": (2, None),
    "fatal": (3, None),
    "critical": (3, None),
}
#: XLA's variables (TSL/absl logging in the XLA CPU and CUDA plugins).
XLA_VARIABLES = ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE")
#: libtpu's variables.
TPU_VARIABLES = ("TPU_STDERR_LOG_LEVEL", "TPU_MIN_LOG_LEVEL", "TPU_VMODULE")

_MODULE_ENTRY = re.compile(r"^[A-Za-z0-9_*?./-]+=\d+$")
_lock = threading.Lock()
_ours: dict[str, str] = {}  # the values this module wrote, to tell them from the user's


class NativeLogSettings(NamedTuple):
    """What :data:`LOG_LEVEL_ENV` asks for: absl's minimum severity, VLOG verbosity and per-module VLOG."""

    min_level: int
    max_vlog: int | None
    vmodule: str


def parse_log_level(text: str) -> NativeLogSettings:
    """``LEVEL[,MODULE=N,...]`` (e.g. ``info``, ``debug``, ``info,sharding_propagation=2``) as settings.

    Module entries alone (``pjrt_c_api_client=1``) mean level ``info``: VLOG lines are INFO
    lines. Raises :class:`~pjrt_plugins.PluginConfigurationError` naming the variable.
    """
    parts = [part.strip() for part in text.split(",") if part.strip()]
    level = "info" if parts and "=" in parts[0] else (parts.pop(0).lower() if parts else "")
    bad = [part for part in parts if not _MODULE_ENTRY.match(part)]
    if level not in LEVELS or bad:
        raise PluginConfigurationError(
            f"environment variable {LOG_LEVEL_ENV}={text!r} must be a level "
            f"({', '.join(n for n in LEVELS if n not in ('warn', 'critical'))}) optionally followed by "
            "module=verbosity entries, e.g. 'info' or 'info,sharding_propagation=2'"
        )
    min_level, max_vlog = LEVELS[level]
    return NativeLogSettings(min_level, max_vlog, ",".join(parts))


def _environment_for(settings: NativeLogSettings) -> dict[str, str]:
    values = {"TF_CPP_MIN_LOG_LEVEL": str(settings.min_level), "TPU_STDERR_LOG_LEVEL": str(settings.min_level),
              "TPU_MIN_LOG_LEVEL": str(settings.min_level)}
    if settings.max_vlog is not None:
        values["TF_CPP_MAX_VLOG_LEVEL"] = str(settings.max_vlog)
    if settings.vmodule:
        values["TF_CPP_VMODULE"] = values["TPU_VMODULE"] = settings.vmodule
    return values


def _set_by_user(names: tuple[str, ...]) -> bool:
    return any(name in os.environ and os.environ[name] != _ours.get(name) for name in names)


def apply_native_log_settings() -> dict[str, str]:
    """Write the variables the plugins read, before a plugin library is opened; returns what it wrote.

    With :data:`LOG_LEVEL_ENV` set, its settings replace XLA's and libtpu's variables. Unset, the
    default (:data:`DEFAULT_LEVEL`) fills them, except for a family (``TF_CPP_*``, ``TPU_*``) in
    which you set a variable yourself: that family is left as you set it. The variables stay in
    this process's environment, so other XLA libraries it loads later (jaxlib) and its child
    processes follow the same switch.
    """
    raw = os.environ.get(LOG_LEVEL_ENV, "").strip()
    settings = parse_log_level(raw or DEFAULT_LEVEL)
    wanted = _environment_for(settings)
    written: dict[str, str] = {}
    with _lock:
        for family in (XLA_VARIABLES, TPU_VARIABLES):
            if not raw and _set_by_user(family):
                continue  # the user's own TF_CPP_* / TPU_* settings win over our default
            for name in family:
                if name in wanted:
                    value = wanted[name]
                elif name in _ours and os.environ.get(name) == _ours[name]:
                    value = None  # ours from an earlier, different switch: no longer asked for
                else:
                    continue
                if value is None:
                    del os.environ[name]
                    del _ours[name]
                elif os.environ.get(name) != value:
                    os.environ[name] = _ours[name] = written[name] = value
    if written:
        logger.debug("plugin C++ logging: %s", written)
    return written
