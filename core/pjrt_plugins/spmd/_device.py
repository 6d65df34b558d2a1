"""The virtual device ``pjrt:0``: torch's PrivateUse1 backend renamed ``pjrt``, and the PJRT devices it stands for.

The only module that touches ``torch.utils.backend_registration`` / PrivateUse1.
Creating tensors here never opens a plugin; the shared client is created on
first transfer (or when the device count is asked for).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import VirtualDeviceError

if TYPE_CHECKING:  # pragma: no cover
    from .._plugin import DevicePlugin

logger = logging.getLogger(__name__)

#: The torch device name of the virtual device.
DEVICE_TYPE = "pjrt"
#: PyTorch/XLA's switch for SPMD mode.
USE_SPMD_ENV = "XLA_USE_SPMD"
#: SPMD is on unless ``XLA_USE_SPMD=0`` or ``use_spmd`` is told otherwise (see docs/notes/spmd.md).
DEFAULT_SPMD = True

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


# =====================================================================================
# torch side: register PrivateUse1 as the Python backend "pjrt"
# =====================================================================================


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
        return _encode_rng_state(*rng_state())

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device: Any = "pjrt") -> None:
        _check_index(device)
        set_rng_state(*_decode_rng_state(new_state))

    @staticmethod
    def get_rng_state_all() -> list[torch.Tensor]:
        return [_encode_rng_state(*rng_state())]

    @staticmethod
    def set_rng_state_all(new_states: Any) -> None:
        states = list(new_states)
        if len(states) != 1:
            raise ValueError(f"the pjrt device has one RNG state, got {len(states)}")
        set_rng_state(*_decode_rng_state(states[0]))

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    @staticmethod
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return True

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """Run pending work (``xs.sync()``); with the engine not yet loaded nothing can be pending."""
        lazy = _lazy_module(load=False)
        if lazy is not None:
            lazy.sync()


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
_library: torch.library.Library | None = None  # kept alive: dropping it unregisters the kernels


def register_backend() -> None:
    """Make ``pjrt`` a torch device (idempotent). Raises if PrivateUse1 already belongs to another backend."""
    global _registered, _library
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
            from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

            _setup_privateuseone_for_python_backend(DEVICE_TYPE, backend_module=_PjrtBackendModule())
        _library = torch.library.Library("aten", "IMPL")
        _library.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
        _library.impl("empty_strided", _empty_strided, "PrivateUse1")
        _library.impl("_copy_from", _copy_from, "PrivateUse1")
        _library.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
        _library.impl("_efficientzerotensor", _efficient_zero_tensor, "PrivateUse1")
        _library.impl("resize_", _resize_, "PrivateUse1")
        for name in HOST_FACTORIES:
            _library.impl(name, _host_factory(name), "PrivateUse1")
        from ._autocast import register as register_autocast

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


# The kernels below run for factory functions (torch.empty(..., device="pjrt")) and for
# copies torch makes with the Python dispatch key excluded (torch.tensor(..., device="pjrt")).
# Everything else on our tensors reaches XLAShardedTensor.__torch_dispatch__.


def _empty_memory_format(
    size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None, memory_format: Any = None
) -> torch.Tensor:
    return _new_empty(size, dtype, layout, device)


def _empty_strided(
    size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> torch.Tensor:
    return _new_empty(size, dtype, layout, device)


def _check_factory_target(device: Any, layout: Any) -> None:
    check_torch_device(device)
    if layout not in (None, torch.strided):
        raise NotImplementedError(f"the pjrt device holds dense (strided) tensors only, not {layout}")


def _new_empty(size: Any, dtype: Any, layout: Any, device: Any) -> torch.Tensor:
    from ._data import TensorData
    from .tensor import wrap

    _check_factory_target(device, layout)
    return wrap(TensorData.empty(tuple(size), dtype or torch.get_default_dtype()))


def _efficient_zero_tensor(
    size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None
) -> torch.Tensor:
    """Autograd's zero gradients (``sgn``'s backward, ...): plain zeros here (torch marks them ZeroTensor to skip
    arithmetic on them; with us they cost one fill in the program)."""
    from ._data import TensorData
    from .tensor import wrap

    _check_factory_target(device, layout)
    dtype = dtype or torch.get_default_dtype()
    data = TensorData.from_host(torch.zeros(tuple(size), dtype=dtype), copy=False)
    data.recipe = (torch.ops.aten.full.default, (list(data.shape), 0), {"dtype": dtype})
    return wrap(data)


def _resize_(self: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
    """``resize_`` (and ``resize_as_``) reach this kernel with the wrapper's metadata: a pjrt tensor keeps its shape."""
    if tuple(int(s) for s in size) == tuple(self.shape):
        return self
    raise RuntimeError(f"resize_: a pjrt tensor cannot change its shape (from {list(self.shape)} to {list(size)}); "
                       "make a new tensor of the new shape (torch.empty(shape, device='pjrt')), or reshape/view it")


