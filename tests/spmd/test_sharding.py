"""Pure sharding arithmetic: partition specs -> HLO strings, parsing, shard geometry, replica ids."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pjrt_plugins.errors import ShardingError
from pjrt_plugins.spmd.sharding import (
    OpSharding,
    ShardingType,
    normalize_partition_spec,
    parse_sharding,
    parse_tuple_sharding,
)

IDS8 = tuple(range(8))

# (mesh_shape, device_ids, axis_names, partition_spec, expected HLO string)
STRING_TABLE = [
    # 1-D meshes
    ((8,), IDS8, None, (0,), "{devices=[8]0,1,2,3,4,5,6,7}"),
    ((8,), IDS8, None, (None,), "{replicated}"),
    ((8,), IDS8, None, (0, None), "{devices=[8,1]0,1,2,3,4,5,6,7}"),
    ((8,), IDS8, None, (None, 0), "{devices=[1,8]0,1,2,3,4,5,6,7}"),
    ((4,), (0, 1, 2, 3), None, (0,), "{devices=[4]0,1,2,3}"),
    ((4,), (3, 1, 0, 2), ("x",), (None, "x"), "{devices=[1,4]3,1,0,2}"),
    # 2-D meshes (PyTorch/XLA's documented examples first)
    ((2, 4), IDS8, None, (0, 1), "{devices=[2,4]0,1,2,3,4,5,6,7}"),
    ((2, 4), IDS8, None, (0, None), "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    ((2, 4), IDS8, None, (1, 0), "{devices=[4,2]0,4,1,5,2,6,3,7}"),
    ((2, 4), IDS8, None, (None, 1), "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
    ((2, 4), IDS8, None, (1, None), "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
    ((2, 4), IDS8, None, (None, None), "{replicated}"),
    ((2, 4), tuple(reversed(IDS8)), None, (0, 1), "{devices=[2,4]7,6,5,4,3,2,1,0}"),
    # (XLA keeps each replication group sorted)
    ((2, 4), tuple(reversed(IDS8)), None, (0, None), "{devices=[2,1,4]4,5,6,7,0,1,2,3 last_tile_dim_replicate}"),
    # named axes
    ((2, 4), IDS8, ("data", "model"), ("model", "data"), "{devices=[4,2]0,4,1,5,2,6,3,7}"),
    ((2, 4), IDS8, ("data", "model"), ("data", None, None), "{devices=[2,1,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    ((2, 4), IDS8, ("data", "model"), (None, ("model", 0)), "{devices=[1,8]0,4,1,5,2,6,3,7}"),
    # tuples of axes (merged, order matters)
    ((2, 4), IDS8, None, ((0, 1), None), "{devices=[8,1]0,1,2,3,4,5,6,7}"),
    ((2, 4), IDS8, None, ((1, 0),), "{devices=[8]0,4,1,5,2,6,3,7}"),
    ((2, 4), IDS8, None, ((), 1), "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
    # 3-D meshes
    ((2, 2, 2), IDS8, None, (0, 1, 2), "{devices=[2,2,2]0,1,2,3,4,5,6,7}"),
    ((2, 2, 2), IDS8, None, (2, None, 0), "{devices=[2,1,2,2]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    ((2, 2, 2), IDS8, None, ((0, 2), None), "{devices=[4,1,2]0,2,1,3,4,6,5,7 last_tile_dim_replicate}"),
    ((2, 2, 2), IDS8, ("a", "b", "c"), ("c",), "{devices=[2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    ((2, 1, 4), IDS8, None, (2, 0), "{devices=[4,2]0,4,1,5,2,6,3,7}"),  # the unused axis has size 1
    # 4-D meshes
    ((1, 2, 2, 2), IDS8, None, (0, 1, 2, 3), "{devices=[1,2,2,2]0,1,2,3,4,5,6,7}"),
    ((2, 1, 2, 2), IDS8, None, (None, None, (3, 0), 2), "{devices=[1,1,4,2]0,2,4,6,1,3,5,7}"),
    ((2, 2, 1, 2), IDS8, None, (3, None), "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    # size-1 axes tile nothing; scalars
    ((1, 8), IDS8, None, (0, None), "{replicated}"),
    ((2, 4), IDS8, None, (), "{replicated}"),
    ((8,), IDS8, None, (), "{replicated}"),
]


@pytest.mark.parametrize("mesh_shape, ids, names, spec, expected", STRING_TABLE)
def test_partition_spec_gives_the_hlo_string(mesh_shape, ids, names, spec, expected):
    sharding = OpSharding.from_partition_spec(mesh_shape, ids, spec, names)
    assert str(sharding) == expected
    assert parse_sharding(expected) == sharding


@pytest.mark.parametrize("mesh_shape, ids, names, spec, expected", STRING_TABLE)
def test_jaxlib_reads_our_strings_the_same_way(mesh_shape, ids, names, spec, expected):
    hlo = pytest.importorskip("jaxlib._hlo", reason="jaxlib (the spmd extra) is not installed").HloSharding
    ours = OpSharding.from_partition_spec(mesh_shape, ids, spec, names)
    theirs = hlo.from_string(str(ours))
    if ours.type is ShardingType.REPLICATED:
        assert theirs.is_replicated()
    else:
        assert list(theirs.tile_assignment_dimensions()) == list(ours.tile_shape)
        assert list(theirs.tile_assignment_devices()) == list(ours.devices)
        assert theirs.replicate_on_last_tile_dim() == (ours.type is ShardingType.PARTIAL)


def test_sharding_types_follow_the_spec():
    assert OpSharding.from_partition_spec((2, 4), IDS8, (0, 1)).type is ShardingType.TILED
    assert OpSharding.from_partition_spec((2, 4), IDS8, (0, None)).type is ShardingType.PARTIAL
    assert OpSharding.from_partition_spec((2, 4), IDS8, (None, None)).type is ShardingType.REPLICATED
    assert OpSharding.maximal(3).type is ShardingType.MAXIMAL
    assert int(ShardingType.TILED) == 3 and int(ShardingType.PARTIAL) == 5  # PyTorch/XLA's numbering


@pytest.mark.parametrize(
    "text",
    ["{replicated}", "{manual}", "{unknown}", "{maximal device=5}", "{devices=[2,2]3,2,1,0}"],
)
def test_special_strings_round_trip(text):
    assert str(parse_sharding(text)) == text


@pytest.mark.parametrize(
    "text, expected",
    [
        ("{devices=[2,4]<=[8]}", "{devices=[2,4]0,1,2,3,4,5,6,7}"),
        ("{devices=[4,2]<=[2,4]T(1,0)}", "{devices=[4,2]0,4,1,5,2,6,3,7}"),
        ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
        ("{devices=[2,1,4]<=[8] last_tile_dims={replicated}}", "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
        ("{devices=[1,1]0}", "{replicated}"),
        ("{devices=[2,2,1]0,1,2,3 last_tile_dim_replicate}", "{devices=[2,2]0,1,2,3}"),
        ('{devices=[2]0,1 metadata={op_name="x" source_file="a{b}.py"}}', "{devices=[2]0,1}"),
        ('{replicated metadata={op_name="y"}}', "{replicated}"),
        ("  {maximal device=0}  ", "{maximal device=0}"),
    ],
)
def test_parse_reads_what_xla_prints(text, expected):
    assert str(parse_sharding(text)) == expected


def test_parse_iota_forms_match_jaxlib():
    hlo = pytest.importorskip("jaxlib._hlo", reason="jaxlib (the spmd extra) is not installed").HloSharding
    for text in ["{devices=[2,2,2]<=[2,2,2]T(2,0,1)}", "{devices=[4,1,2]<=[2,2,2]T(1,0,2) last_tile_dim_replicate}"]:
        assert list(parse_sharding(text).devices) == list(hlo.from_string(text).tile_assignment_devices())


def test_parse_tuple_sharding():
    specs = parse_tuple_sharding("{{replicated}, {devices=[2]1,0}, {maximal device=1}}")
    assert [str(s) for s in specs] == ["{replicated}", "{devices=[2]1,0}", "{maximal device=1}"]
    assert parse_tuple_sharding("{devices=[2]0,1}") == [parse_sharding("{devices=[2]0,1}")]


@pytest.mark.parametrize(
    "text",
    ["replicated", "{}", "{devices=[2]0}", "{devices=[2,x]0,1}", "{maximal}", "{devices=[2]0,0}", "{tiled}",
     "{devices=[2]0,1 surprise}", "{devices=[2]<=[2]T(1)}", "{{replicated}}", 5],
)
def test_parse_rejects_what_is_not_a_sharding(text):
    with pytest.raises(ShardingError):
        parse_sharding(text)


MANUAL_SUBGROUP_STRINGS = [
    "{devices=[2,2]<=[4] last_tile_dims={manual}}",
    "{devices=[2,1,4]<=[8] last_tile_dims={manual}}",
    "{devices=[1,1,2,4]<=[8] last_tile_dims={manual, replicated}}",
    "{devices=[1,1,2,4]<=[8] last_tile_dims={replicated, manual}}",
    "{devices=[2,1,2,2]<=[2,2,2]T(2,1,0) last_tile_dims={replicated, manual}}",
    "{devices=[2,2,1,2]<=[8] last_tile_dims={manual, replicated}}",
    "{devices=[2,1,1]<=[2] last_tile_dims={manual}}",
    "{devices=[1,1,8]<=[8] last_tile_dims={manual}}",
    "{devices=[1,1,8]<=[8] last_tile_dims={replicated}}",
]


@pytest.mark.parametrize("text", MANUAL_SUBGROUP_STRINGS)
def test_parse_manual_subgroups_as_xla_does(text):
    """Subgroups are put in XLA's order (manual first), size-1 ones dropped, and collapse as XLA collapses them."""
    hlo = pytest.importorskip("jaxlib._hlo", reason="jaxlib (the spmd extra) is not installed").HloSharding
    ours, xla = parse_sharding(text), hlo.from_string(text)
    assert hlo.from_string(str(ours)) == xla
    assert list(ours.devices) == list(xla.tile_assignment_devices())
    assert [k.name for k in ours.subgroups] == [k.name for k in xla.subgroup_types()]
    assert parse_sharding(str(ours)) == ours


