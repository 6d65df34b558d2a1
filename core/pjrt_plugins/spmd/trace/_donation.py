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

__all__ = ["ENV_VARIABLE", "columns_unshared", "donated_inputs", "donation_enabled", "set_donation"]

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
    # Count references before any name here holds an input or a buffer (see _counts).
    input_counts = _counts(trace.inputs)
    list_counts = _counts(columns)
    pairs: list[tuple[int, int]] = []
    taken: set[int] = set()
    outs = trace.outs
    inputs = trace.inputs
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
        if not fit or columns[k] is not source.buffers:
            continue
        # The input is held by trace.inputs alone, its buffer list by it and the columns, each buffer by the list.
        if input_counts[k] > _HELD_ONCE or list_counts[k] > _HELD_ONCE + 1:
            continue
        if any(count > _HELD_ONCE for count in _counts(columns[k])):
            continue
        pairs.append((k, j))
        taken.add(j)
    return tuple(pairs)


def columns_unshared(columns: list[Any], positions: list[int]) -> bool:
    """Whether each input column at ``positions`` (the buffer list of a live tensor, passed to a program as it is)
    is held by that tensor and ``columns`` alone, and each of its buffers by the list alone: then the program may
    write into their memory (a replayed step, ``_replay``; the tensor takes the output's buffers)."""
    counts = _counts(columns)
    return all(counts[k] <= _HELD_ONCE + 1 and all(n <= _HELD_ONCE for n in _counts(columns[k])) for k in positions)


def _counts(items: list[Any]) -> list[int]:
    """The reference count of each item of ``items``, taken in C (``map``), so that no Python frame holds the
    items while they are counted. Counting through names would be fragile: a frame's locals can gain a second
    reference when something reads them (a debugger, a profiler, dynamo after a failed compile), and a count
    one too high only stops a donation, but a count one too low would donate a buffer someone still reads."""
    return list(map(sys.getrefcount, items))


#: What :func:`_counts` reports for an object that one list alone holds.
_HELD_ONCE = _counts([object()])[0]
