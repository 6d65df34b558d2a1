"""Distributed checkpoints of pjrt tensors (PyTorch/XLA's ``torch_xla.experimental.distributed_checkpoint``).

``SPMDSavePlanner`` / ``SPMDLoadPlanner`` for ``torch.distributed.checkpoint``: each distinct tile is
written once, read from one device that holds it, and a checkpoint loads into any mesh and
sharding. ``CheckpointManager`` numbers, keeps and restores them (asynchronous saves included);
``prime_optimizer`` creates an optimizer's state to load into. See docs/spmd.md, "Checkpoints".

Example::

    import torch.distributed.checkpoint as dcp
    from pjrt_plugins.spmd.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner

    dcp.save({"model": model.state_dict()}, checkpoint_id="ckpt", planner=SPMDSavePlanner(), no_dist=True)
    state = {"model": other_model.state_dict()}          # on pjrt, marked as wanted
    dcp.load(state, checkpoint_id="ckpt", planner=SPMDLoadPlanner(), no_dist=True)
    other_model.load_state_dict(state["model"])
"""

from __future__ import annotations

from ...errors import CheckpointError, CheckpointMismatchError
from ._manager import CheckpointManager
from ._optimizer import prime_optimizer
from ._planners import SPMDLoadPlanner, SPMDSavePlanner

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "CheckpointMismatchError",
    "SPMDLoadPlanner",
    "SPMDSavePlanner",
    "prime_optimizer",
]
