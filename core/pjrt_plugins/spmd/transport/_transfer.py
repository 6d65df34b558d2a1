"""Host <-> device transfers for the virtual device: sharded upload and gather, each counted per device.

The only module that moves tensor bytes between the host and the devices. It never records or runs
computations (the trace and execution layers do).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from typing import Any

import torch

from ...errors import ShardingError, VirtualDeviceError
from ..devices import VirtualDevice, count_download, count_upload, virtual_device
from ..sharding import OpSharding, Shard, ShardingType
from ._tensor_data import TensorData, TensorState, host_empty

logger = logging.getLogger(__name__)

__all__ = [
    "check_current",
    "download_buffer",
    "download_shard",
    "gather",
    "gather_shards",
    "reshard_buffers",
    "upload",
    "upload_host_tensor",
    "upload_shards",
]

#: Gathers moving more than this use two threads.
_PARALLEL_GATHER_BYTES = 8 << 20


# -- upload ------------------------------------------------------------------------------


def _shard_source(host: torch.Tensor, shard: Shard) -> tuple[torch.Tensor, bool]:
    """``(CPU tensor device shard.device receives, private)``: zero-padded where the shard is short.

    ``private`` means the tensor is a new staging copy nobody else references.
    """
    if shard.indices is ...:
        return host, False
    piece = host[shard.indices]
    if shard.is_padded:
        padded = host_empty(shard.padded_shape, host.dtype)
        padded.zero_()
        padded[tuple(slice(0, n) for n in shard.shape)] = piece
        return padded, True
    if not piece.is_contiguous():
        # Stage it ourselves (aligned, huge pages) so the plugin can take it without a second copy.
        staged = host_empty(shard.shape, host.dtype)
        staged.copy_(piece)
        return staged, True
    return piece, False


def upload_host_tensor(
    host: torch.Tensor, sharding: OpSharding | None, vd: VirtualDevice | None = None, *, owned: bool = False
) -> list[Any]:
    """Upload ``host`` (a CPU tensor) laid out by ``sharding`` (``None``: replicated).

    Each device receives only its shard; returns the buffers indexed by device
    ordinal (``None`` for devices that hold nothing). Under ``{manual}`` ``host``
    is one device's value and every device receives a copy of it (a value of
    its own from then on). ``owned=True`` promises
    that nobody will ever write ``host`` again: then a shard that exactly one
    device holds may be handed over without a copy where the plugin allows
    (the CPU plugin aliases it), so a tiled upload costs no host copy at all.
    Shards held by several devices are always copied, so no two buffers share
    memory.
    """
    vd = vd or virtual_device()
    spec = sharding if sharding is not None else OpSharding.replicated()
    if spec.type is ShardingType.UNKNOWN:
        raise NotImplementedError("uploading a tensor with an unknown sharding is not supported")
    if not vd.spmd and spec.type is not ShardingType.REPLICATED:
        raise VirtualDeviceError(f"sharding {spec} needs SPMD mode; the virtual device has one device")
    spec.check_rank(tuple(host.shape))
    spec.check_devices(vd.device_ids)
    if host.device.type != "cpu":
        raise VirtualDeviceError(f"upload expects a CPU tensor, got one on {host.device}")
    host = host.detach()
    shards = spec.shards(tuple(host.shape), vd.device_ids)
    single_holder = len(shards) == 1 or spec.holders_per_tile == 1
    buffers: list[Any] = [None] * vd.num_devices
    for shard in shards:
        source, private = _shard_source(host, shard)
        zero_copy = private or (owned and single_holder)
        buffers[shard.device] = vd.client.buffer_from_host(
            source, device=vd.devices[shard.device], copy=False if zero_copy else None
        )
        count_upload(shard.device, source.numel() * source.element_size())
    return buffers


def upload_shards(
    pieces: Sequence[torch.Tensor], shape: Sequence[int], dtype: torch.dtype, sharding: OpSharding,
    vd: VirtualDevice | None = None,
) -> list[Any]:
    """Upload one given (padded) shard per device ordinal, laid out by a tiled or manual ``sharding``; returns the
    buffers.

    ``pieces[i]`` is what device ``i`` holds: a CPU tensor of the padded shard shape
    (``sharding.shard_shape(shape)``; under ``{manual}``, ``shape`` itself: each device's own
    value), converted to ``dtype`` if needed. Each device receives its piece only. Raises
    :class:`ShardingError` for a wrong count or shape of pieces.
    """
    vd = vd or virtual_device()
    if sharding.type not in (ShardingType.TILED, ShardingType.PARTIAL, ShardingType.MANUAL):
        raise ShardingError(f"per-device shards need a tiled or manual sharding, not {sharding}")
    sharding.check_rank(tuple(shape))
    sharding.check_devices(vd.device_ids)
    if len(pieces) != vd.num_devices:
        raise ShardingError(
            f"got {len(pieces)} shards for {vd.num_devices} devices; give one shard per device, in device order"
        )
    padded = sharding.shard_shape(shape)
    for ordinal, piece in enumerate(pieces):
        if not isinstance(piece, torch.Tensor) or piece.device.type != "cpu":
            raise VirtualDeviceError(f"shard {ordinal} must be a CPU tensor, got {type(piece).__name__}"
                                     f"{' on ' + str(piece.device) if isinstance(piece, torch.Tensor) else ''}")
        if tuple(piece.shape) != padded:
            raise ShardingError(
                f"shard {ordinal} has shape {tuple(piece.shape)} but sharding {sharding} of a {tuple(shape)} tensor "
                f"gives every device a padded shard of shape {padded} (padding included)"
            )
    buffers: list[Any] = [None] * vd.num_devices
    for ordinal, piece in enumerate(pieces):
        source = piece.detach().to(dtype)
        if not source.is_contiguous():
            source = source.contiguous()
        buffers[ordinal] = vd.client.buffer_from_host(source, device=vd.devices[ordinal])
        count_upload(ordinal, source.numel() * source.element_size())
    return buffers


def upload(data: TensorData, sharding: OpSharding | None = None) -> TensorData:
    """Move a HOST-state ``data`` onto the devices, laid out by ``sharding`` (``None``: replicated).

    This is how an unmarked tensor used in a computation gets there: the
    execution engine calls ``upload(data, data.annotation)``. ``data`` becomes
    DEVICE state; returns it. A DEVICE-state ``data`` already laid out that
    way is left alone; one laid out differently is gathered and re-uploaded.
    """
    vd = virtual_device()
    spec = sharding if sharding is not None else OpSharding.replicated()
    if data.state is TensorState.DEVICE:
        check_current(data, vd)
        if data.sharding == spec:
            return data
        host = gather(data)
    elif data.state is TensorState.HOST:
        assert data.host is not None
        host = data.host
    else:
        raise VirtualDeviceError(
            f"{data!r} is a pending graph value; the execution engine must materialize it before an upload"
        )
    assert host is not None
    # TensorData owns its host tensor and never writes it once uploaded (state changes replace it).
    buffers = upload_host_tensor(host, spec, vd, owned=True)
    data.set_device(buffers, spec, vd.generation)
    logger.debug("uploaded %r", data)
    return data


def check_current(data: TensorData, vd: VirtualDevice | None = None) -> None:
    """Raise if ``data``'s buffers belong to a virtual device that was replaced."""
    vd = vd or virtual_device()
    if data.state is TensorState.DEVICE and data.generation != vd.generation:
        raise VirtualDeviceError(
            "this tensor's data lives on a virtual device that was replaced (set_plugin or use_spmd changed it); "
            "move it to pjrt again from a CPU copy"
        )