def test_manual_subgroup_geometry():
    """Two manual groups of four devices, each tiling dimension 0 in two and replicating over two."""
    spec = parse_sharding("{devices=[2,1,2,2]0,1,2,3,4,5,6,7 last_tile_dims={manual, replicated}}")
    assert spec.type is ShardingType.TILED and spec.is_manual and spec.rank == 2
    assert spec.tiles == (2, 1) and spec.replication == 2 and spec.holders_per_tile == 4
    shards = spec.shards((4, 3), IDS8)
    assert [s.indices for s in shards[:4]] == [(slice(0, 2), slice(0, 3))] * 4  # devices 0,1,2,3: first rows
    assert [s.indices[0] for s in shards[4:]] == [slice(2, 4)] * 4
    assert [s.replica_id for s in shards] == [0, 1, 0, 1] * 2
    assert spec.shard_shape((4, 3)) == (2, 3)


@pytest.mark.parametrize(
    "text, message",
    [("{devices=[2,2]0,1,2,3 last_tile_dims={tiled}}", "subgroup kinds"),
     ("{devices=[2,2]0,1,2,3 last_tile_dims=manual}", "last_tile_dims reads"),
     ("{devices=[4]0,1,2,3 last_tile_dims={manual}}", "no tensor dimension"),
     ("{devices=[2,2,2]<=[8] last_tile_dims={manual, manual}}", "each once")],
)
def test_parse_rejects_bad_subgroups(text, message):
    with pytest.raises(ShardingError, match=message):
        parse_sharding(text)


