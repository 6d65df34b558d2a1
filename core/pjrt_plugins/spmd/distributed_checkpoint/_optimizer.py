"""prime_optimizer: give an optimizer its state before a checkpoint is loaded into it (torch creates it lazily)."""

from __future__ import annotations

import logging

import torch

from ..frontend import unwrap
from ._tiles import is_pjrt, prepare

logger = logging.getLogger(__name__)

__all__ = ["prime_optimizer"]


def prime_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Create ``optimizer``'s state with one step on zero gradients, so a checkpoint can be loaded into it.

    torch makes an optimizer's state (Adam's moments, step counts) at its first ``step()``,
    and ``torch.distributed.checkpoint`` loads in place: without state there is nowhere to load
    to. Each zero gradient takes its parameter's sharding, so the state gets the layout a real
    step gives it. Gradients are reset to ``None`` afterwards.

    The step changes the state and, with weight decay, the parameters: call it just before
    restoring a checkpoint, which overwrites both. Returns ``optimizer``.

    Example::

        optim = torch.optim.AdamW(model.parameters())
        prime_optimizer(optim)
        state = {"model": model.state_dict(), "optim": optim.state_dict()}
        dcp.load(state, checkpoint_id=path, planner=SPMDLoadPlanner(), no_dist=True)
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])
    """
    params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    prepare([p for p in params if is_pjrt(p)])
    for p in params:
        grad = torch.zeros_like(p, requires_grad=False)
        if is_pjrt(p):
            source, target = unwrap(p), unwrap(grad)
            target.annotation, target.mark = source.annotation, source.mark  # uploaded by it at first use
        p.grad = grad
    optimizer.step()
    for p in params:
        p.grad = None
    prepare([v for state in optimizer.state.values() for v in state.values() if is_pjrt(v)]
            + [p for p in params if is_pjrt(p)])
    logger.debug("primed %s with %d parameter(s)", type(optimizer).__name__, len(params))
    return optimizer
