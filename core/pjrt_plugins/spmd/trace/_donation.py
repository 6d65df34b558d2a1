"""Buffer donation: a program input whose tensor the same program updates in place gives its device memory
to that output (jax's ``donate_argnums``, PyTorch/XLA's ``XLA_ENABLE_PARAM_ALIASING``), so a training step
writes parameters and optimizer state where they were instead of allocating new buffers every step.

Only when nothing else can read the old buffers afterwards: the tensor that held them has moved on to the
pending value, and no other object refers to the buffer list or to any buffer in it (another tensor, a
view's copy, a cache, a pending trace, a user's alias). That is checked by reference counts, so whatever
holds them, known here or not, keeps them from being donated. When in doubt, nothing is donated.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..sharding import OpSharding
from ._trace import Trace

__all__ = ["ENV_VARIABLE", "donated_inputs", "donation_enabled", "set_donation"]

#: The environment variable that turns donation off (``0``) or on (``1``); on by default.
ENV_VARIABLE = "PJRT_PLUGINS_DONATE"

_switch: list[bool | None] = [None]  # set_donation's choice; None: the environment variable decides

def set_donation(enabled: bool) -> None:
    """Turn buffer donation on or off for the programs compiled from now on (default: on, unless
    ``PJRT_PLUGINS_DONATE=0``).

    With donation, a value a step replaces in place (a parameter, an optimizer state) is written into
    the memory of its old value, as jax's ``donate_argnums`` does; results are the same either way.

    Example::

        xs.set_donation(False)   # every step allocates new buffers for its results
    """
    _switch[0] = bool(enabled)


def donation_enabled() -> bool:
    """Whether programs donate the inputs they replace (:func:`set_donation`, else ``PJRT_PLUGINS_DONATE``)."""
    chosen = _switch[0]
    if chosen is not None:
        return chosen
    raw = os.environ.get(ENV_VARIABLE, "").strip().lower()
    if raw in ("", "1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{ENV_VARIABLE}={os.environ[ENV_VARIABLE]!r} is not a boolean: set it to 0 (or false, no, "
                     "off) to turn buffer donation off, or 1 to keep it on")


def donated_inputs(trace: Trace, holders: dict[int, list[Any]], outputs: list[int], pins: dict[int, OpSharding],
                   columns: list[Any], fits: dict[tuple[int, int], bool] | None = None) -> tuple[tuple[int, int], ...]:
    """``((input position, output position), ...)``: the inputs whose buffers the program may write its
    outputs into. An input qualifies when the tensor it was read from holds output ``j`` now (an in-place
    update), with the same shape, dtype and layout (the output is pinned to the input's sharding), and no
    other object refers to its buffers.

    ``fits`` remembers, per ``(input, output)``, whether their shape, dtype and layout match: that depends only
    on the trace's step and pins (the program's key), so the caller keeps one per key and passes it again."""
    if not donation_enabled():
        return ()
    if fits is None:
        fits = {}
    out_of: dict[int, int] = {}
    for j, index in enumerate(outputs):
        for data in holders[index]:
            out_of.setdefault(data.id, j)
    if not out_of:
        return ()
    pairs: list[tuple[int, int]] = []
    taken: set[int] = set()
    outs = trace.outs
    inputs = trace.inputs
    twin = _Twins()
    for k in range(len(inputs)):
        source = inputs[k]
        found = out_of.get(source.data_id)
        if found is None or found in taken:
            continue
        j = found
        fit = fits.get((k, j))
        if fit is None:
            index = outputs[j]
            fit = fits[(k, j)] = outs[index] == ("T", source.shape, source.dtype) and pins.get(index) == source.sharding
        if not fit:
            continue
        if columns[k] is not source.buffers or not twin.unshared(source):
            continue
        pairs.append((k, j))
        taken.add(j)
    return tuple(pairs)


class _Twins:
    """Objects held exactly as an unshared input, its buffer list and its buffers are, whose reference
    counts the input's are compared with (what ``sys.getrefcount`` reports differs between Pythons)."""

    def __init__(self) -> None:
        self.inputs = [object()]  # as trace.inputs holds a TraceInput
        self.lists = [[object()]]  # as a TraceInput holds its buffer list ...
        self.columns = [self.lists[0]]  # ... and the argument columns too

    def unshared(self, source: Any) -> bool:
        """Nothing but the trace (its input, the argument columns) refers to ``source`` or its buffers.
        Each object compared is held by as many names here and in the caller as its twin."""
        twin = self.inputs[0]
        caller_name = twin  # noqa: F841 - as the caller's loop variable holds ``source``
        if _more(source, twin):
            return False
        buffers = source.buffers
        twin_list = self.lists[0]
        if _more(buffers, twin_list):
            return False
        twin_buffer = twin_list[0]
        for buf in buffers:
            if _more(buf, twin_buffer):
                return False
        return True


def _more(obj: Any, twin: Any) -> bool:
    """``obj`` has more references than ``twin``."""
    return sys.getrefcount(obj) > sys.getrefcount(twin)
