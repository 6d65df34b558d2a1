"""SPMDSavePlanner and SPMDLoadPlanner: torch.distributed.checkpoint planners for state dicts of pjrt tensors.

A save writes each distinct tile of a sharded tensor once, read from one device holding it; a load
reads, for each tile its target holds, the overlapping pieces of the saved tiles (any other mesh or
sharding) and uploads each device's own tile. Plain tensors and other objects take torch's default path.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import math
from collections.abc import Mapping
from typing import Any, cast

import torch
from torch.distributed.checkpoint._traverse import traverse_state_dict
from torch.distributed.checkpoint.default_planner import (
    create_default_global_load_plan,
    create_default_global_save_plan,
    create_default_local_load_plan,
    create_default_local_save_plan,
)
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.checkpoint.utils import find_state_dict_object

from ...errors import CheckpointError, CheckpointMismatchError
from ._tiles import HostTiles, Tile, TiledTensor, is_pjrt, prepare

logger = logging.getLogger(__name__)

__all__ = ["SPMDLoadPlanner", "SPMDSavePlanner", "flatten_state_dict"]

#: A value's path in a nested state dict: mapping keys (as strings) and list positions.
ObjPath = tuple[Any, ...]


def flatten_state_dict(state_dict: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, ObjPath]]:
    """``{"a.b": value}`` for ``{"a": {"b": value}}``, and each key's path: torch's own flattening rules
    (so a checkpoint written here loads with torch's ``DefaultLoadPlanner`` too), with host snapshots
    counted as tensors."""
    flat: dict[str, Any] = {}
    paths: dict[str, ObjPath] = {}

    def visit(path: ObjPath, value: Any) -> None:
        fqn = ".".join(map(str, path))
        if fqn in flat:
            raise CheckpointError(f"two entries of the state dict flatten to the same key {fqn!r}; rename one")
        flat[fqn] = value
        paths[fqn] = path

    traverse_state_dict(state_dict, visit, keep_traversing=lambda v: isinstance(v, (torch.Tensor, HostTiles)))
    return flat, paths


def _size(values: tuple[int, ...]) -> torch.Size:
    return torch.Size(values)


def _write_item(fqn: str, tile: Tile, shape: tuple[int, ...], dtype: torch.dtype, kind: WriteItemType) -> WriteItem:
    offsets = _size(tile.offsets)
    return WriteItem(
        index=MetadataIndex(fqn, offsets),
        type=kind,
        tensor_data=TensorWriteData(
            chunk=ChunkStorageMetadata(offsets=offsets, sizes=_size(tile.sizes)),
            properties=TensorProperties(dtype=dtype),
            size=_size(shape),
        ),
    )


def _dedup(plans: list[SavePlan]) -> list[SavePlan]:
    """Each item once, in the first plan (rank) that has it: a tile every process holds is written once."""
    seen: set[MetadataIndex] = set()
    out = []
    for plan in plans:
        items = []
        for item in plan.items:
            if item.index not in seen:
                seen.add(item.index)
                items.append(item)
        out.append(dataclasses.replace(plan, items=items))
    return out


def _check_covered(metadata: Metadata) -> None:
    """Every saved tensor's chunks lie inside it and add up to it (no gaps, no piece twice)."""
    for fqn, md in metadata.state_dict_metadata.items():
        if not isinstance(md, TensorStorageMetadata):
            continue
        total = 0
        for chunk in md.chunks:
            if any(o < 0 or o + s > d for o, s, d in zip(chunk.offsets, chunk.sizes, md.size)):
                raise CheckpointError(f"{fqn}: a piece at {tuple(chunk.offsets)} of size {tuple(chunk.sizes)} "
                                      f"lies outside the tensor's shape {tuple(md.size)}")
            total += math.prod(chunk.sizes)
        if total != math.prod(md.size):
            raise CheckpointError(f"{fqn}: the saved pieces hold {total} elements, the tensor {math.prod(md.size)}; "
                                  "two processes saved different layouts of it")


class SPMDSavePlanner(SavePlanner):
    """Save a state dict of pjrt tensors with ``torch.distributed.checkpoint.save``, one write per distinct tile.

    PyTorch/XLA's planner (``torch_xla.experimental.distributed_checkpoint``): a sharded
    tensor is written as its distinct tiles, each read from one device that holds it (a
    replicated tile once, the zero padding of an uneven split never), so no host ever holds
    the whole tensor; a replicated or unmarked tensor is written whole, from one device.
    Pending values are computed first (one program). Everything else takes torch's default path.

    Example::

        import torch.distributed.checkpoint as dcp
        from pjrt_plugins.spmd.distributed_checkpoint import SPMDSavePlanner

        dcp.save({"model": model.state_dict()}, checkpoint_id="ckpt/step-10",
                 planner=SPMDSavePlanner(), no_dist=True)
    """

    def __init__(self) -> None:
        #: Whether this process writes the objects (the coordinator, rank 0).
        self.is_coordinator = False
        #: Each flattened key's path in the nested state dict.
        self.mappings: dict[str, ObjPath] = {}
        #: The sharded pjrt tensors (and host snapshots of them), by flattened key.
        self.sharded_state_dict: dict[str, Any] = {}
        #: Everything else: replicated or unmarked pjrt tensors, CPU tensors, objects.
        self.unsharded_state_dict: dict[str, Any] = {}
        self._tiled: dict[str, TiledTensor | HostTiles] = {}
        self._reads: dict[tuple[str, tuple[int, ...]], Tile] = {}

    def set_up_planner(
        self, state_dict: dict[str, Any], storage_meta: StorageMeta | None = None, is_coordinator: bool = False
    ) -> None:
        if isinstance(storage_meta, bool):  # PyTorch/XLA's older form: set_up_planner(state_dict, is_coordinator)
            is_coordinator, storage_meta = bool(storage_meta), None
        self.is_coordinator = is_coordinator
        flat, self.mappings = flatten_state_dict(state_dict)
        prepare([v for v in flat.values() if is_pjrt(v)])
        self.sharded_state_dict, self.unsharded_state_dict, self._tiled = {}, {}, {}
        for fqn, value in flat.items():
            if is_pjrt(value):
                self._tiled[fqn] = TiledTensor(value)
            elif isinstance(value, HostTiles):
                self._tiled[fqn] = value
            else:
                self.unsharded_state_dict[fqn] = value
                continue
            target = self.sharded_state_dict if self._tiled[fqn].sharded else self.unsharded_state_dict
            target[fqn] = value

    def create_local_plan(self) -> SavePlan:
        others = {k: v for k, v in self.unsharded_state_dict.items() if k not in self._tiled}
        plan = create_default_local_save_plan(others, self.is_coordinator)
        items = list(plan.items)
        for fqn, tiled in self._tiled.items():
            kind = WriteItemType.SHARD if tiled.sharded else WriteItemType.TENSOR
            for tile in _tiles(tiled):
                items.append(_write_item(fqn, tile, tiled.shape, tiled.dtype, kind))
                self._reads[(fqn, tile.offsets)] = tile
        return dataclasses.replace(plan, items=items, planner_data=self.mappings)

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        global_plan, metadata = create_default_global_save_plan(_dedup(all_plans))
        mappings: dict[str, ObjPath] = {}
        for plan in global_plan:
            mappings.update(plan.planner_data or {})
        metadata = dataclasses.replace(metadata, planner_data=mappings)
        _check_covered(metadata)
        return global_plan, metadata

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        return self.transform_object(write_item, self.lookup_object(write_item.index))

    def lookup_object(self, index: MetadataIndex) -> Any:
        """The value ``index`` names: for a tile of a pjrt tensor, its values read now (a compact CPU tensor)."""
        tiled = self._tiled.get(index.fqn)
        if tiled is None:
            return find_state_dict_object(self.unsharded_state_dict, index)
        offsets = tuple(index.offset) if index.offset is not None else (0,) * len(tiled.shape)
        tile = self._reads.get((index.fqn, offsets))
        if tile is None:
            raise CheckpointError(f"the save plan names a piece of {index.fqn!r} at {offsets}, which it does not have")
        if isinstance(tiled, HostTiles):
            return tiled.values(offsets)
        return tiled.read(tile)

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:
        if write_item.type == WriteItemType.BYTE_IO:
            stream = io.BytesIO()
            torch.save(object, stream)
            return stream
        return object


def _tiles(tiled: TiledTensor | HostTiles) -> list[Tile]:
    if isinstance(tiled, HostTiles):
        return [tile for tile, _ in tiled.tiles]
    return tiled.tiles


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        if length < tensor.size(dim):
            tensor = tensor.narrow(dim, offset, length)
    return tensor


def _set_element(root: Any, path: ObjPath, value: Any) -> None:
    """Put ``value`` at ``path`` of the nested ``root`` (flattening made mapping keys strings: match them back)."""
    container = root
    for position, key in enumerate(path):
        if isinstance(container, Mapping) and key not in container:
            key = next((k for k in container if str(k) == key), key)
        if position == len(path) - 1:
            container[key] = value
        else:
            container = container[key]


class SPMDLoadPlanner(LoadPlanner):
    """Load a checkpoint into a state dict of pjrt tensors with ``torch.distributed.checkpoint.load``, in place.

    PyTorch/XLA's planner. The state dict's tensors must already be on ``pjrt`` with the
    sharding wanted (``mark_sharding`` first); it may differ from the saved one (another mesh,
    another partition spec, an uneven split): for each distinct tile a tensor holds, the
    overlapping pieces of the saved tiles are read into a host buffer of that tile's size,
    and each device then receives its own tile. A replicated or unmarked tensor is loaded
    whole. A key the checkpoint lacks, another shape, or a tensor where the checkpoint holds
    an object raises :class:`~pjrt_plugins.errors.CheckpointMismatchError` naming it
    (``dcp.load`` reports it inside its ``CheckpointException``).

    Example::

        state_dict = {"model": model.state_dict()}      # on pjrt, already marked
        dcp.load(state_dict, checkpoint_id="ckpt/step-10", planner=SPMDLoadPlanner(), no_dist=True)
        model.load_state_dict(state_dict["model"])
    """

    def __init__(self) -> None:
        #: The checkpoint's metadata.
        self.metadata: Metadata | None = None
        self.is_coordinator = False
        #: The state dict given to ``set_up_planner``: loaded in place.
        self.original_state_dict: dict[str, Any] = {}
        self.mappings: dict[str, ObjPath] = {}
        #: The sharded pjrt tensors, by flattened key.
        self.sharded_state_dict: dict[str, torch.Tensor] = {}
        #: Everything else: replicated or unmarked pjrt tensors, CPU tensors, objects.
        self.unsharded_state_dict: dict[str, Any] = {}
        self._targets: dict[str, TiledTensor] = {}
        self._staged: dict[str, dict[tuple[int, ...], torch.Tensor]] = {}
        self._pending: dict[str, int] = {}

    def set_up_planner(
        self, state_dict: dict[str, Any], metadata: Metadata | None = None, is_coordinator: bool = False
    ) -> None:
        self.original_state_dict = state_dict
        self.metadata = metadata
        self.is_coordinator = is_coordinator
        flat, self.mappings = flatten_state_dict(state_dict)
        prepare([v for v in flat.values() if is_pjrt(v)])
        self.sharded_state_dict, self.unsharded_state_dict, self._targets = {}, {}, {}
        for fqn, value in flat.items():
            if is_pjrt(value):
                target = TiledTensor(value, for_load=True)
                self._targets[fqn] = target
                (self.sharded_state_dict if target.sharded else self.unsharded_state_dict)[fqn] = value
            else:
                self.unsharded_state_dict[fqn] = value

    def create_local_plan(self) -> LoadPlan:
        if self.metadata is None:
            raise CheckpointError("the load planner got no checkpoint metadata; call it through dcp.load")
        flat = {**self.unsharded_state_dict, **self.sharded_state_dict}
        _check_fits(flat, self.metadata)
        others = {k: v for k, v in self.unsharded_state_dict.items() if k not in self._targets}
        plan = create_default_local_load_plan(others, self.metadata)
        items = list(plan.items)
        for fqn, target in self._targets.items():
            md = cast(TensorStorageMetadata, self.metadata.state_dict_metadata[fqn])  # _check_fits made sure
            chunks = [ChunkStorageMetadata(_size(t.offsets), _size(t.sizes)) for t in target.tiles]
            reads = create_read_items_for_chunk_list(fqn, md, chunks)
            wanted = sum(t.numel for t in target.tiles)
            found = sum(math.prod(r.lengths) for r in reads)
            if found != wanted:
                raise CheckpointMismatchError(
                    f"{fqn}: the checkpoint's pieces cover {found} of its {wanted} elements; the checkpoint is "
                    "incomplete (a save that did not finish?)")
            self._pending[fqn] = wanted
            items.extend(reads)
        return dataclasses.replace(plan, items=items)

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return create_default_global_load_plan(global_plan)

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        # As torch's DefaultLoadPlanner: objects in a checkpoint are pickles; load checkpoints you trust.
        _set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn],
                     torch.load(value, weights_only=False))

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        return self.transform_tensor(read_item, self.lookup_tensor(read_item.dest_index))

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        """Where a read lands: the host buffer of a pjrt tensor's tile, or the CPU tensor itself."""
        target = self._targets.get(index.fqn)
        if target is None:
            return self.unsharded_state_dict[index.fqn]  # type: ignore[no-any-return]
        staged = self._staged.get(index.fqn)
        if staged is None:
            staged = self._staged[index.fqn] = target.staging()
        offsets = tuple(index.offset) if index.offset is not None else (0,) * len(target.shape)
        return staged[offsets]

    def transform_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> torch.Tensor:
        return _narrow(tensor, read_item.dest_offsets, read_item.lengths)

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        fqn = read_item.dest_index.fqn
        target = self._targets.get(fqn)
        if target is None:
            return
        self._pending[fqn] -= math.prod(read_item.lengths)
        if self._pending[fqn] < 0:
            raise CheckpointError(f"{fqn}: more elements were read than it holds; the checkpoint's pieces overlap")
        if self._pending[fqn] == 0:
            target.install(self._staged.pop(fqn))


