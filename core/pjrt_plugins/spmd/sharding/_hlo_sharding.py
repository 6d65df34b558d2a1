"""HLO shardings: partition specs to tile assignments to HLO sharding strings (and back) to shard geometry.

Plain Python on tuples of ints. Must never import torch, open a library or keep state.
"""

from __future__ import annotations

import enum
import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import Union

from ...errors import ShardingError
from ._partition_spec import PartitionSpec, as_int, normalize_partition_spec

__all__ = ["OpSharding", "Shard", "ShardingType", "parse_sharding", "parse_tuple_sharding"]

#: Shard indices: one slice per tensor dimension, or ``...`` for a full (replicated) copy.
ShardIndices = Union[tuple[slice, ...], EllipsisType]


class ShardingType(enum.IntEnum):
    """Kinds of sharding; the values are ``xla::OpSharding::Type``'s, as in PyTorch/XLA's ``ShardingType``.

    ``PARTIAL`` is a tiled sharding whose last tile dimension replicates
    (``last_tile_dim_replicate``). ``MANUAL`` (``{manual}``) marks values of a manual-sharding region:
    each device holds its own value, which the partitioner leaves alone.
    """

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6


@dataclass(frozen=True)
class Shard:
    """Where one device's piece of a tensor sits in the global tensor.

    ``indices`` are slices clamped to the global shape (a tail shard can be
    empty), or ``...`` for a full copy. ``padded_shape`` is the shape every
    device holds (``ceil(dim / tiles)`` per dimension); ``shape`` is the
    unpadded part. ``replica_id`` is 0 for tiled shardings, the position in
    the replication group for partial ones (and for a replicated subgroup) and
    the device id for replicated and manual ones. Under ``{manual}`` each device
    holds its own value of the whole (per-device) shape: indices ``...``.
    """

    device: int
    indices: ShardIndices
    replica_id: int
    shape: tuple[int, ...]
    padded_shape: tuple[int, ...]

    @property
    def is_padded(self) -> bool:
        return self.shape != self.padded_shape

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def padded_numel(self) -> int:
        return math.prod(self.padded_shape)


def _check_device_list(devices: Sequence[int], what: str) -> tuple[int, ...]:
    out = []
    for d in devices:
        if isinstance(d, bool) or not isinstance(d, int):
            try:
                d = as_int(d)
            except TypeError:
                raise ShardingError(f"{what}: device ids must be integers, got {d!r}") from None
        if d < 0:
            raise ShardingError(f"{what}: device id {d} is negative")
        out.append(int(d))
    if len(set(out)) != len(out):
        dupes = sorted({d for d in out if out.count(d) > 1})
        raise ShardingError(f"{what}: device ids {dupes} appear more than once")
    return tuple(out)


