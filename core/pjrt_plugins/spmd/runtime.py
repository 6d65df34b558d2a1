"""PyTorch/XLA's ``torch_xla.runtime`` (``xr``) for SPMD code: the mode, the devices and this process's place.

Port: ``import torch_xla.runtime as xr`` becomes ``import pjrt_plugins.spmd.runtime as xr``. In SPMD
mode one process drives every device of the active plugin through the one virtual device
``pjrt:0``, so the answers are those PyTorch/XLA gives for a single-host SPMD job: one process,
world size 1, ordinal 0, and the plugin's devices as the "runtime devices". (This module is not
``pjrt_plugins.runtime``, the PJRT C API binding.)
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from . import devices as _devices
from .frontend import engine

logger = logging.getLogger(__name__)

__all__ = [
    "addressable_device_count",
    "addressable_runtime_device_count",
    "device_type",
    "global_device_count",
    "global_ordinal",
    "global_runtime_device_attributes",
    "global_runtime_device_count",
    "host_index",
    "initialize_cache",
    "is_bf16_supported",
    "is_spmd",
    "local_device_count",
    "local_ordinal",
    "local_process_count",
    "process_count",
    "process_index",
    "runtime_device_attributes",
    "set_device_type",
    "use_spmd",
    "world_size",
]


def use_spmd(auto: bool = False) -> None:
    """Turn SPMD mode on (sets ``XLA_USE_SPMD=1``, as PyTorch/XLA does); see :func:`pjrt_plugins.spmd.use_spmd`."""
    if auto:
        raise NotImplementedError("automatic sharding (use_spmd(auto=True)) is not supported; mark tensors instead")
    os.environ[_devices.USE_SPMD_ENV] = "1"
    _devices.set_spmd(True)


def is_spmd() -> bool:
    """Whether SPMD is on: ``XLA_USE_SPMD`` when set (read at each call, as PyTorch/XLA does), else our default (on)."""
    return _devices.is_spmd()


def device_type() -> str | None:
    """The active plugin's name in upper case (``"CPU"``, ``"CUDA"``, ``"TPU"``): PyTorch/XLA's ``PJRT_DEVICE``.

    The plugin is the one ``pjrt:0`` uses (``xs.set_plugin``, else ``PJRT_DEVICE``, else the
    available plugin with the highest priority); asking opens no library.
    """
    plugin = _devices.chosen_plugin()
    name = getattr(plugin, "name", None)
    return str(name).upper() if name else None


def set_device_type(pjrt_device: str) -> None:
    """Choose the plugin by name before the device is used (PyTorch/XLA sets ``PJRT_DEVICE``; so do we).

    Raises ``RuntimeError`` if ``pjrt:0`` already runs on another plugin, as PyTorch/XLA does
    once its runtime exists.
    """
    current = _devices.peek_virtual_device()
    if current is not None and str(getattr(current.plugin, "name", "")).upper() != pjrt_device.upper():
        raise RuntimeError(
            f"can't change the device type to {pjrt_device!r}: pjrt:0 already runs on "
            f"{getattr(current.plugin, 'name', current.plugin)!r} (call pjrt_plugins.spmd.set_plugin to replace it)"
        )
    os.environ["PJRT_DEVICE"] = pjrt_device


def global_runtime_device_count() -> int:
    """Every device of the active plugin's client (the devices a mesh spans; opens the client)."""
    return len(_devices.virtual_device().client.devices)


def addressable_runtime_device_count() -> int:
    """The devices this process drives."""
    return len(_devices.virtual_device().client.addressable_devices)


def global_device_count() -> int:
    """Torch devices of the job: 1, the virtual device ``pjrt:0`` (as PyTorch/XLA counts ``SPMD:0``)."""
    return 1


def addressable_device_count() -> int:
    """Torch devices this process sees: 1 (``pjrt:0``)."""
    return 1


def local_process_count() -> int:
    """Processes on this host (``PJRT_LOCAL_PROCESS_COUNT``, default 1), as PyTorch/XLA reads it."""
    return int(os.environ.get("PJRT_LOCAL_PROCESS_COUNT", "1") or 1)


def local_device_count() -> int:
    """Torch devices on this host: ``local_process_count() * addressable_device_count()``."""
    return local_process_count() * addressable_device_count()


def world_size() -> int:
    """Processes taking part in the SPMD program: 1 (one process drives every device)."""
    return 1


def global_ordinal() -> int:
    """This process's ordinal among all of them: 0."""
    return 0


def local_ordinal() -> int:
    """This process's ordinal on its host: 0."""
    return 0


def process_index() -> int:
    """This process's index in the plugin's client (0 for a single-process client)."""
    return int(_devices.virtual_device().client.process_index)


def process_count() -> int:
    """Processes the plugin's client spans (1 for a single-process client)."""
    return len({int(d.process_index) for d in _devices.virtual_device().client.devices}) or 1


def host_index() -> int:
    """The host's index, from the plugin's ``host_index`` hook."""
    return int(_devices.chosen_plugin().host_index())


def runtime_device_attributes(device: str) -> dict[str, Any]:
    """The attributes the plugin reports for one device (``"CPU:3"``, or its ordinal), plus ``name``."""
    for attributes in global_runtime_device_attributes():
        if device in (attributes["name"], attributes["name"].lower()) or str(device) == str(attributes["ordinal"]):
            return attributes
    names = [a["name"] for a in global_runtime_device_attributes()]
    raise ValueError(f"unknown device {device!r}; the plugin's devices are {names}")


def global_runtime_device_attributes() -> list[dict[str, Any]]:
    """One dict per device of the plugin, in ordinal order: ``name`` (``"CPU:0"``), ``ordinal``, ``kind``,
    ``process_index`` and the attributes the plugin reports (``coords``, ``core_on_chip`` on TPUs)."""
    vd = _devices.virtual_device()
    platform = str(vd.client.platform_name).upper()
    result = []
    for ordinal, device in enumerate(vd.client.devices):
        attributes = dict(device.attributes)
        attributes.update(name=f"{platform}:{device.id}", ordinal=ordinal, kind=device.kind,
                          process_index=int(device.process_index))
        result.append(attributes)
    return result


def initialize_cache(path: str, readonly: bool = False) -> None:
    """Keep compiled programs in ``path`` across processes (``xs.set_cache_dir``).

    ``readonly`` is accepted for ported code; this cache checks each entry's full key before
    loading it, so processes may share one directory for reading and writing.
    """
    if readonly:
        warnings.warn("initialize_cache(readonly=True): this process writes new programs to the cache too",
                      stacklevel=2)
    engine().set_cache_dir(path)


def is_bf16_supported() -> bool:
    """Whether bfloat16 tensors work on ``pjrt``: always (XLA supports the type on every plugin)."""
    return True