def _check_fits(flat: dict[str, Any], metadata: Metadata) -> None:
    """Raise :class:`CheckpointMismatchError` where the checkpoint cannot fill ``flat`` (before any data moves)."""
    saved = metadata.state_dict_metadata
    missing = [k for k in flat if k not in saved]
    if missing:
        shown = ", ".join(repr(k) for k in missing[:8]) + (", ..." if len(missing) > 8 else "")
        theirs = ", ".join(repr(k) for k in list(saved)[:8]) + (", ..." if len(saved) > 8 else "")
        if len(missing) == len(flat):
            raise CheckpointMismatchError(
                f"the checkpoint holds none of the state dict's {len(flat)} keys ({shown}); it holds {theirs}. "
                "Is it the checkpoint of another model, or was it saved under another top-level key?")
        raise CheckpointMismatchError(
            f"{len(missing)} of the state dict's {len(flat)} keys are not in the checkpoint: {shown}. Remove them "
            "from the state dict to load the rest, or load a checkpoint of this model")
    for fqn, value in flat.items():
        md = saved[fqn]
        if isinstance(value, torch.Tensor):
            if not isinstance(md, TensorStorageMetadata):
                raise CheckpointMismatchError(f"{fqn} is a tensor in the state dict but an object in the checkpoint")
            if tuple(md.size) != tuple(value.shape):
                raise CheckpointMismatchError(
                    f"{fqn} has shape {tuple(value.shape)} in the state dict but {tuple(md.size)} in the checkpoint "
                    "(a model of another size?)")
        elif isinstance(md, TensorStorageMetadata):
            raise CheckpointMismatchError(
                f"{fqn} is a {type(value).__name__} in the state dict but a tensor of shape {tuple(md.size)} in the "
                "checkpoint; put a tensor of that shape there to load it")