# -- partition spec errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, names, rank, message",
    [
        ((0, 1, None), None, 2, "has 3 entries but the tensor has rank 2"),
        ((0,), None, 2, "has 1 entry but the tensor has rank 2"),
        ((2, None), None, None, "mesh axis 2 .* out of range"),
        ((-1, None), None, None, "mesh axis -1 .* out of range"),
        ((0, 0), None, None, "mesh axis 0 is used twice"),
        (((0, 1), 1), None, None, "mesh axis 1 is used twice"),
        (((1, 1),), None, None, "mesh axis 1 is used twice"),
        (("data", "data"), ("data", "model"), None, r"mesh axis 0 \('data'\) is used twice"),
        (("batch", None), ("data", "model"), None, "unknown mesh axis name 'batch'"),
        (("data", None), None, None, "the mesh has no axis names"),
        ((1.0, None), None, None, "is not a mesh axis"),
        ((True, None), None, None, "is not a mesh axis"),
        ("01", None, None, "one entry per tensor dimension"),
        (0, None, None, "one entry per tensor dimension"),
    ],
)
def test_bad_partition_specs_raise_naming_the_problem(spec, names, rank, message):
    with pytest.raises(ShardingError, match=message):
        OpSharding.from_partition_spec((2, 4), IDS8, spec, names, rank=rank)


