"""The torch device ``pjrt``: torch's PrivateUse1 backend registered as a Python backend named ``pjrt``.

The only module that touches ``torch.utils.backend_registration`` / PrivateUse1 (experimental in torch,
so isolated here). It answers what torch asks a device module (RNG state, autocast dtypes, synchronize, its one stream);
the kernels for factories and copies are ``_factories``'. Registering never opens a plugin.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

import torch
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from ...errors import VirtualDeviceError
from ..devices import DEVICE_NAME, decode_rng_state, encode_rng_state, rng_state, set_rng_state, set_seed
from . import _seam
from ._autocast import register as register_autocast

logger = logging.getLogger(__name__)

__all__ = ["DEVICE_TYPE", "TORCH_DEVICE", "check_torch_device", "register_backend"]

#: The torch device type of the virtual device.
DEVICE_TYPE = DEVICE_NAME.partition(":")[0]


class _PjrtBackendModule:
    """``torch.pjrt``: what torch asks a backend's device module.

    One device, always available. ``torch.random.fork_rng`` and ``torch.utils.checkpoint``
    save and restore the RNG state through ``get_rng_state`` / ``set_rng_state`` (and
    ``device(i)``), and ``torch.autocast("pjrt")`` asks ``get_amp_supported_dtype``.
    """

    #: ``torch.utils.checkpoint`` saves a device's RNG state only when its module says it is initialized.
    _initialized = True

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def set_device(device: Any) -> None:
        _check_index(device)

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        _check_index(device)
        return "pjrt (the devices of the active PJRT plugin)"

    class device:
        """``with torch.pjrt.device(0):``: selects the only device (anything else raises)."""

        def __init__(self, device: Any) -> None:
            _check_index(device)

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: Any) -> None:
            return None

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed(seed: int) -> None:
        set_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        set_seed(seed)

    @staticmethod
    def seed() -> None:
        set_seed(int.from_bytes(os.urandom(8), "little"))

    @staticmethod
    def seed_all() -> None:
        set_seed(int.from_bytes(os.urandom(8), "little"))

    @staticmethod
    def initial_seed() -> int:
        return rng_state()[0]

    @staticmethod
    def get_rng_state(device: Any = "pjrt") -> torch.Tensor:
        _check_index(device)
        return encode_rng_state(*rng_state())

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device: Any = "pjrt") -> None:
        _check_index(device)
        set_rng_state(*decode_rng_state(new_state))

    @staticmethod
    def get_rng_state_all() -> list[torch.Tensor]:
        return [encode_rng_state(*rng_state())]

    @staticmethod
    def set_rng_state_all(new_states: Any) -> None:
        states = list(new_states)
        if len(states) != 1:
            raise ValueError(f"the pjrt device has one RNG state, got {len(states)}")
        set_rng_state(*decode_rng_state(states[0]))

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    @staticmethod
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return True

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """Run pending work (``xs.sync()``); with the engine not yet loaded nothing can be pending."""
        engine = _seam.loaded_engine()
        if engine is not None:
            engine.sync()

    # torch.distributed.checkpoint's file writers overlap device-to-host copies with writing on the
    # device's current stream: one stream, always in step (a pjrt tensor's copy to the CPU returns done).

    @staticmethod
    def current_stream(device: Any = None) -> _PjrtStream:
        _check_index(device)
        return _STREAM

    @staticmethod
    def default_stream(device: Any = None) -> _PjrtStream:
        _check_index(device)
        return _STREAM

    @staticmethod
    def stream(stream: Any) -> contextlib.nullcontext:
        """``with torch.pjrt.stream(s):``: the pjrt device has one stream, so this selects it."""
        if stream is not None and not isinstance(stream, _PjrtStream):
            raise VirtualDeviceError(f"{stream!r} is not a stream of the pjrt device; use torch.pjrt.current_stream()")
        return contextlib.nullcontext(stream)


class _PjrtStream:
    """The one stream of the pjrt device (``torch.pjrt.current_stream()``).

    Copies of pjrt tensors to the host return complete, so there is never anything to wait for.
    """

    device_type = DEVICE_TYPE
    device_index = 0

    def synchronize(self) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def query(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"<pjrt stream of {DEVICE_TYPE}:0>"


_STREAM = _PjrtStream()


def _check_index(device: Any) -> None:
    """Accept the ways torch names the one device (``0``, ``"pjrt"``, ``"pjrt:0"``, a torch.device, ``None``)."""
    if device is None or (isinstance(device, int) and not isinstance(device, bool) and device in (0, -1)):
        return
    if isinstance(device, (str, torch.device)):
        check_torch_device(device)
        return
    raise VirtualDeviceError(f"{device!r} is not the pjrt device: it has one device, index 0")


_registered = False
_register_lock = threading.Lock()


def register_backend() -> None:
    """Make ``pjrt`` a torch device (idempotent). Raises if PrivateUse1 already belongs to another backend."""
    global _registered
    with _register_lock:
        if _registered:
            return
        current = torch._C._get_privateuse1_backend_name()
        if current not in ("privateuseone", DEVICE_TYPE):
            raise VirtualDeviceError(
                f"torch's PrivateUse1 backend is already registered as {current!r} by another library; "
                f"pjrt_plugins.spmd needs it for the {DEVICE_TYPE!r} device. Import only one of them."
            )
        if current == DEVICE_TYPE and hasattr(torch, DEVICE_TYPE):
            logger.debug("PrivateUse1 already set up as %r", DEVICE_TYPE)
        else:
            _setup_privateuseone_for_python_backend(DEVICE_TYPE, backend_module=_PjrtBackendModule())
        register_autocast(DEVICE_TYPE)
        _registered = True
        logger.debug("registered the %r torch device", DEVICE_TYPE)


def check_torch_device(device: Any) -> None:
    """Raise unless ``device`` is ``pjrt`` or ``pjrt:0``."""
    if device is None:
        return
    device = torch.device(device)
    if device.type != DEVICE_TYPE or device.index not in (None, 0):
        raise VirtualDeviceError(
            f"{device} is not the virtual device: pjrt_plugins has one device, {TORCH_DEVICE}, which stands "
            "for all devices of the active plugin (address single devices through a Mesh and mark_sharding)"
        )


register_backend()
#: The virtual device, ``pjrt:0`` (valid once the backend is registered, which importing this module does).
TORCH_DEVICE = torch.device(DEVICE_TYPE, 0)
