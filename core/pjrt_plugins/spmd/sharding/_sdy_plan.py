"""HLO shardings as Shardy (``sdy``) shardings: one mesh of named axes per program, and the axes of each dimension.

Shardy names its shardings by mesh axes, not by tile assignments. A program's shardings are
expressed on one mesh: the user's (its axis names, sizes and device order) when it can express
them all, else a mesh of prime-sized axes derived from the shardings themselves. A program that
no mesh expresses (manual or maximal shardings, tile assignments of unrelated meshes) gets a
:class:`ShardingError` saying why; the lowering then keeps GSPMD for it. Pure: ints and numpy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...errors import ShardingError
from ._hlo_sharding import OpSharding, ShardingType

__all__ = ["SdyMesh", "SdyPlan", "SdySharding", "plan_sdy"]

#: Mesh axes searched at most, and orders of them tried per sharding (each sharding is matched by trying orders of
#: the axes; a mesh of many small axes could otherwise take factorial time).
_MAX_AXES = 10
_MAX_ORDERS = 20_000


@dataclass(frozen=True)
class SdyMesh:
    """A Shardy mesh: named axes (major to minor) and the device at each position (``None``: ``0..n-1``)."""

    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...] | None = None

    @property
    def size(self) -> int:
        return math.prod(s for _, s in self.axes)

    def text(self) -> str:
        """The mesh as Shardy prints it, e.g. ``<["data"=2, "model"=4]>``."""
        axes = ", ".join(f'"{n}"={s}' for n, s in self.axes)
        ids = "" if self.device_ids is None else f" device_ids=[{', '.join(map(str, self.device_ids))}]"
        return f"<[{axes}]{ids}>"


@dataclass(frozen=True)
class SdySharding:
    """The mesh axes splitting each tensor dimension (major to minor); ``dims`` None: replicated, of any rank."""

    dims: tuple[tuple[str, ...], ...] | None

    def dim_axes(self, rank: int) -> tuple[tuple[str, ...], ...]:
        """The axes of each of ``rank`` dimensions."""
        if self.dims is None:
            return ((),) * rank
        if len(self.dims) != rank:
            raise ShardingError(f"a sharding of {len(self.dims)} dimensions annotates a tensor of rank {rank}")
        return self.dims


@dataclass(frozen=True)
class _Candidate:
    names: tuple[str, ...]
    sizes: tuple[int, ...]
    devices: np.ndarray  # shape == sizes


@dataclass(frozen=True)
class SdyPlan:
    """The mesh of a program and the Shardy form of each of its HLO shardings.

    A sharding not planned (met while lowering, e.g. inside a region) is expressed on the same mesh when it can
    be; :class:`ShardingError` otherwise.
    """

    mesh: SdyMesh
    shardings: dict[OpSharding, SdySharding]
    _candidate: _Candidate | None = field(default=None, compare=False, repr=False)

    def sharding(self, spec: OpSharding) -> SdySharding:
        found = self.shardings.get(spec)
        if found is not None:
            return found
        if spec.type is ShardingType.REPLICATED:
            found = SdySharding(None)
        elif spec.type in (ShardingType.TILED, ShardingType.PARTIAL) and self._candidate is not None:
            dims = _express(self._candidate, spec)
            found = SdySharding(dims) if dims is not None else None
        if found is None:
            raise ShardingError(f"sharding {spec} has no Shardy form on the program's mesh {self.mesh.text()}")
        self.shardings[spec] = found
        return found


def plan_sdy(shardings: Iterable[OpSharding], num_devices: int,
             meshes: Sequence[tuple[Sequence[int], Sequence[str] | None, Sequence[int]]] = ()) -> SdyPlan:
    """Express ``shardings`` on one Shardy mesh of ``num_devices`` devices.

    ``meshes`` are the user's meshes, as ``(mesh_shape, axis_names, device_ids)``, tried first
    (their names appear in the program); then a mesh of prime-sized axes taken from the tile
    assignments. Raises :class:`ShardingError` with the reason when no mesh expresses them all.

    >>> from pjrt_plugins.spmd.sharding import Mesh
    >>> m = Mesh(range(8), (2, 4), ("data", "model"))
    >>> plan = plan_sdy([m.get_op_sharding(("data", None)), m.get_op_sharding((None, "model"))], 8,
    ...                 [(m.mesh_shape, m.axis_names, m.device_ids.tolist())])
    >>> plan.mesh.text()
    '<["data"=2, "model"=4]>'
    >>> plan.sharding(m.get_op_sharding((None, "model"))).dims
    ((), ('model',))
    """
    specs = list(dict.fromkeys(shardings))
    for spec in specs:
        if spec.type in (ShardingType.MANUAL, ShardingType.MAXIMAL, ShardingType.UNKNOWN, ShardingType.TUPLE):
            raise ShardingError(f"sharding {spec} has no Shardy form here ({spec.type.name.lower()})")
    tiled = [s for s in specs if s.type in (ShardingType.TILED, ShardingType.PARTIAL)]
    candidates = [c for c in (_user_candidate(m, num_devices) for m in meshes) if c is not None]
    # References: fully tiled ones first (a partial sharding's replicated devices are listed sorted, not in mesh order).
    references = sorted(tiled, key=lambda s: (s.type is ShardingType.PARTIAL, -math.prod(s.tiles)))
    candidates += [_prime_candidate(ref) for ref in references]
    if not tiled and not candidates:
        candidates.append(_Candidate(("all",), (num_devices,), np.arange(num_devices)))
    reasons = []
    for cand in candidates:
        if len(cand.sizes) > _MAX_AXES or cand.devices.size != num_devices:
            continue
        found: dict[OpSharding, SdySharding] = {}
        for spec in specs:
            dims = None if spec.type is ShardingType.REPLICATED else _express(cand, spec)
            if dims is None and spec.type is not ShardingType.REPLICATED:
                reasons.append(f"mesh {cand.sizes} cannot express {spec}")
                break
            found[spec] = SdySharding(dims)
        else:
            return SdyPlan(_mesh_of(cand), found, cand)
    detail = "; ".join(reasons[:3]) or "no mesh covers the devices"
    raise ShardingError(f"the program's shardings share no Shardy mesh of {num_devices} devices ({detail})")


def _mesh_of(cand: _Candidate) -> SdyMesh:
    flat = tuple(int(d) for d in cand.devices.reshape(-1))
    kept = [(n, s) for n, s in zip(cand.names, cand.sizes)]
    return SdyMesh(tuple(kept), None if flat == tuple(range(len(flat))) else flat)


def _user_candidate(mesh: tuple[Sequence[int], Sequence[str] | None, Sequence[int]], n: int) -> _Candidate | None:
    shape, names, ids = (tuple(int(s) for s in mesh[0]), mesh[1], tuple(int(d) for d in mesh[2]))
    if math.prod(shape) != n or len(ids) != n:
        return None
    labels = tuple(str(a) for a in names) if names is not None else tuple(f"axis_{i}" for i in range(len(shape)))
    return _Candidate(labels, shape, np.array(ids, dtype=np.int64).reshape(shape))


def _primes(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def _prime_candidate(ref: OpSharding) -> _Candidate:
    """A mesh of prime-sized axes laid out as ``ref``'s tile assignment (each tile dimension split major to minor)."""
    sizes = [p for t in ref.tile_shape for p in _primes(t)]
    return _Candidate(tuple(f"axis_{i}" for i in range(len(sizes))), tuple(sizes),
                      np.array(ref.devices, dtype=np.int64).reshape(sizes or (1,)))