@dataclass(frozen=True)
class OpSharding:
    """An HLO sharding (XLA's ``OpSharding``): its kind, tile shape and flat tile assignment.

    Named after what ``Mesh.get_op_sharding`` returns in PyTorch/XLA (``torch_xla._XLAC.OpSharding``).
    It is not PyTorch/XLA's ``xs.ShardingSpec``, the input-sharding spec of the data loaders
    (:class:`pjrt_plugins.spmd.ShardingSpec`: a mesh and a partition spec).

    ``tile_shape`` has one entry per tensor dimension for ``TILED``, plus a
    trailing replication dimension for ``PARTIAL``; ``devices`` is the tile
    assignment flattened row-major over ``tile_shape`` (for ``MAXIMAL``, the
    one device). As in XLA, the devices of each replication group of a
    ``PARTIAL`` sharding are kept sorted, so equal placements compare equal
    (and replica ids match the partitioner's). Build one with :meth:`from_partition_spec` or :meth:`parse`;
    ``str(spec)`` is the HLO string.

    ``subgroups`` names the kinds of trailing tile dimensions that are not tensor
    dimensions, for a ``TILED`` sharding that is manual over some devices only
    (XLA's ``last_tile_dims={manual}`` or ``{manual, replicated}``): each manual
    group holds its own value, tiled within the group by the leading dimensions.

    >>> spec = OpSharding.from_partition_spec((2, 4), range(8), (0, None))
    >>> str(spec)
    '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}'
    >>> spec.type.name, spec.shard_shape((5, 3))
    ('PARTIAL', (3, 3))
    """

    type: ShardingType
    tile_shape: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()
    subgroups: tuple[ShardingType, ...] = ()

    def __post_init__(self) -> None:
        kind = ShardingType(self.type)
        object.__setattr__(self, "type", kind)
        object.__setattr__(self, "tile_shape", tuple(int(t) for t in self.tile_shape))
        object.__setattr__(self, "devices", tuple(int(d) for d in self.devices))
        subgroups = tuple(ShardingType(k) for k in self.subgroups)
        object.__setattr__(self, "subgroups", subgroups)
        if subgroups and (kind is not ShardingType.TILED or subgroups not in _SUBGROUP_KINDS
                          or len(subgroups) >= len(self.tile_shape)):
            raise ShardingError(
                f"subgroups {[k.name.lower() for k in subgroups]} need a tiled sharding with a tile dimension for "
                "each, after at least one tensor dimension, of kinds (manual) or (manual, replicated)"
            )
        if kind in (ShardingType.TILED, ShardingType.PARTIAL):
            if any(t < 1 for t in self.tile_shape):
                raise ShardingError(f"tile shape {list(self.tile_shape)} has a dimension below 1")
            if kind is ShardingType.PARTIAL and not self.tile_shape:
                raise ShardingError("a partially replicated sharding needs a trailing replication dimension")
            if math.prod(self.tile_shape) != len(self.devices):
                raise ShardingError(
                    f"tile shape {list(self.tile_shape)} has {math.prod(self.tile_shape)} tiles "
                    f"but the tile assignment lists {len(self.devices)} devices"
                )
            _check_device_list(self.devices, "tile assignment")
            if kind is ShardingType.PARTIAL:
                # XLA's canonical form: devices sorted within each replication group.
                group = self.tile_shape[-1]
                canonical = tuple(
                    d for start in range(0, len(self.devices), group) for d in sorted(self.devices[start : start + group])
                )
                object.__setattr__(self, "devices", canonical)
        elif kind is ShardingType.MAXIMAL:
            if len(self.devices) != 1 or self.tile_shape:
                raise ShardingError("a maximal sharding names exactly one device and no tile shape")
            _check_device_list(self.devices, "maximal sharding")
        elif kind in (ShardingType.REPLICATED, ShardingType.MANUAL, ShardingType.UNKNOWN):
            if self.tile_shape or self.devices:
                raise ShardingError(f"a {kind.name.lower()} sharding has no tile shape or devices")
        else:
            raise ShardingError("tuple shardings are lists of OpSharding; see parse_tuple_sharding")

    # -- constructors ---------------------------------------------------------------

    @classmethod
    def replicated(cls) -> OpSharding:
        """Every device holds the whole tensor: ``{replicated}``."""
        return cls(ShardingType.REPLICATED)

    @classmethod
    def maximal(cls, device: int) -> OpSharding:
        """One device holds the whole tensor: ``{maximal device=N}``."""
        return cls(ShardingType.MAXIMAL, (), (as_int(device),))

    @classmethod
    def manual(cls) -> OpSharding:
        """Each device holds its own data, outside the partitioner's control: ``{manual}``."""
        return cls(ShardingType.MANUAL)

    @classmethod
    def subgrouped(cls, tile_shape: Sequence[int], devices: Sequence[int],
                   kinds: Sequence[ShardingType]) -> OpSharding:
        """A sharding whose last ``len(kinds)`` tile dimensions are subgroups of those kinds, normalized as XLA does.

        ``kinds`` are MANUAL or REPLICATED, each at most once. The subgroup dimensions are put in XLA's
        order (manual first), those of size 1 dropped; what is left may be an ordinary sharding:
        ``{manual}`` when the manual groups are single devices, ``last_tile_dim_replicate`` without
        a manual subgroup.

        >>> str(OpSharding.subgrouped((2, 1, 4), range(8), [ShardingType.MANUAL]))
        '{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dims={manual}}'
        >>> str(OpSharding.subgrouped((1, 1, 8), range(8), [ShardingType.MANUAL]))
        '{manual}'
        """
        tile_shape = tuple(as_int(t) for t in tile_shape)
        devices = tuple(as_int(d) for d in devices)
        kinds = tuple(ShardingType(k) for k in kinds)
        if len(set(kinds)) != len(kinds) or not set(kinds) <= {ShardingType.MANUAL, ShardingType.REPLICATED}:
            raise ShardingError(f"subgroup kinds must be manual and/or replicated, each once; got "
                                f"{[k.name.lower() for k in kinds]}")
        if len(kinds) >= len(tile_shape):
            raise ShardingError(f"tile shape {list(tile_shape)} has no tensor dimension before its "
                                f"{len(kinds)} subgroup dimension(s)")
        if math.prod(tile_shape) != len(devices):
            raise ShardingError(f"tile shape {list(tile_shape)} has {math.prod(tile_shape)} tiles but the tile "
                                f"assignment lists {len(devices)} devices")
        rank = len(tile_shape) - len(kinds)
        order = sorted(range(len(kinds)), key=lambda i: kinds[i] is not ShardingType.MANUAL)  # manual first
        perm = list(range(rank)) + [rank + i for i in order]
        devices = _transpose_flat(devices, tile_shape, perm)
        tile_shape = tuple(tile_shape[a] for a in perm)
        kinds = tuple(kinds[i] for i in order)
        kept = [i for i, k in enumerate(kinds) if tile_shape[rank + i] > 1]
        tile_shape = tile_shape[:rank] + tuple(tile_shape[rank + i] for i in kept)
        kinds = tuple(kinds[i] for i in kept)
        if ShardingType.MANUAL not in kinds:
            return cls.tiled(tile_shape, devices, replicate_last=bool(kinds))
        if kinds == (ShardingType.MANUAL,) and math.prod(tile_shape[:rank]) == 1:
            return cls.manual()
        return cls(ShardingType.TILED, tile_shape, devices, kinds)

    @classmethod
    def tiled(cls, tile_shape: Sequence[int], devices: Sequence[int], *, replicate_last: bool = False) -> OpSharding:
        """A tiled (or, with ``replicate_last``, partially replicated) sharding, normalized.

        Normalization follows XLA: a sharding that tiles nothing is
        ``{replicated}``, and a replication dimension of size 1 is dropped.
        """
        tile_shape = tuple(as_int(t) for t in tile_shape)
        devices = tuple(as_int(d) for d in devices)
        if replicate_last:
            spec = cls(ShardingType.PARTIAL, tile_shape, devices)
            if math.prod(tile_shape[:-1]) == 1:
                return cls.replicated()
            if tile_shape[-1] == 1:
                return cls(ShardingType.TILED, tile_shape[:-1], devices)
            return spec
        spec = cls(ShardingType.TILED, tile_shape, devices)
        if math.prod(tile_shape) == 1:
            return cls.replicated()
        return spec

    @classmethod
    def from_partition_spec(
        cls,
        mesh_shape: Sequence[int],
        device_ids: Sequence[int],
        partition_spec: PartitionSpec,
        axis_names: Sequence[str] | None = None,
        *,
        rank: int | None = None,
    ) -> OpSharding:
        """The sharding a partition spec gives on a logical mesh (PyTorch/XLA's rules).

        ``device_ids`` is the mesh's flat device list (the logical mesh is it,
        reshaped row-major to ``mesh_shape``). Tile assignment: transpose the
        logical mesh to (the spec's axes in spec order) + (unused axes,
        sorted), merging tupled axes, and flatten row-major; unused axes form a
        trailing replication dimension.

        >>> str(OpSharding.from_partition_spec((2, 4), range(8), (1, 0)))
        '{devices=[4,2]0,4,1,5,2,6,3,7}'
        >>> str(OpSharding.from_partition_spec((2, 2, 2), range(8), ((0, 2), None)))
        '{devices=[4,1,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}'
        """
        mesh_shape = tuple(as_int(s) for s in mesh_shape)
        device_ids = _check_device_list(tuple(device_ids), "mesh")
        if math.prod(mesh_shape) != len(device_ids):
            raise ShardingError(f"mesh shape {mesh_shape} holds {math.prod(mesh_shape)} devices, not {len(device_ids)}")
        groups = normalize_partition_spec(partition_spec, mesh_shape, axis_names, rank=rank)
        used = [axis for group in groups for axis in group]
        unused = sorted(set(range(len(mesh_shape))) - set(used))
        order = used + unused
        devices = _transpose_flat(device_ids, mesh_shape, order)
        tile_shape = [math.prod(mesh_shape[a] for a in group) for group in groups]
        if unused:
            tile_shape.append(math.prod(mesh_shape[a] for a in unused))
        return cls.tiled(tile_shape, devices, replicate_last=bool(unused))

    @classmethod
    def parse(cls, text: str) -> OpSharding:
        """Read an HLO sharding string (see :func:`parse_sharding`)."""
        return parse_sharding(text)

    # -- the HLO string ---------------------------------------------------------------

    def to_hlo(self) -> str:
        """The HLO sharding string, e.g. ``{devices=[2,4]0,1,2,3,4,5,6,7}``."""
        kind = self.type
        if kind is ShardingType.REPLICATED:
            return "{replicated}"
        if kind is ShardingType.MANUAL:
            return "{manual}"
        if kind is ShardingType.UNKNOWN:
            return "{unknown}"
        if kind is ShardingType.MAXIMAL:
            return f"{{maximal device={self.devices[0]}}}"
        dims = ",".join(map(str, self.tile_shape))
        devs = ",".join(map(str, self.devices))
        tail = " last_tile_dim_replicate" if kind is ShardingType.PARTIAL else ""
        if self.subgroups:
            tail = " last_tile_dims={" + ", ".join(k.name.lower() for k in self.subgroups) + "}"
        return f"{{devices=[{dims}]{devs}{tail}}}"

    def __str__(self) -> str:
        return self.to_hlo()

    def __repr__(self) -> str:
        return f"OpSharding({self.to_hlo()!r})"

    # -- geometry -------------------------------------------------------------------

    @property
    def is_manual(self) -> bool:
        """Whether devices (all, or groups of them) hold values of their own: ``{manual}`` or manual subgroups.

        Such a tensor has no single global value to gather.
        """
        return self.type is ShardingType.MANUAL or ShardingType.MANUAL in self.subgroups

    @property
    def rank(self) -> int | None:
        """Rank of the tensors this sharding tiles, or ``None`` if it fits any rank."""
        if self.type is ShardingType.TILED:
            return len(self.tile_shape) - len(self.subgroups)
        if self.type is ShardingType.PARTIAL:
            return len(self.tile_shape) - 1
        return None

    @property
    def tiles(self) -> tuple[int, ...]:
        """Tiles per tensor dimension (without the replication dimension)."""
        rank = self.rank
        return self.tile_shape[:rank] if rank is not None else ()

    @property
    def replication(self) -> int:
        """How many devices hold each tile (1 for tiled; 0 meaning 'all' for replicated; 1 for manual, whose
        devices each hold their own value; for manual subgroups, the size of the replicated subgroup)."""
        if self.type is ShardingType.PARTIAL:
            return self.tile_shape[-1]
        if self.subgroups:
            return self.tile_shape[-1] if self.subgroups[-1] is ShardingType.REPLICATED else 1
        if self.type in (ShardingType.TILED, ShardingType.MAXIMAL, ShardingType.MANUAL):
            return 1
        return 0

    @property
    def holders_per_tile(self) -> int:
        """How many devices hold the same tile of the host tensor an upload splits (1: each tile is one device's)."""
        if self.type is ShardingType.PARTIAL:
            return self.tile_shape[-1]
        if self.type is ShardingType.TILED:
            return math.prod(self.tile_shape[len(self.tile_shape) - len(self.subgroups):])
        return 1 if self.type is ShardingType.MAXIMAL else 0

    @property
    def tile_assignment_devices(self) -> tuple[int, ...]:
        return self.devices

    def check_rank(self, global_shape: Sequence[int]) -> None:
        """Raise :class:`ShardingError` if this sharding cannot apply to a tensor of ``global_shape``."""
        rank = self.rank
        if rank is not None and rank != len(global_shape):
            raise ShardingError(
                f"sharding {self} tiles {rank} dimension(s) but the tensor has shape "
                f"{tuple(global_shape)} (rank {len(global_shape)})"
            )

    def check_devices(self, device_ids: Sequence[int]) -> None:
        """Raise if the sharding's devices are not exactly ``device_ids`` (tiled) or not among them (maximal)."""
        present = set(device_ids)
        if self.type in (ShardingType.TILED, ShardingType.PARTIAL):
            mine = set(self.devices)
            if mine != present:
                outside = sorted(mine - present)
                missing = sorted(present - mine)
                parts = []
                if outside:
                    parts.append(f"device id(s) {outside} are out of range (the devices are {sorted(present)})")
                if missing:
                    parts.append(f"device(s) {missing} are not covered")
                raise ShardingError(f"sharding {self}: " + "; ".join(parts))
        elif self.type is ShardingType.MAXIMAL and self.devices[0] not in present:
            raise ShardingError(
                f"sharding {self}: device id {self.devices[0]} is out of range (the devices are {sorted(present)})"
            )

    def shard_shape(self, global_shape: Sequence[int]) -> tuple[int, ...]:
        """The padded shape every holding device stores: ``ceil(dim / tiles)`` per dimension."""
        global_shape = tuple(int(s) for s in global_shape)
        self.check_rank(global_shape)
        if self.rank is None:
            return global_shape
        return tuple(-(-dim // t) for dim, t in zip(global_shape, self.tiles))

    def tile_coordinates(self, device: int) -> tuple[int, ...]:
        """Coordinates of ``device`` in the tile shape (including the replication coordinate)."""
        try:
            position = self.devices.index(device)
        except ValueError:
            raise ShardingError(f"device {device} holds no tile of sharding {self}") from None
        return _unravel(position, self.tile_shape)

    def shard_indices(self, global_shape: Sequence[int], device: int) -> ShardIndices:
        """Slices of the global tensor held by ``device`` (clamped), or ``...`` for a full copy."""
        return self.shard(global_shape, device).indices

    def replica_id(self, device: int) -> int:
        """0 for tiled, position in the replication group for partial, the device id for replicated and manual."""
        if self.type in (ShardingType.REPLICATED, ShardingType.MANUAL):
            return int(device)
        if self.type is ShardingType.PARTIAL or self.replication > 1:
            return self.tile_coordinates(device)[-1]
        if self.type in (ShardingType.TILED, ShardingType.MAXIMAL):
            return 0
        raise NotImplementedError(f"replica ids of a {self.type.name.lower()} sharding are not defined")

    def shard(self, global_shape: Sequence[int], device: int) -> Shard:
        """The :class:`Shard` that ``device`` holds."""
        global_shape = tuple(int(s) for s in global_shape)
        self.check_rank(global_shape)
        kind = self.type
        if kind in (ShardingType.REPLICATED, ShardingType.MANUAL):
            return Shard(int(device), ..., int(device), global_shape, global_shape)
        if kind is ShardingType.MAXIMAL:
            if device != self.devices[0]:
                raise ShardingError(f"device {device} holds nothing under sharding {self}")
            return Shard(int(device), ..., 0, global_shape, global_shape)
        if kind not in (ShardingType.TILED, ShardingType.PARTIAL):
            raise NotImplementedError(
                f"the shards of a {kind.name.lower()} sharding are not defined by the sharding alone"
            )
        coords = self.tile_coordinates(device)
        padded = self.shard_shape(global_shape)
        slices = []
        for dim, size, index in zip(global_shape, padded, coords):
            start = min(index * size, dim)
            stop = min(start + size, dim)
            slices.append(slice(start, stop))
        replica = coords[-1] if kind is ShardingType.PARTIAL or self.replication > 1 else 0
        shape = tuple(s.stop - s.start for s in slices)
        return Shard(int(device), tuple(slices), replica, shape, padded)

    def holders(self, device_ids: Sequence[int]) -> tuple[int, ...]:
        """Which of ``device_ids`` hold data under this sharding (all but the non-owners of a maximal one)."""
        if self.type is ShardingType.MAXIMAL:
            return tuple(d for d in device_ids if d == self.devices[0])
        return tuple(device_ids)

    def shards(self, global_shape: Sequence[int], device_ids: Sequence[int]) -> list[Shard]:
        """One :class:`Shard` per holding device, in the order of ``device_ids``.

        ``device_ids`` are all devices of the virtual device; a tiled sharding
        must cover exactly those.

        >>> spec = OpSharding.from_partition_spec((4,), range(4), (0,))
        >>> [(s.indices, s.shape, s.padded_shape) for s in spec.shards((5,), range(4))][-2:]
        [((slice(4, 5, None),), (1,), (2,)), ((slice(5, 5, None),), (0,), (2,))]
        """
        self.check_devices(device_ids)
        return [self.shard(global_shape, d) for d in self.holders(device_ids)]


#: The subgroup kinds of a manual-subgroup sharding, in XLA's order.
_SUBGROUP_KINDS = ((ShardingType.MANUAL,), (ShardingType.MANUAL, ShardingType.REPLICATED))

# -- parsing --------------------------------------------------------------------------

_DEVICES_RE = re.compile(
    r"""^devices=\[(?P<dims>[0-9,\s]*)\]\s*
        (?:(?P<iota><=\s*\[(?P<reshape>[0-9,\s]*)\]\s*(?:T\((?P<perm>[0-9,\s]*)\))?)|(?P<list>[0-9,\s]*[0-9]))
        (?P<rest>.*)$""",
    re.VERBOSE | re.DOTALL,
)


def parse_sharding(text: str) -> OpSharding:
    """Read one HLO sharding string, as XLA prints it.

    Accepts ``{replicated}``, ``{manual}``, ``{unknown}``, ``{maximal device=N}``,
    ``{devices=[...]d0,d1,...}``, the iota form ``{devices=[2,4]<=[4,2]T(1,0)}``,
    ``last_tile_dim_replicate`` or ``last_tile_dims={...}`` (subgroups: ``replicated``,
    ``manual``), and ignores ``metadata={...}``. Raises :class:`ShardingError` for
    text that is not a sharding.

    >>> parse_sharding("{devices=[2,1,4]<=[8] last_tile_dim_replicate}") == parse_sharding(
    ...     "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}")
    True
    >>> parse_sharding("{devices=[2,1,4]<=[8] last_tile_dims={manual}}").is_manual
    True
    """
    if not isinstance(text, str):
        raise ShardingError(f"an HLO sharding string is a str, got {type(text).__name__}")
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ShardingError(f"{text!r} is not an HLO sharding string (expected '{{...}}')")
    body = _strip_attribute(body[1:-1].strip(), "metadata")
    if body.startswith("{"):
        raise ShardingError(f"{text!r} is a tuple sharding; read it with parse_tuple_sharding")
    words = body.split()
    if body in ("replicated", "manual", "unknown"):
        return OpSharding(ShardingType[body.upper()])
    if words and words[0] == "maximal":
        match = re.fullmatch(r"maximal\s+device=(\d+)", body)
        if not match:
            raise ShardingError(f"{text!r}: a maximal sharding reads '{{maximal device=N}}'")
        return OpSharding.maximal(int(match.group(1)))
    match = _DEVICES_RE.match(body)
    if not match:
        raise ShardingError(f"{text!r} is not an HLO sharding string this reader understands")
    dims = _int_list(match.group("dims"), text)
    if match.group("iota") is not None:
        reshape = _int_list(match.group("reshape"), text)
        perm = _int_list(match.group("perm"), text) if match.group("perm") is not None else list(range(len(reshape)))
        if sorted(perm) != list(range(len(reshape))):
            raise ShardingError(f"{text!r}: T({match.group('perm')}) is not a permutation of the iota dimensions")
        devices = _transpose_flat(tuple(range(math.prod(reshape))), tuple(reshape), perm)
    else:
        devices = tuple(_int_list(match.group("list"), text))
    replicate_last = False
    rest = match.group("rest").strip()
    if rest == "last_tile_dim_replicate":
        replicate_last = True
    elif rest.startswith("last_tile_dims="):
        listed = rest[len("last_tile_dims=") :].strip()
        if not (listed.startswith("{") and listed.endswith("}")):
            raise ShardingError(f"{text!r}: last_tile_dims reads '{{manual}}' or '{{manual, replicated}}'")
        names = [k.strip() for k in listed[1:-1].split(",")]
        if any(name not in ("manual", "replicated") for name in names):
            raise ShardingError(f"{text!r}: subgroup kinds are 'manual' and 'replicated', not {names}")
        if math.prod(dims) != len(devices):
            raise ShardingError(f"{text!r}: tile shape {dims} has {math.prod(dims)} tiles but {len(devices)} devices")
        return OpSharding.subgrouped(dims, devices, [ShardingType[name.upper()] for name in names])
    elif rest:
        raise ShardingError(f"{text!r}: unexpected {rest!r} after the tile assignment")
    if math.prod(dims) != len(devices):
        raise ShardingError(f"{text!r}: tile shape {dims} has {math.prod(dims)} tiles but {len(devices)} devices")
    return OpSharding.tiled(dims, devices, replicate_last=replicate_last)


def parse_tuple_sharding(text: str) -> list[OpSharding]:
    """Read a tuple sharding ``{{...}, {...}}`` (or a single sharding) as a list of specs.

    >>> [str(s) for s in parse_tuple_sharding("{{replicated}, {maximal device=1}}")]
    ['{replicated}', '{maximal device=1}']
    """
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ShardingError(f"{text!r} is not an HLO sharding string (expected '{{...}}')")
    inner = body[1:-1].strip()
    if not inner.startswith("{"):
        return [parse_sharding(body)]
    parts, depth, start = [], 0, None
    for i, ch in enumerate(inner):
        if ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0 and start is not None:
                parts.append(inner[start : i + 1])
                start = None
            elif depth < 0:
                raise ShardingError(f"{text!r}: unbalanced braces")
    if depth != 0:
        raise ShardingError(f"{text!r}: unbalanced braces")
    return [parse_sharding(p) for p in parts]


def _strip_attribute(body: str, name: str) -> str:
    """Remove ``name={...}`` (with nested braces) from a sharding body."""
    key = f"{name}={{"
    while (start := body.find(key)) >= 0:
        depth, end = 0, None
        for i in range(start + len(key) - 1, len(body)):
            if body[i] == "{":
                depth += 1
            elif body[i] == "}":
                depth -= 1
                if depth == 0:
                    end = i
                    break
        if end is None:
            raise ShardingError(f"unbalanced braces in {name}= of sharding {{{body}}}")
        body = (body[:start] + body[end + 1 :]).strip()
    return body


def _int_list(text: str, whole: str) -> list[int]:
    items = [item.strip() for item in text.split(",")]
    if items == [""]:
        return []
    try:
        return [int(item) for item in items]
    except ValueError:
        raise ShardingError(f"{whole!r}: {text!r} is not a list of integers") from None


# -- small index helpers ----------------------------------------------------------------


def _unravel(position: int, shape: Sequence[int]) -> tuple[int, ...]:
    coords = []
    for size in reversed(shape):
        coords.append(position % size)
        position //= size
    return tuple(reversed(coords))


def _transpose_flat(flat: Sequence[int], shape: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    """``flat`` reshaped row-major to ``shape``, axes permuted to ``order``, flattened row-major."""
    shape = tuple(shape)
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    new_shape = [shape[a] for a in order]
    new_strides = [strides[a] for a in order]
    return tuple(
        flat[sum(i * s for i, s in zip(index, new_strides))] for index in itertools.product(*map(range, new_shape))
    )