def test_normalize_partition_spec_resolves_names_and_tuples():
    assert normalize_partition_spec(("data", None, ("x", 2)), (2, 2, 2), ("data", "x", "y")) == ((0,), (), (1, 2))
    assert normalize_partition_spec([[0, 1], None], (2, 4)) == ((0, 1), ())


def test_sharding_spec_checks_its_own_consistency():
    with pytest.raises(ShardingError, match="4 tiles but the tile assignment lists 3 devices"):
        OpSharding(ShardingType.TILED, (2, 2), (0, 1, 2))
    with pytest.raises(ShardingError, match="appear more than once"):
        OpSharding(ShardingType.TILED, (2,), (1, 1))
    with pytest.raises(ShardingError, match="negative"):
        OpSharding.maximal(-1)


# -- shard geometry ----------------------------------------------------------------------------


def _geometry(spec: OpSharding, shape, devices):
    return [(s.device, s.indices, s.shape, s.padded_shape, s.replica_id) for s in spec.shards(shape, devices)]


def test_five_elements_over_four_devices_pad_and_clamp():
    spec = OpSharding.from_partition_spec((4,), range(4), (0,))
    assert spec.shard_shape((5,)) == (2,)
    assert _geometry(spec, (5,), range(4)) == [
        (0, (slice(0, 2),), (2,), (2,), 0),
        (1, (slice(2, 4),), (2,), (2,), 0),
        (2, (slice(4, 5),), (1,), (2,), 0),
        (3, (slice(5, 5),), (0,), (2,), 0),  # the tail shard is empty, and all padding
    ]


def test_eight_by_seven_over_a_two_by_two_tile():
    spec = OpSharding.from_partition_spec((2, 2), range(4), (0, 1))
    assert spec.shard_shape((8, 7)) == (4, 4)
    assert _geometry(spec, (8, 7), range(4)) == [
        (0, (slice(0, 4), slice(0, 4)), (4, 4), (4, 4), 0),
        (1, (slice(0, 4), slice(4, 7)), (4, 3), (4, 4), 0),
        (2, (slice(4, 8), slice(0, 4)), (4, 4), (4, 4), 0),
        (3, (slice(4, 8), slice(4, 7)), (4, 3), (4, 4), 0),
    ]


def test_replica_ids_tiled_partial_replicated_maximal():
    tiled = OpSharding.from_partition_spec((2, 4), IDS8, (0, 1))
    assert [tiled.replica_id(d) for d in IDS8] == [0] * 8
    partial = OpSharding.from_partition_spec((2, 4), IDS8, (0, None))
    assert [partial.replica_id(d) for d in IDS8] == [0, 1, 2, 3, 0, 1, 2, 3]
    # a transposed mesh: the replication group of tile 0 along the rows is devices 0 and 4
    partial_t = OpSharding.from_partition_spec((2, 4), IDS8, (1, None))
    assert [(d, partial_t.replica_id(d)) for d in (0, 4, 1, 5)] == [(0, 0), (4, 1), (1, 0), (5, 1)]
    replicated = OpSharding.replicated()
    shards = replicated.shards((3, 2), range(4))
    assert [(s.replica_id, s.indices) for s in shards] == [(d, ...) for d in range(4)]
    maximal = OpSharding.maximal(2)
    assert _geometry(maximal, (3,), range(4)) == [(2, ..., (3,), (3,), 0)]


def test_partial_shards_repeat_across_the_replication_group():
    spec = OpSharding.from_partition_spec((2, 4), IDS8, (0, None))
    shards = {s.device: s for s in spec.shards((6, 3), IDS8)}
    assert shards[0].indices == shards[3].indices == (slice(0, 3), slice(0, 3))
    assert shards[4].indices == shards[7].indices == (slice(3, 6), slice(0, 3))


def test_shards_reject_a_mismatched_rank_or_device_set():
    spec = OpSharding.from_partition_spec((2, 4), IDS8, (0, 1))
    with pytest.raises(ShardingError, match="rank 3"):
        spec.shards((2, 2, 2), IDS8)
    with pytest.raises(ShardingError, match=r"out of range"):
        spec.shards((4, 4), range(4))
    with pytest.raises(ShardingError, match=r"not covered"):
        spec.shards((4, 4), range(9))
    with pytest.raises(ShardingError, match="out of range"):
        OpSharding.maximal(9).shards((2,), range(8))