# -- download ----------------------------------------------------------------------------


def download_buffer(buffer: Any, ordinal: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """One device buffer as a CPU tensor (counted); written into ``out`` if given (a region of the
    buffer's shape: contiguous, or strided for buffers the host reads in place, see ``Buffer.to_numpy``)."""
    result = buffer.to_torch(out=out)
    count_download(ordinal, result.numel() * result.element_size())
    return result


def download_shard(data: TensorData, ordinal: int) -> torch.Tensor:
    """The padded shard device ``ordinal`` holds, as a CPU tensor."""
    if data.state is not TensorState.DEVICE:
        raise VirtualDeviceError(f"{data!r} is not on the devices")
    check_current(data)
    assert data.buffers is not None
    buffer = data.buffers[ordinal]
    if buffer is None:
        raise ShardingError(f"device {ordinal} holds nothing of {data!r}")
    return download_buffer(buffer, ordinal)


def gather_shards(
    shape: Sequence[int], dtype: torch.dtype, sharding: OpSharding, buffers: Sequence[Any], device_ids: Sequence[int]
) -> torch.Tensor:
    """Assemble the global CPU tensor from per-device ``buffers``, reading one copy of each tile.

    Each tile is copied once, straight into its place in the output: a contiguous place
    (a split along the first dimension) by the plugin's transfer, a strided one (a split
    along a later dimension) from the buffer's own memory where the host can read it in
    place (the CPU plugin, see ``Buffer.host_view``). Padded tiles, and strided places on
    plugins whose buffers live in device memory, go through a staging tensor.
    """
    shape = tuple(shape)
    if sharding.is_manual:
        raise ShardingError(
            f"a tensor with sharding {sharding} holds a value of its own on each device (or group of devices) and "
            "has no single global value to gather: read each device's value with local_shards, or leave the "
            "manual region with disable_manual_sharding first"
        )
    shards = sharding.shards(shape, device_ids)
    if sharding.type in (ShardingType.REPLICATED, ShardingType.MAXIMAL):
        first = shards[0]
        return download_buffer(buffers[first.device], first.device).reshape(shape).to(dtype)
    out = host_empty(shape, dtype)
    in_place: list[tuple[Shard, torch.Tensor]] = []
    staged: list[tuple[Shard, torch.Tensor]] = []
    for shard in shards:
        if shard.replica_id != 0 or shard.numel == 0:
            continue
        region = out[shard.indices]
        if not shard.is_padded and (region.is_contiguous() or buffers[shard.device].host_readable()):
            in_place.append((shard, region))
        else:
            staged.append((shard, region))

    def straight(item: tuple[Shard, torch.Tensor]) -> None:
        shard, region = item
        download_buffer(buffers[shard.device], shard.device, out=region)

    _each(straight, in_place, dtype)
    if staged:
        _gather_staged(staged, buffers, dtype)
    return out


def _each(fn: Any, items: list[tuple[Shard, torch.Tensor]], dtype: torch.dtype) -> None:
    """``fn(item)`` for every item; on two threads when there is much to copy (the copies drop the GIL)."""
    total = sum(shard.padded_numel for shard, _ in items) * dtype.itemsize
    if total < _PARALLEL_GATHER_BYTES or len(items) < 2:
        for item in items:
            fn(item)
        return
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="pjrt-gather") as pool:
        for future in [pool.submit(fn, item) for item in items]:
            future.result()


