"""PyTorch/XLA's ``torch_xla.core.xla_model`` (``xm``) for SPMD code: the device, steps, RNG, saving, collectives.

Port: ``import torch_xla.core.xla_model as xm`` becomes ``import pjrt_plugins.spmd.xla_model as xm``
(and ``'xla'`` becomes ``'pjrt'``). One process drives every device through ``pjrt:0``: the
partitioner inserts the collectives a sharded program needs. The collectives here (``all_reduce``,
``all_gather``, ``reduce_scatter``, ``all_to_all``, ``collective_permute``) are those of manual-sharding
regions (``xs.enable_manual_sharding``), where each device runs on its own shard; the replica-level
helpers of multi-process data parallelism (``reduce_gradients``, ...) have nothing to do here.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

import torch
from torch.utils import _pytree as pytree

from ..runtime import MemoryInfo
from . import devices as _devices
from . import runtime as _xr
from .collectives import (
    REDUCE_AND,
    REDUCE_MAX,
    REDUCE_MIN,
    REDUCE_MUL,
    REDUCE_OR,
    REDUCE_SUM,
    all_gather,
    all_reduce,
    all_to_all,
    collective_permute,
    reduce_scatter,
)
from .frontend import TORCH_DEVICE, InputSharding, check_torch_device, engine, loaded_engine, optimization_barrier_
from .frontend import send_cpu_data_to_device as _send
from .frontend.tensor import XLAShardedTensor, materialize, to_cpu, unwrap

__all__ = [
    "REDUCE_AND",
    "REDUCE_MAX",
    "REDUCE_MIN",
    "REDUCE_MUL",
    "REDUCE_OR",
    "REDUCE_SUM",
    "add_step_closure",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "collective_permute",
    "fork_rng",
    "get_local_ordinal",
    "get_memory_info",
    "get_ordinal",
    "get_rng_state",
    "get_stablehlo",
    "get_stablehlo_bytecode",
    "get_xla_supported_devices",
    "is_master_ordinal",
    "is_xla_tensor",
    "mark_step",
    "master_print",
    "optimization_barrier_",
    "optimizer_step",
    "reduce_scatter",
    "rendezvous",
    "save",
    "send_cpu_data_to_device",
    "set_rng_state",
    "unlazy",
    "wait_device_ops",
    "xla_device",
    "xla_device_hw",
    "xla_device_kind",
    "xla_real_devices",
    "xla_replication_devices",
    "xrt_world_size",
]

_OFFSET_BITS = 64


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """The virtual device ``pjrt:0`` (``n`` may be ``None`` or 0: it is the only device)."""
    del devkind
    if n not in (None, 0):
        check_torch_device(torch.device("pjrt", n))
    return TORCH_DEVICE


def get_xla_supported_devices(max_devices: int | None = None) -> list[str]:
    """``["pjrt:0"]``: in SPMD mode one device stands for all (PyTorch/XLA lists ``["xla:0"]`` there too)."""
    return [str(TORCH_DEVICE)][: max_devices if max_devices else None]


def is_xla_tensor(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is on the virtual device."""
    return tensor.device.type == TORCH_DEVICE.type


def get_ordinal() -> int:
    """This process's global ordinal (0)."""
    return _xr.global_ordinal()


def get_local_ordinal() -> int:
    """This process's ordinal on its host (0)."""
    return _xr.local_ordinal()


def xrt_world_size() -> int:
    """The number of processes in the SPMD program (1)."""
    return _xr.world_size()


def is_master_ordinal(local: bool = True) -> bool:
    """Whether this process is the master (always, with one process)."""
    return (get_local_ordinal() if local else get_ordinal()) == 0


def master_print(*args: Any, fd: TextIO | None = None, local: bool = False, flush: bool = False) -> None:
    """``print`` on the master process only (to ``fd``, default the current ``sys.stdout``)."""
    if is_master_ordinal(local=local):
        print(*args, file=fd if fd is not None else sys.stdout, flush=flush)


def xla_device_hw(device: str | torch.device) -> str:
    """The hardware behind ``device`` (``pjrt:0``): the plugin's platform in upper case, e.g. ``"CPU"``."""
    check_torch_device(device)
    return str(_devices.virtual_device().client.platform_name).upper()