#: Factories whose size comes from their arguments (torch implements them as ``empty`` + an
#: ``out=`` kernel that resizes the result, which a pjrt tensor cannot do). Ours build the
#: values on the CPU with torch's own kernel and keep them as deferred host data, like
#: ``torch.zeros(..., device="pjrt")``: nothing moves until the tensor is used.
HOST_FACTORIES = (
    "arange",
    "arange.start",
    "arange.start_step",
    "eye",
    "eye.m",
    "linspace",
    "linspace.Tensor_Tensor",
    "linspace.Tensor_Scalar",
    "linspace.Scalar_Tensor",
    "logspace",
    "logspace.Tensor_Tensor",
    "logspace.Tensor_Scalar",
    "logspace.Scalar_Tensor",
    "tril_indices",
    "triu_indices",
)


def _host_factory(name: str) -> Any:
    packet, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.aten, packet), overload or "default")

    def kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        from ._data import TensorData
        from .tensor import to_cpu, wrap

        _check_factory_target(kwargs.get("device"), kwargs.get("layout"))
        # linspace/logspace take their ends as 0-d tensors too, which may be pjrt tensors
        args = tuple(to_cpu(a) if isinstance(a, torch.Tensor) and a.device.type == DEVICE_TYPE else a for a in args)
        values = op(*args, **{**kwargs, "device": torch.device("cpu"), "pin_memory": False})
        data = TensorData.from_host(values, copy=False)
        if packet == "arange" and not values.dtype.is_floating_point:  # exact: an engine may compute it itself
            data.recipe = (op, args, {"dtype": values.dtype})
        return wrap(data)

    kernel.__name__ = f"pjrt_{packet}_{overload or 'default'}"
    return kernel


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    from .tensor import copy_into

    return copy_into(dst, src)


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    from .tensor import copy_into

    if tuple(dst.shape) != tuple(src.shape):
        raise NotImplementedError(
            f"resizing a pjrt tensor from {tuple(dst.shape)} to {tuple(src.shape)} is not supported; "
            "allocate the output with the right shape"
        )
    return copy_into(dst, src)


register_backend()
#: The virtual device, ``pjrt:0`` (valid once the backend is registered, which importing this module does).
TORCH_DEVICE = torch.device(DEVICE_TYPE, 0)


# =====================================================================================
# runtime side: the plugin, the shared client and the devices pjrt:0 stands for
# =====================================================================================


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
        return f"<VirtualDevice {TORCH_DEVICE} plugin={name!r} devices={self.num_devices} spmd={self.spmd}>"


_state_lock = threading.RLock()
_current: VirtualDevice | None = None
_generation = 0
_plugin_choice: Any = None  # None: pjrt_plugins.default_plugin()
_options_choice: dict[str, Any] | None = None
_spmd_choice: bool | None = None  # None: environment, then DEFAULT_SPMD


def spmd_from_environment() -> bool:
    """``XLA_USE_SPMD`` as a bool, or :data:`DEFAULT_SPMD` when unset."""
    raw = os.environ.get(USE_SPMD_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_SPMD
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"environment variable {USE_SPMD_ENV}={raw!r} must be 1 or 0")


def is_spmd() -> bool:
    """Whether the virtual device stands for all devices (SPMD) or only the first one."""
    with _state_lock:
        if _current is not None:
            return _current.spmd
        return _spmd_choice if _spmd_choice is not None else spmd_from_environment()


def set_spmd(enabled: bool) -> None:
    """Switch SPMD mode; if the virtual device already exists in the other mode it is replaced."""
    global _spmd_choice
    with _state_lock:
        _spmd_choice = bool(enabled)
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


def _reset_choices() -> None:
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
            _current = _create()
        return _current


def _resolve_plugin(choice: Any) -> DevicePlugin:
    import pjrt_plugins

    if choice is None:
        return pjrt_plugins.default_plugin()
    if isinstance(choice, str):
        return pjrt_plugins.get_plugin(choice)
    return choice


def _create() -> VirtualDevice:
    plugin = _resolve_plugin(_plugin_choice)
    spmd = _spmd_choice if _spmd_choice is not None else spmd_from_environment()
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


# =====================================================================================
# the device RNG state: (seed, offset), read and restored by torch through the device module
# =====================================================================================

