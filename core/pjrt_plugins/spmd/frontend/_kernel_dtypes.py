"""Dtype rules of torch's CPU kernels that its meta kernels (and so the engine) do not check.

Why: the engine computes an op's result from its meta kernel and records a lowering, so it would run what
torch's CPU kernels refuse and hand back values torch never gives: ``lerp`` of integer tensors
(``"lerp_kernel_scalar" not implemented for 'Long'``; the engine truncated the weight), and ``index_put_`` /
``index_add_`` with values of another dtype than the target (torch: "Index put requires the source and
destination dtypes match"; the engine cast the values). These rules depend on the dtypes alone, so torch's
own CPU kernel decides, run once per op and dtypes on one-element stand-ins, and its error is raised as is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

__all__ = ["CHECKED", "check_kernel_dtypes"]

logger = logging.getLogger(__name__)

aten = torch.ops.aten


def _stand_in(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of ``t``'s dtype and rank with one element (a rank keeps torch's promotion category)."""
    return torch.zeros((1,) * t.dim(), dtype=t.dtype)


def _pointwise(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return tree_map_only(torch.Tensor, _stand_in, (args, kwargs))


def _index_put(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    # (self, indices, values, accumulate, ...): one index of the first index's dtype into a 1-element target.
    self, indices, values, *rest = args
    index = next((i for i in indices if i is not None), None)
    index_dtype = torch.long if index is None else index.dtype
    stand_ins = (torch.zeros(1, dtype=self.dtype), [torch.zeros(1, dtype=index_dtype)], torch.zeros(1, dtype=values.dtype))
    return (*stand_ins, *rest), tree_map_only(torch.Tensor, lambda t: torch.zeros(1, dtype=t.dtype), kwargs)


def _index_add(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    # (self, dim, index, source): one element added at index 0 of dimension 0.
    self, _dim, index, source, *rest = args
    stand_ins = (torch.zeros(1, dtype=self.dtype), 0, torch.zeros(1, dtype=index.dtype), torch.zeros(1, dtype=source.dtype))
    return (*stand_ins, *rest), tree_map_only(torch.Tensor, lambda t: torch.zeros(1, dtype=t.dtype), kwargs)


_PACKETS: dict[Any, Callable[[tuple, dict], tuple[tuple, dict]]] = {
    aten.lerp: _pointwise,
    aten.lerp_: _pointwise,
    aten.index_put: _index_put,
    aten.index_put_: _index_put,
    aten._index_put_impl_: _index_put,
    aten.index_add: _index_add,
    aten.index_add_: _index_add,
}
#: The overloads whose dtypes are checked (``func in CHECKED`` is the dispatcher's test).
CHECKED: dict[Any, Callable[[tuple, dict], tuple[tuple, dict]]] = {
    getattr(packet, name): stand_ins for packet, stand_ins in _PACKETS.items() for name in packet.overloads()
}

#: (op, dtypes of its arguments) -> torch's error (type, message), or None where the CPU kernel runs.
_verdicts: dict[tuple, tuple[type[BaseException], str] | None] = {}


def _dtypes(tree: Any) -> tuple:
    leaves, _ = torch.utils._pytree.tree_flatten(tree)
    return tuple((leaf.dtype, leaf.dim() == 0) if isinstance(leaf, torch.Tensor) else type(leaf) for leaf in leaves)


def check_kernel_dtypes(func: Any, args: tuple, kwargs: dict) -> None:
    """Raise torch's own error when its CPU kernel of ``func`` refuses these arguments' dtypes."""
    key = (func, _dtypes((args, kwargs)))
    if key not in _verdicts:
        stand_in_args, stand_in_kwargs = CHECKED[func](args, kwargs)
        verdict: tuple[type[BaseException], str] | None = None
        try:
            func(*stand_in_args, **stand_in_kwargs)
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            verdict = (type(exc), str(exc))
        _verdicts[key] = verdict
        logger.debug("torch's CPU kernel of %s with dtypes %s: %s", func, key[1], verdict or "runs")
    verdict = _verdicts[key]
    if verdict is not None:
        raise verdict[0](verdict[1])