def xla_device_kind(device: str | torch.device | None = None) -> str:
    """The plugin's device kind string (e.g. ``"cpu"``, ``"NVIDIA H100 80GB HBM3"``)."""
    check_torch_device(device)
    return str(_devices.virtual_device().devices[0].kind)


def _real_device(ordinal: int) -> str:
    """PyTorch/XLA's name of a real device: the platform in upper case and the device ordinal (``"CPU:3"``)."""
    vd = _devices.virtual_device()
    return f"{str(vd.client.platform_name).upper()}:{ordinal}"


def xla_real_devices(devices: Sequence[str | torch.device] | None = None) -> list[str]:
    """The real device behind each of ``devices`` (default: ``get_xla_supported_devices()``, i.e. ``pjrt:0``).

    As in PyTorch/XLA, with SPMD on the virtual device is ``"SPMD:0"`` (it stands for every device:
    :func:`xla_replication_devices` lists them); with SPMD off it is the one device it runs on,
    e.g. ``"CPU:0"``.
    """
    devices = list(devices) if devices else get_xla_supported_devices()
    for device in devices:
        check_torch_device(device)
    real = "SPMD:0" if _devices.virtual_device().spmd else _real_device(0)
    return [real for _ in devices]


def xla_replication_devices(local_devices: Sequence[str | torch.device] | None = None) -> list[str]:
    """The real devices a program on ``local_devices`` (default and only choice: ``[pjrt:0]``) runs on, by ordinal:
    every device of the virtual device with SPMD on (``["CPU:0", ..., "CPU:7"]``), the one device with it off.

    Raises ``RuntimeError`` when ``local_devices`` does not list the supported devices, as PyTorch/XLA does.
    """
    supported = get_xla_supported_devices()
    if local_devices is not None:
        for device in local_devices:
            check_torch_device(device)
        if len(local_devices) != len(supported):
            raise RuntimeError(f"Cannot replicate if number of devices ({len(local_devices)}) is different from "
                               f"{len(supported)} (the supported devices: {supported})")
    vd = _devices.virtual_device()
    return [_real_device(i) for i in (vd.device_ids if vd.spmd else (0,))]


def add_step_closure(closure: Callable[..., Any], args: tuple[Any, ...] = (), run_async: bool = False) -> None:
    """Run ``closure(*args)`` after the next step (``xs.sync()`` / :func:`mark_step`), when the tensors it reads
    hold device data: inspecting them then runs no extra program.

    Closures run in the order they were added, on the thread that calls ``sync``; with ``run_async``
    on one background thread instead (in order), and an exception one raises is raised, as a
    ``RuntimeError``, by a later ``sync``. ``XLA_MAX_ASYNC_QUEUE`` bounds the background queue (100).

    Example::

        xm.add_step_closure(lambda loss, step: print(step, loss.item()), args=(loss, step))
        xm.mark_step()   # runs the step, then prints
    """
    engine().add_step_closure(closure, args, run_async)


def get_stablehlo(tensors: Sequence[torch.Tensor] | None = None) -> str:
    """The pending graph computing ``tensors`` as StableHLO text, lowered without running it.

    With ``tensors`` ``None`` or empty, the graph of every live pending tensor (what the next
    ``sync`` runs). The module carries the shardings: ``mhlo.sharding`` on each argument and the
    ``@Sharding`` custom calls of ``mark_sharding`` on pending values. Given only tensors that hold
    data already, the module returns its arguments (those tensors, with their shardings).

    Example::

        y = model(x)
        print(xm.get_stablehlo([y]))    # nothing runs; y stays pending
    """
    return str(_lowered(tensors).text)


def get_stablehlo_bytecode(tensors: Sequence[torch.Tensor] | None = None) -> bytes:
    """:func:`get_stablehlo` as a StableHLO portable artifact (versioned MLIR bytecode, what the plugin compiles)."""
    return bytes(_lowered(tensors).artifact)


def _lowered(tensors: Sequence[torch.Tensor] | None) -> Any:
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    datas = [unwrap(t) for t in tensors] if tensors else None
    return engine().lower_pending(datas)


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """Run the pending step (``xs.sync()``)."""
    engine().sync()