_rng_lock = threading.Lock()
_rng_seed: int | None = None
_rng_offset = 0
_rng_seen_initial: int | None = None
_MASK64 = (1 << 64) - 1


def _sync_seed_locked() -> None:
    """Follow ``torch.manual_seed`` / ``torch.seed`` even when they did not reach us (a fresh process)."""
    global _rng_seed, _rng_offset, _rng_seen_initial
    initial = torch.initial_seed()
    if _rng_seed is None or initial != _rng_seen_initial:
        _rng_seed, _rng_offset, _rng_seen_initial = int(initial) & _MASK64, 0, initial


def set_seed(seed: int) -> None:
    """Restart the device RNG stream from ``seed`` (``torch.manual_seed`` calls this through the device module)."""
    global _rng_seed, _rng_offset, _rng_seen_initial
    with _rng_lock:
        _rng_seed, _rng_offset, _rng_seen_initial = int(seed) & _MASK64, 0, torch.initial_seed()


def get_seed() -> int | None:
    """The seed of the device RNG stream, or ``None`` before any seed reached it."""
    return _rng_seed


def rng_state() -> tuple[int, int]:
    """The device RNG state: ``(seed, offset)``, the key the next random draw uses."""
    with _rng_lock:
        _sync_seed_locked()
        assert _rng_seed is not None
        return _rng_seed, _rng_offset


def set_rng_state(seed: int, offset: int) -> None:
    """Make the next random draw use ``(seed, offset)`` again (``fork_rng`` and checkpointing restore states)."""
    global _rng_seed, _rng_offset, _rng_seen_initial
    with _rng_lock:
        _rng_seed, _rng_offset, _rng_seen_initial = int(seed) & _MASK64, int(offset) & _MASK64, torch.initial_seed()


def next_rng_key() -> tuple[int, int]:
    """The key ``(seed, offset)`` of the next random draw, and advance the offset."""
    global _rng_offset
    with _rng_lock:
        _sync_seed_locked()
        assert _rng_seed is not None
        key = (_rng_seed, _rng_offset)
        _rng_offset = (_rng_offset + 1) & _MASK64
        return key


def next_rng_keys(count: int) -> list[tuple[int, int]]:
    """The keys of the next ``count`` random draws (one per random op), advancing the offset past them."""
    global _rng_offset
    with _rng_lock:
        _sync_seed_locked()
        assert _rng_seed is not None
        first = _rng_offset
        _rng_offset = (_rng_offset + count) & _MASK64
        return [(_rng_seed, (first + i) & _MASK64) for i in range(count)]


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer, a bijection of uint64 that scatters nearby inputs (wrapping arithmetic)."""
    z = z + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def rng_key_rows(keys: list[tuple[int, int]]) -> np.ndarray:
    """The generator states a program's random ops start from: ``uint64[len(keys), 2]``, row ``i`` for key ``i``.

    A row is ``(hash(seed, offset), 0)``: ``rng_bit_generator`` reads element 0 as its key and
    counts from element 1, so keys ``(seed, offset)`` and ``(seed, offset + 1)`` used as states
    directly would give the same numbers shifted by a few elements (2 with THREE_FRY, 4 with
    PHILOX); hashed, every op gets its own stream.
    """
    pairs = np.array(keys, dtype=np.uint64).reshape(-1, 2)
    rows = np.zeros_like(pairs)
    with np.errstate(over="ignore"):
        rows[:, 0] = _splitmix64(pairs[:, 0] ^ _splitmix64(pairs[:, 1]))
    return rows


def _encode_rng_state(seed: int, offset: int) -> torch.Tensor:
    """The state as torch hands RNG states around: a CPU uint8 tensor (16 bytes: seed, offset)."""
    return torch.tensor([seed, offset], dtype=torch.uint64).view(torch.uint8)


def _decode_rng_state(state: Any) -> tuple[int, int]:
    if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
        raise ValueError("a pjrt RNG state is the 16-byte uint8 tensor torch.pjrt.get_rng_state() returns, got "
                         f"{state!r:.80}")
    seed, offset = state.detach().cpu().contiguous().view(torch.uint64).tolist()
    return int(seed), int(offset)


_MISSING = object()
_lazy_cache: Any = _MISSING


def _lazy_module(*, load: bool = True) -> Any:
    """``pjrt_plugins.spmd._lazy`` if it exists (the execution engine), else ``None`` (looked up once).

    ``load=False``: only if it is imported already (importing it loads jaxlib's MLIR).
    """
    global _lazy_cache
    if _lazy_cache is _MISSING:
        name = f"{__package__}._lazy"
        if not load:
            return sys.modules.get(name)
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            module = None
        _lazy_cache = module
    return _lazy_cache
