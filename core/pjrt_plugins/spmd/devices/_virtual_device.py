"""The virtual device: the plugin, the shared client and the PJRT devices that ``pjrt:0`` stands for.

Holds the process-wide choice of plugin, client options and SPMD mode, and creates the client on
first use. Knows nothing of torch's device registration (the frontend layer owns that).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..._plugin import DevicePlugin
from ..._registry import default_plugin, get_plugin
from ...errors import PjrtPluginsError, VirtualDeviceError

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_SPMD",
    "DEVICE_NAME",
    "USE_SPMD_ENV",
    "VirtualDevice",
    "chosen_plugin",
    "is_spmd",
    "peek_virtual_device",
    "reset_choices",
    "set_plugin",
    "set_spmd",
    "spmd_from_environment",
    "virtual_device",
]

#: The name of the virtual device (the torch device ``pjrt:0`` once the frontend registers it).
DEVICE_NAME = "pjrt:0"
#: PyTorch/XLA's switch for SPMD mode.
USE_SPMD_ENV = "XLA_USE_SPMD"
#: SPMD is on unless ``XLA_USE_SPMD=0`` or ``use_spmd`` is told otherwise (docs/spmd.md, "SPMD mode").
DEFAULT_SPMD = True

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass
class VirtualDevice:
    """The PJRT devices behind ``pjrt:0`` in this process.

    ``devices`` are runtime Device objects in ordinal order: ordinal ``i`` (the
    id used in meshes and shardings) is ``devices[i]``. With SPMD off only the
    first device is used.
    """

    plugin: DevicePlugin
    client: Any
    devices: tuple[Any, ...]
    spmd: bool
    generation: int
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def device_ids(self) -> tuple[int, ...]:
        """The device ordinals, ``0..num_devices-1``."""
        return tuple(range(len(self.devices)))

    @property
    def device_assignment(self) -> list[int]:
        """Runtime device id for each ordinal (partition ``i`` runs on ``device_assignment[i]``)."""
        return [int(d.id) for d in self.devices]

    def device_name(self, ordinal: int) -> str:
        """A readable name for device ``ordinal``, e.g. ``'cpu:3'``."""
        device = self.devices[ordinal]
        platform = str(getattr(self.client, "platform_name", None) or getattr(device, "kind", "device"))
        return f"{platform.lower()}:{device.id}"

    def __repr__(self) -> str:
        name = getattr(self.plugin, "name", None) or type(self.plugin).__name__
        return f"<VirtualDevice {DEVICE_NAME} plugin={name!r} devices={self.num_devices} spmd={self.spmd}>"


_state_lock = threading.RLock()
_current: VirtualDevice | None = None
_generation = 0
_plugin_choice: Any = None  # None: pjrt_plugins.default_plugin()
_options_choice: dict[str, Any] | None = None
_spmd_choice: bool | None = None  # None: environment, then DEFAULT_SPMD


def _environment_spmd() -> bool | None:
    """``XLA_USE_SPMD`` as a bool, or ``None`` when it is unset or blank."""
    raw = os.environ.get(USE_SPMD_ENV)
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"environment variable {USE_SPMD_ENV}={raw!r} must be 1 or 0")


def spmd_from_environment() -> bool:
    """``XLA_USE_SPMD`` as a bool, or :data:`DEFAULT_SPMD` when unset."""
    value = _environment_spmd()
    return DEFAULT_SPMD if value is None else value


def _wanted_spmd_locked() -> bool:
    """The mode asked for: ``XLA_USE_SPMD`` when set, else the last ``set_spmd`` choice, else the default."""
    value = _environment_spmd()
    if value is not None:
        return value
    return _spmd_choice if _spmd_choice is not None else DEFAULT_SPMD


_warned_mismatch: set[tuple[int, bool]] = set()


def is_spmd() -> bool:
    """Whether SPMD is on: ``XLA_USE_SPMD`` when set (read at each call, as PyTorch/XLA's ``is_spmd()`` does),
    else the last ``use_spmd`` / ``set_spmd`` choice, else the default (on).

    The virtual device takes its mode when it is created and keeps it (a switch would lose the
    tensors on it): if ``XLA_USE_SPMD`` is changed by hand afterwards, this follows the variable
    and warns once that ``pjrt:0`` still runs in the other mode. ``xs.use_spmd()`` switches both.
    """
    with _state_lock:
        wanted = _wanted_spmd_locked()
        current = _current
        if current is not None and current.spmd != wanted and (current.generation, wanted) not in _warned_mismatch:
            _warned_mismatch.add((current.generation, wanted))
            warnings.warn(
                f"{USE_SPMD_ENV}={os.environ.get(USE_SPMD_ENV)!r} asks for SPMD {'on' if wanted else 'off'}, but the "
                f"virtual device {DEVICE_NAME} was created with SPMD {'on' if current.spmd else 'off'} and keeps that "
                "mode; set the variable before the first use of the device, or call pjrt_plugins.spmd.use_spmd()",
                stacklevel=2,
            )
        return wanted


def set_spmd(enabled: bool) -> None:
    """Switch SPMD mode; if the virtual device already exists in the other mode it is replaced.

    ``XLA_USE_SPMD``, when set, is updated to match, so that :func:`is_spmd` (which reads it
    first, as PyTorch/XLA's does) agrees.
    """
    global _spmd_choice
    with _state_lock:
        _spmd_choice = bool(enabled)
        if _environment_spmd() is not None:
            os.environ[USE_SPMD_ENV] = "1" if enabled else "0"
        if _current is not None and _current.spmd != _spmd_choice:
            warnings.warn(
                f"SPMD mode switched to {_spmd_choice} after the virtual device was in use: tensors already "
                "uploaded belong to the old device and must be moved to pjrt again",
                stacklevel=3,
            )
            _replace_current()


def set_plugin(plugin: Any = None, options: Mapping[str, Any] | None = None) -> None:
    """Choose the plugin (instance, registered name, or ``None`` for the default) and client options.

    Takes effect at the next use; a virtual device already in use is replaced,
    and tensors uploaded to it must be moved again.
    """
    global _plugin_choice, _options_choice
    if plugin is not None and not isinstance(plugin, str) and not hasattr(plugin, "create_client"):
        raise TypeError(f"plugin must be a DevicePlugin, a plugin name or None, got {type(plugin).__name__}")
    if isinstance(plugin, str):
        plugin = plugin.strip().lower()
    new_options = dict(options) if options is not None else None
    with _state_lock:
        if plugin == _plugin_choice and new_options == _options_choice:
            return  # the same choice: keep the device (and the tensors on it)
        _plugin_choice = plugin
        _options_choice = new_options
        _replace_current()


def reset_choices() -> None:
    """Forget set_plugin / set_spmd choices and the current device (for tests)."""
    global _plugin_choice, _options_choice, _spmd_choice
    with _state_lock:
        _plugin_choice = None
        _options_choice = None
        _spmd_choice = None
        _replace_current()


def _replace_current() -> None:
    global _current, _generation
    if _current is not None:
        logger.info("replacing %r", _current)
        _generation += 1
    _current = None


def chosen_plugin() -> DevicePlugin:
    """The plugin behind ``pjrt:0``: the live device's, else the one ``virtual_device()`` would create (no client)."""
    with _state_lock:
        if _current is not None:
            return _current.plugin
        return _resolve_plugin(_plugin_choice)


def peek_virtual_device() -> VirtualDevice | None:
    """The virtual device if it already exists (never opens a plugin)."""
    return _current


def virtual_device() -> VirtualDevice:
    """The virtual device, creating the shared client on first call."""
    global _current
    current = _current
    if current is not None:
        return current
    with _state_lock:
        if _current is None:
            try:
                _current = _create()
            except PjrtPluginsError as error:  # no plugin, or one that cannot run here: say so at the first use
                if hasattr(error, "add_note"):  # Python 3.11+
                    error.add_note("(raised at the first use of the pjrt device, which creates its client; "
                                   "choose the plugin with PJRT_DEVICE or pjrt_plugins.spmd.set_plugin, and see "
                                   "`pjrt-plugins devices` for what this machine has)")
                error._pjrt_no_device = True  # type: ignore[attr-defined]
                raise
        return _current


def _resolve_plugin(choice: Any) -> DevicePlugin:
    if choice is None:
        return default_plugin()
    if isinstance(choice, str):
        return get_plugin(choice)
    return choice


def _create() -> VirtualDevice:
    plugin = _resolve_plugin(_plugin_choice)
    spmd = _wanted_spmd_locked()
    options = dict(_options_choice or {})
    client = plugin.create_client(options or None)
    devices = tuple(client.addressable_devices)
    if not devices:
        raise VirtualDeviceError(f"plugin {getattr(plugin, 'name', plugin)!r} created a client with no devices")
    if not spmd:
        devices = devices[:1]
    vd = VirtualDevice(plugin, client, devices, spmd, _generation, options)
    logger.info("created %r", vd)
    return vd