def wait_device_ops(devices: Sequence[str] = ()) -> None:
    """Wait for the devices to finish: programs run to completion as they are launched, so this returns at once."""


def unlazy(tensors: Sequence[torch.Tensor]) -> None:
    """Compute ``tensors`` now (the pending work they depend on runs)."""
    materialize([unwrap(t) for t in tensors])


def optimizer_step(optimizer: torch.optim.Optimizer, barrier: bool = False, optimizer_args: dict | None = None,
                   groups: Any = None, pin_layout: bool = True) -> Any:
    """``optimizer.step(**optimizer_args)``, then ``mark_step()`` if ``barrier``; returns the step's result.

    The gradients need no all-reduce: they are already the global ones (the partitioner reduces them).
    """
    result = optimizer.step(**(optimizer_args or {}))
    if barrier:
        mark_step()
    return result


def send_cpu_data_to_device(datas: Any, device: Any, input_sharding: InputSharding = None) -> Any:
    """Move the CPU tensors of ``datas`` onto ``pjrt``, each device receiving its shard only (see
    :class:`pjrt_plugins.spmd.ShardingSpec`); a single tensor comes back as a one-item list."""
    return _send(datas, device, input_sharding)


def save(data: Any, file_or_path: Any, master_only: bool = True, global_master: bool = False) -> None:
    """``torch.save`` of ``data`` with its pjrt tensors gathered to CPU tensors (by the master process)."""
    if loaded_engine() is not None:
        engine().sync()
    cpu_data = pytree.tree_map(lambda v: to_cpu(v) if isinstance(v, XLAShardedTensor) else v, data)
    if not master_only or is_master_ordinal(local=not global_master):
        torch.save(cpu_data, file_or_path)


def rendezvous(tag: str, payload: bytes = b"", replicas: Sequence[int] = ()) -> list[bytes]:
    """Meet the other processes: with one process, returns ``[payload]`` at once."""
    return [payload]


def set_rng_state(seed: int, device: str | None = None) -> None:
    """Restart the device's random stream from ``seed`` (or from a value :func:`get_rng_state` returned)."""
    check_torch_device(device)
    seed = int(seed)
    _devices.set_rng_state(seed & ((1 << _OFFSET_BITS) - 1), seed >> _OFFSET_BITS)


def get_rng_state(device: str | None = None) -> int:
    """The device's random state as an int: the seed, plus the stream's position above bit 64.

    Right after ``set_rng_state(s)`` (or ``torch.manual_seed(s)``) it is ``s``; giving a value
    back to :func:`set_rng_state` makes the next random ops draw the same numbers again.
    """
    check_torch_device(device)
    seed, offset = _devices.rng_state()
    return int(seed) | (int(offset) << _OFFSET_BITS)


@contextlib.contextmanager
def fork_rng(device: str | None = None, enabled: bool = True) -> Iterator[None]:
    """Restore the device's random state when the block ends."""
    if not enabled:
        yield
        return
    state = get_rng_state(device)
    try:
        yield
    finally:
        set_rng_state(state, device)


def get_memory_info(device: int | str | torch.device | None = None) -> MemoryInfo:
    """PyTorch/XLA's ``xm.get_memory_info``: ``{"bytes_used", "peak_bytes_used", "bytes_limit"}`` of one device.

    ``pjrt:0`` stands for every device of the mesh, so ``device`` is a device ordinal (an int, as in a
    :class:`Mesh`), or ``None`` / ``"pjrt:0"`` for ordinal 0. Raises
    :class:`~pjrt_plugins.errors.UnsupportedFunctionError` where the plugin reports no memory statistics
    (the CPU plugins here do not).

    Example::

        xm.get_memory_info(3)["bytes_used"]   # on a GPU plugin: bytes in use on device ordinal 3
    """
    vd = _devices.virtual_device()
    if isinstance(device, bool) or not isinstance(device, (int, type(None))):
        check_torch_device(device)
        device = None
    ordinal = 0 if device is None else int(device)
    if not 0 <= ordinal < vd.num_devices:
        raise ValueError(f"device ordinal {ordinal} is out of range: the virtual device has {vd.num_devices} "
                         f"devices (0..{vd.num_devices - 1})")
    return vd.devices[ordinal].get_memory_info()  # type: ignore[no-any-return]

