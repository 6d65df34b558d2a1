"""Which partitioner compiles the virtual device's programs: Shardy where the plugin takes it, else GSPMD.

``PJRT_PLUGINS_PARTITIONER`` (``shardy``, ``gspmd`` or ``auto``, the default) or :func:`set_partitioner`
chooses; ``auto`` asks the plugin once (``runtime.shardy_refusal`` compiles a tiny sharded ``sdy``
program) and keeps the answer per plugin for the process. A refusal is logged with its reason and
the programs keep GSPMD's annotations.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref

from ...runtime import shardy_refusal
from ..devices import VirtualDevice, virtual_device

logger = logging.getLogger(__name__)

__all__ = ["ENV_PARTITIONER", "get_partitioner", "partitioner_for", "partitioner_mode", "reset_partitioner_probes",
           "set_partitioner", "shardy_probe_result"]

ENV_PARTITIONER = "PJRT_PLUGINS_PARTITIONER"
_MODES = ("auto", "shardy", "gspmd")
_lock = threading.Lock()
_override: str | None = None
#: plugin identity -> None (takes Shardy) or the reason it does not.
_probes: dict[tuple, str | None] = {}
#: The last virtual device asked about (weakly: a replaced one must not be kept alive) and its answer (each step
#: asks: this keeps that to one comparison).
_last: tuple[weakref.ref, str | None] | None = None


def _check_mode(mode: str, where: str) -> str:
    value = mode.strip().lower()
    if value not in _MODES:
        raise ValueError(f"{where} must be one of {', '.join(_MODES)}, got {mode!r}")
    return value


def set_partitioner(mode: str | None) -> None:
    """Force the SPMD partitioner for programs compiled from now on: ``"shardy"``, ``"gspmd"``, or ``"auto"``
    (Shardy where the plugin takes it). ``None`` goes back to ``PJRT_PLUGINS_PARTITIONER`` (default ``auto``).

    Example::

        xs.set_partitioner("gspmd")   # compare against the older partitioner, or for a bug report
    """
    global _override
    _override = None if mode is None else _check_mode(mode, "set_partitioner's mode")


def partitioner_mode() -> str:
    """The requested mode: :func:`set_partitioner`'s, else ``PJRT_PLUGINS_PARTITIONER``'s, else ``"auto"``."""
    if _override is not None:
        return _override
    value = os.environ.get(ENV_PARTITIONER, "").strip()
    return _check_mode(value, ENV_PARTITIONER) if value else "auto"


def _probe_key(vd: VirtualDevice) -> tuple:
    client = vd.client
    return (getattr(vd.plugin, "name", None) or type(vd.plugin).__name__, str(getattr(client.library, "path", "")),
            getattr(client, "platform_version", None), tuple(vd.device_assignment))


def reset_partitioner_probes() -> None:
    """Forget every plugin's probe answer (the next program asks its plugin again)."""
    global _last
    with _lock:
        _probes.clear()
        _last = None


def shardy_probe_result(vd: VirtualDevice) -> str | None:
    """None when the plugin of ``vd`` partitions with Shardy, else why not (probed once per plugin and devices)."""
    global _last
    last = _last
    if last is not None and last[0]() is vd:
        return last[1]
    key = _probe_key(vd)
    with _lock:
        known = key in _probes
        reason = _probes[key] if known else shardy_refusal(vd.client, list(vd.device_assignment))
        _probes[key] = reason
        _last = (weakref.ref(vd), reason)
    if reason is not None and not known:
        name = getattr(vd.plugin, "name", None) or type(vd.plugin).__name__
        logger.warning("plugin %r compiles sharded programs with GSPMD: %s", name, reason)
    return reason


def partitioner_for(vd: VirtualDevice) -> str:
    """``"shardy"`` or ``"gspmd"``: what programs for ``vd`` are lowered and compiled for."""
    mode = partitioner_mode()
    if mode != "auto":
        return mode
    if vd.num_devices < 2:
        return "gspmd"  # nothing to partition: no annotations are emitted
    return "shardy" if shardy_probe_result(vd) is None else "gspmd"


def get_partitioner() -> str:
    """The partitioner sharded programs of the current virtual device get: ``"shardy"`` or ``"gspmd"``.

    A program whose shardings Shardy cannot express (manual or maximal ones, a dimension split unevenly)
    still keeps GSPMD; ``execution.last_program().lowered.partitioner`` says what one program got.

    Example::

        xs.get_partitioner()   # "shardy" on the CPU plugin
    """
    return partitioner_for(virtual_device())
