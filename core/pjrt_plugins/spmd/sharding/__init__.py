"""Layer 1 of the SPMD engine: the sharding data model (meshes, partition specs, HLO shardings, shard geometry).

Pure: plain Python and numpy on ids and shapes. It must never import torch, open a plugin or keep process
state; every other layer builds on it. Not a public API: use ``pjrt_plugins.spmd``.
"""

from __future__ import annotations

from ._hlo_sharding import OpSharding, Shard, ShardIndices, ShardingType, parse_sharding, parse_tuple_sharding
from ._mesh import Mesh, hybrid_device_ids
from ._mesh_axis_dims import axis_dims_from_spec, spec_from_axis_dims
from ._partition_spec import PartitionSpec, normalize_partition_spec
from ._sdy_plan import SdyMesh, SdyPlan, SdySharding, plan_sdy

__all__ = [
    "Mesh",
    "OpSharding",
    "PartitionSpec",
    "Shard",
    "ShardIndices",
    "SdyMesh",
    "SdyPlan",
    "SdySharding",
    "ShardingType",
    "axis_dims_from_spec",
    "hybrid_device_ids",
    "normalize_partition_spec",
    "parse_sharding",
    "parse_tuple_sharding",
    "plan_sdy",
    "spec_from_axis_dims",
]
