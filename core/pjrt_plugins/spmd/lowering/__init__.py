"""Lowering of torch.fx graphs of core ATen ops to StableHLO, built with jaxlib's MLIR builders.

``lower_graph(graph, LoweringOptions(...))`` returns a :class:`LoweredModule` (MLIR text and a
portable artifact for the plugin's StableHLO version). It never compiles or touches devices.
"""

from __future__ import annotations

from typing import Any

# Importing the op modules fills the op table.
from . import (  # noqa: F401
    _conv,
    _elementwise,
    _factories,
    _factorizations,
    _fft,
    _indexing,
    _linalg,
    _nonzero,
    _pooling,
    _random,
    _reductions,
    _resample,
    _shapes,
    _special,
)
from . import _ternary  # noqa: F401  (lerp, addcmul, addcdiv: the optimizers' per-parameter ops)
from . import _optim  # noqa: F401  (the fused Adam/AdamW step, one op per step)
from . import _region  # noqa: F401  (a torch.compile graph, one op per call)
from . import _collectives  # noqa: F401  (manual-sharding regions and their collectives)
from ._annotations import OPTIMIZATION_BARRIER, SHARD_ALIKE, SHARDING_CONSTRAINT, SHARDING_HINT
from ._decompose import decomposition_for, expand_graph, functional_variant, is_inplace
from ._emitter import LoweringOptions, ScalarSlot
from ._foreach import foreach_plan, is_foreach
from ._optim import ADAM_STEP, SGD_STEP, adam_step_outputs, sgd_step_outputs
from ._region import REGION, region, register_region
from ._module import (
    RNG_KEY_DTYPE,
    LoweredModule,
    fetch_attr,
    lower_graph,
    lowered_decomposition_outputs,
    sharding_string,
    target_version,
)
from ._composites import COMPOSITES
from ._table import (
    COMPLEX_LOWERINGS,
    LOWERINGS,
    META_RULES,
    RANDOM_OPS,
    DuplicateRegistrationError,
    is_random,
    op_name,
    refuse_generator,
)

# A decomposition of ours for an op that is also lowered by hand would never run (the lowering wins):
# refuse it, as inductor's make_fallback refuses an op that has a decomposition.
_shadowed = sorted(op_name(op) for op in COMPOSITES if op in LOWERINGS)
if _shadowed:
    raise DuplicateRegistrationError(f"{', '.join(_shadowed)} both lowered by hand and decomposed in _composites; "
                                     "remove one of the two")


def has_lowering(op: Any) -> bool:
    """True when ``op`` is lowered by hand (not counting torch decompositions)."""
    return op in LOWERINGS


def supported_ops() -> list[str]:
    """Names of the hand-lowered operators, sorted (decomposable operators also work)."""
    return sorted(op_name(op) for op in LOWERINGS)


__all__ = [
    "ADAM_STEP",
    "SGD_STEP",
    "COMPLEX_LOWERINGS",
    "LOWERINGS",
    "META_RULES",
    "OPTIMIZATION_BARRIER",
    "RANDOM_OPS",
    "REGION",
    "RNG_KEY_DTYPE",
    "SHARDING_CONSTRAINT",
    "SHARDING_HINT",
    "SHARD_ALIKE",
    "ScalarSlot",
    "adam_step_outputs",
    "LoweredModule",
    "LoweringOptions",
    "decomposition_for",
    "expand_graph",
    "fetch_attr",
    "foreach_plan",
    "functional_variant",
    "has_lowering",
    "is_foreach",
    "is_inplace",
    "is_random",
    "lower_graph",
    "lowered_decomposition_outputs",
    "op_name",
    "refuse_generator",
    "region",
    "register_region",
    "sgd_step_outputs",
    "sharding_string",
    "supported_ops",
    "target_version",
]