def test_manual_sharding_geometry_is_each_device_whole():
    """Under {manual} the tensor's shape is each device's own: every device holds all of it (indices ...)."""
    spec = OpSharding.manual()
    assert spec.is_manual and spec.rank is None and spec.replication == 1
    assert spec.shard_shape((2, 3)) == (2, 3)
    shards = spec.shards((2, 3), IDS8)
    assert [(s.device, s.indices, s.replica_id, s.shape) for s in shards] == [(d, ..., d, (2, 3)) for d in IDS8]
    assert not OpSharding.from_partition_spec((2, 4), IDS8, (0, 1)).is_manual


# -- properties over many meshes and specs -------------------------------------------------------


def _factorizations(n: int, max_axes: int = 4) -> list[tuple[int, ...]]:
    out = [(n,)]
    for k in range(2, max_axes + 1):
        for combo in itertools.product([d for d in range(1, n + 1) if n % d == 0], repeat=k):
            if math.prod(combo) == n:
                out.append(combo)
    return out


@st.composite
def mesh_and_spec(draw, n=8):
    mesh_shape = draw(st.sampled_from(_factorizations(n)))
    ids = draw(st.permutations(list(range(n))))
    rank = draw(st.integers(0, 4))
    axes = draw(st.permutations(list(range(len(mesh_shape)))))
    spec, pos = [], 0
    for _ in range(rank):
        take = draw(st.integers(0, len(axes) - pos))
        group = tuple(axes[pos : pos + take])
        pos += take
        spec.append(None if not group else (group[0] if len(group) == 1 and draw(st.booleans()) else group))
    shape = tuple(draw(st.integers(0, 9)) for _ in range(rank))
    return mesh_shape, tuple(ids), tuple(spec), shape


@settings(max_examples=300, deadline=None)
@given(mesh_and_spec())
def test_tile_assignment_is_the_transposed_logical_mesh(case):
    mesh_shape, ids, spec, _shape = case
    sharding = OpSharding.from_partition_spec(mesh_shape, ids, spec)
    groups = normalize_partition_spec(spec, mesh_shape)
    used = [a for g in groups for a in g]
    unused = sorted(set(range(len(mesh_shape))) - set(used))
    tiles = [math.prod(mesh_shape[a] for a in g) for g in groups]
    replication = math.prod(mesh_shape[a] for a in unused)
    expected = np.asarray(ids).reshape(mesh_shape).transpose(used + unused).reshape(-1, replication)
    if replication > 1:
        expected = np.sort(expected, axis=1)  # XLA's canonical partial form
    if math.prod(tiles) == 1:
        assert sharding.type is ShardingType.REPLICATED
        return
    assert list(sharding.devices) == expected.reshape(-1).tolist()
    assert list(sharding.tiles) == tiles
    assert sharding.replication == replication
    assert parse_sharding(str(sharding)) == sharding


@settings(max_examples=300, deadline=None)
@given(mesh_and_spec())
def test_shards_cover_the_tensor_once_per_replica(case):
    mesh_shape, ids, spec, shape = case
    sharding = OpSharding.from_partition_spec(mesh_shape, ids, spec)
    shards = sharding.shards(shape, range(8))
    assert len(shards) == 8
    groups = {}
    for shard in shards:
        assert shard.padded_shape == sharding.shard_shape(shape)
        if shard.indices is not ...:
            assert all(0 <= s.start <= s.stop <= dim for s, dim in zip(shard.indices, shape))
            assert shard.shape == tuple(s.stop - s.start for s in shard.indices)
        groups.setdefault(shard.replica_id, []).append(shard)
    for members in groups.values():
        covered = np.zeros(shape, dtype=np.int64)
        for shard in members:
            covered[shard.indices] += 1
        assert (covered == 1).all()  # each replica group holds every element exactly once


def test_docstring_examples_hold():
    import doctest

    from pjrt_plugins.spmd.sharding import _hlo_sharding, _mesh, _partition_spec

    for module in (_hlo_sharding, _partition_spec, _mesh):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_sharding_arithmetic_never_imports_torch():
    import ast
    import inspect

    from pjrt_plugins.spmd import sharding

    for module in (sharding, *(getattr(sharding, m) for m in ("_hlo_sharding", "_partition_spec", "_mesh"))):
        tree = ast.parse(inspect.getsource(module))
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not any(name.split(".")[0] == "torch" for name in imported), (module.__name__, imported)