def _gather_staged(staged: list[tuple[Shard, torch.Tensor]], buffers: Sequence[Any], dtype: torch.dtype) -> None:
    """Download shards whose place in the output is padded, or strided on a plugin the host cannot read
    in place, through a staging tensor per thread (reused), so one shard's copy overlaps the next download."""
    local = threading.local()

    def one(item: tuple[Shard, torch.Tensor]) -> None:
        shard, region = item
        scratch = getattr(local, "scratch", None)
        if scratch is None or tuple(scratch.shape) != shard.padded_shape:
            scratch = local.scratch = host_empty(shard.padded_shape, dtype)
        download_buffer(buffers[shard.device], shard.device, out=scratch)
        region.copy_(scratch[tuple(slice(0, n) for n in shard.shape)])

    _each(one, staged, dtype)


def gather(data: TensorData) -> torch.Tensor:
    """The global value of a HOST- or DEVICE-state ``data`` as a new CPU tensor."""
    if data.state is TensorState.HOST:
        assert data.host is not None
        copy = host_empty(data.shape, data.dtype)
        copy.copy_(data.host)
        return copy
    if data.state is not TensorState.DEVICE:
        raise VirtualDeviceError(f"{data!r} is a pending graph value; materialize it before gathering")
    vd = virtual_device()
    check_current(data, vd)
    assert data.buffers is not None and data.sharding is not None
    return gather_shards(data.shape, data.dtype, data.sharding, data.buffers, vd.device_ids)


def reshard_buffers(buffers: Sequence[Any], shape: Sequence[int], dtype: torch.dtype, have: OpSharding,
                    want: OpSharding, vd: VirtualDevice) -> list[Any]:
    """The tensor held by ``buffers`` (laid out by ``have``) laid out by ``want`` instead: gathered, uploaded again.

    For the rare program XLA compiles for other argument shardings than the ones its module
    declared (the identity of an unevenly tiled tensor is compiled for a replicated one).
    """
    host = gather_shards(tuple(shape), dtype, have, list(buffers), vd.device_ids)
    return upload_host_tensor(host, want, vd, owned=True)
