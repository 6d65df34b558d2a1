"""A pjrt tensor as a checkpoint sees it: its tiles, the distinct pieces its devices hold.

Reads each tile from one device that holds it (never the whole sharded tensor on the host),
snapshots tiles on the host for asynchronous saves, and installs loaded tiles on the devices
again. Knows nothing of torch.distributed.checkpoint's plans (``_planners`` does).
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ...errors import CheckpointError
from ..devices import virtual_device
from ..frontend import XLAShardedTensor, unwrap
from ..frontend.tensor import materialize
from ..sharding import ShardingType
from ..transport import TensorData, TensorState, check_current, download_shard, gather, upload_shards

logger = logging.getLogger(__name__)

__all__ = ["HostTiles", "Tile", "TiledTensor", "is_pjrt", "prepare", "snapshot", "snapshot_state_dict"]

_TILED = (ShardingType.TILED, ShardingType.PARTIAL)


@dataclass(frozen=True)
class Tile:
    """One distinct piece of a tensor: where it sits in the global tensor and one device holding it.

    ``device`` is ``None`` for the whole tensor read on the host (replicated or not yet uploaded);
    ``padded_shape`` is what the device stores (the tail tiles of an uneven split are zero-padded).
    """

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    device: int | None
    padded_shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def region(self) -> tuple[slice, ...]:
        """The tile's place inside its padded storage: the data without the padding."""
        return tuple(slice(0, n) for n in self.sizes)


def is_pjrt(value: Any) -> bool:
    return isinstance(value, XLAShardedTensor)


def prepare(tensors: list[torch.Tensor]) -> None:
    """Run the pending work the values of ``tensors`` wait for (one program), so their tiles can be read."""
    datas = [unwrap(t) for t in tensors]
    materialize(datas)
    vd = virtual_device()
    for data in datas:
        check_current(data, vd)


class TiledTensor:
    """The tiles of one (materialized) pjrt tensor: how it is read for a save and written by a load.

    ``layout`` is the sharding its device buffers follow; a tensor that is not split over the devices
    (replicated, unmarked, or held on the host, as after ``copy_`` from a CPU tensor, whatever its
    declared sharding) is one whole tile, read or written on the host.
    """

    def __init__(self, tensor: torch.Tensor, *, for_load: bool = False) -> None:
        self.tensor = tensor
        self.data: TensorData = unwrap(tensor)
        data = self.data
        self.shape = data.shape
        self.dtype = data.dtype
        layout = data.sharding if data.state is TensorState.DEVICE else None
        split = layout is not None and layout.type in _TILED and data.numel > 0
        if split and for_load and (data.view_of is not None or data.live_views()):
            # Views see a write into their base only through the engine: load through copy_ (whole).
            split = False
        self.layout = layout if split else None
        self.tiles = self._tiles()

    @property
    def sharded(self) -> bool:
        return self.layout is not None

    def _tiles(self) -> list[Tile]:
        if self.layout is None:
            zeros = (0,) * len(self.shape)
            return [Tile(zeros, self.shape, None, self.shape)]
        seen: set[tuple[int, ...]] = set()
        tiles = []
        for shard in self.layout.shards(self.shape, virtual_device().device_ids):
            if shard.numel == 0 or shard.indices is ...:
                continue
            offsets = tuple(s.start for s in shard.indices)
            if offsets in seen:  # a replica of a tile already listed
                continue
            seen.add(offsets)
            tiles.append(Tile(offsets, shard.shape, shard.device, shard.padded_shape))
        return tiles

    # -- saving --------------------------------------------------------------------------

    def read(self, tile: Tile) -> torch.Tensor:
        """The tile's values as a new compact CPU tensor (one download from the device holding it)."""
        data = self.data
        if tile.device is None:
            materialize([data])
            return gather(data)
        if data.state is not TensorState.DEVICE or data.sharding != self.layout:
            raise CheckpointError(
                f"a tensor of shape {self.shape} changed while it was being saved (its sharding is now "
                f"{data.sharding if data.state is TensorState.DEVICE else 'pending'}); do not run training steps "
                "during a synchronous save, or use CheckpointManager.save_async, which snapshots first")
        padded = download_shard(data, tile.device)
        if tile.sizes == tile.padded_shape:
            return padded
        return padded[tile.region].clone()  # the zero padding is never data

    # -- loading -------------------------------------------------------------------------

    def staging(self) -> dict[tuple[int, ...], torch.Tensor]:
        """A host tensor per tile for a load to fill, keyed by offsets (zeros: the padding stays zero)."""
        return {tile.offsets: torch.zeros(tile.padded_shape, dtype=self.dtype) for tile in self.tiles}

    def install(self, staged: dict[tuple[int, ...], torch.Tensor]) -> None:
        """Make the staged tiles the tensor's value, in place: each device receives its own tile only."""
        if self.layout is None:
            (whole,) = staged.values()
            with torch.no_grad():
                self.tensor.copy_(whole)
            return
        vd = virtual_device()
        pieces = []
        for shard in self.layout.shards(self.shape, vd.device_ids):
            if shard.numel == 0:
                pieces.append(torch.zeros(shard.padded_shape, dtype=self.dtype))
            else:
                pieces.append(staged[tuple(s.start for s in shard.indices)])  # type: ignore[union-attr]
        data = self.data
        materialize([data])  # pending work that reads the old value runs first
        buffers = upload_shards(pieces, self.shape, self.dtype, self.layout, vd)
        data.set_device(buffers, self.layout, vd.generation)
        logger.debug("loaded %d tile(s) into %r", len(staged), data)


@dataclass
class HostTiles:
    """A snapshot of a pjrt tensor's tiles on the host, taken for an asynchronous save.

    Later training steps cannot change it; the save planner writes it like the tensor it was.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    tiles: list[tuple[Tile, torch.Tensor]]

    @property
    def sharded(self) -> bool:
        return not (len(self.tiles) == 1 and self.tiles[0][0].device is None)

    def values(self, offsets: tuple[int, ...]) -> torch.Tensor:
        """The snapshot of the tile at ``offsets``."""
        for tile, values in self.tiles:
            if tile.offsets == offsets:
                return values
        raise CheckpointError(f"the snapshot of a tensor of shape {self.shape} has no tile at {offsets}")


def snapshot(tensor: torch.Tensor) -> HostTiles:
    """Read every tile of a prepared pjrt tensor to the host now (one copy of each tile)."""
    tiled = TiledTensor(tensor)
    return HostTiles(tiled.shape, tiled.dtype, [(tile, tiled.read(tile)) for tile in tiled.tiles])


def snapshot_state_dict(state_dict: Any) -> Any:
    """A copy of ``state_dict`` that later training steps cannot change: pjrt tensors become host snapshots
    of their tiles, CPU tensors and other values are copied. Pending values are computed first (one program)."""
    leaves, spec = tree_flatten(state_dict)
    prepare([v for v in leaves if is_pjrt(v)])

    def take(value: Any) -> Any:
        if is_pjrt(value):
            return snapshot(value)
        if isinstance(value, torch.Tensor):
            return value.detach().clone()
        return copy.deepcopy(value)

    return tree_unflatten([take(v) for v in leaves], spec)