def _express(cand: _Candidate, spec: OpSharding) -> tuple[tuple[str, ...], ...] | None:
    """The axes of each dimension of ``spec`` on the candidate mesh, or None when it cannot express it."""
    tiles = spec.tiles
    replication = spec.replication if spec.type is ShardingType.PARTIAL else 1
    axes = [i for i, s in enumerate(cand.sizes) if s > 1]
    want = np.array(spec.devices, dtype=np.int64)
    for tried, groups in enumerate(_orders(axes, cand.sizes, list(tiles))):
        if tried >= _MAX_ORDERS:
            return None
        used = [a for g in groups for a in g]
        rest = [a for a in axes if a not in used]
        if math.prod(cand.sizes[a] for a in rest) != replication:
            continue
        ones = [i for i, s in enumerate(cand.sizes) if s == 1]
        order = used + rest + ones
        got = cand.devices.transpose(order).reshape(-1)
        if spec.type is ShardingType.PARTIAL:
            got = np.sort(got.reshape(-1, replication), axis=1).reshape(-1)
        if np.array_equal(got, want):
            return tuple(tuple(cand.names[a] for a in g) for g in groups)
    return None


def _orders(axes: list[int], sizes: Sequence[int], tiles: list[int]) -> Iterator[list[list[int]]]:
    """Every way to give each tile dimension an ordered list of unused axes whose sizes multiply to its tile count."""
    if not tiles:
        yield []
        return
    first, rest = tiles[0], tiles[1:]
    for group in _products(axes, sizes, first):
        left = [a for a in axes if a not in group]
        for tail in _orders(left, sizes, rest):
            yield [group, *tail]


def _products(axes: list[int], sizes: Sequence[int], target: int) -> Iterator[list[int]]:
    if target == 1:
        yield []
        return
    for a in axes:
        if target % sizes[a] == 0:
            left = [b for b in axes if b != a]
            for tail in _products(left, sizes, target // sizes[a]):
                yield [a, *tail]
