"""Which values belong to a manual-sharding region: those derived from a region's input (``full_to_shard``) or
from data the devices hold as ``{manual}``, without leaving the region (``shard_to_full``) on the way.

Read from the pending trace's entries, so a collective outside a region is refused where it is called.
Looks only; records nothing.
"""

from __future__ import annotations

from typing import Any

from ..lowering._collectives import FULL_TO_SHARD, SHARD_TO_FULL
from ..transport import TensorData, TensorState
from ._op_info import op_info
from ._state import ENGINE
from ._trace import GETITEM, INPUT, Trace

__all__ = ["in_manual_region", "is_region_value"]

#: id(entry) -> (entry, whether its value is manual). An entry tuple is shared by every trace through its step
#: (the same prefix of entries), so the answer holds for all of them and is worked out once per step.
_known: dict[int, tuple[tuple, bool]] = {}
_KNOWN_LIMIT = 1 << 17


def in_manual_region(data: TensorData) -> bool:
    """Whether ``data``'s value is a value of a manual-sharding region (one value per device)."""
    if data.state is TensorState.DEVICE:
        return data.sharding is not None and data.sharding.is_manual
    if data.state is TensorState.HOST:
        return data.annotation is not None and data.annotation.is_manual
    value = data.lazy
    return _manual_at(value.trace, value.index)


def is_region_value(trace: Trace, index: int) -> bool:
    """Whether value ``index`` of ``trace`` is a region value (cheap when no region was ever recorded).

    For programs of one partition, whose outputs XLA reports replicated, even a region's: their data is
    marked ``{manual}`` all the same, so a region on a one-device mesh goes on after a sync.
    """
    if id(FULL_TO_SHARD) not in ENGINE.op_infos and not any(spec.is_manual for spec in ENGINE.spec_tokens):
        return False
    return _manual_at(trace, index)


def _tensor_refs(keys: Any, out: list[int]) -> None:
    """The entry indices among an op's argument keys (tensors are bare ints; constants are tagged tuples)."""
    for key in keys:
        if type(key) is int:
            out.append(key)
        elif type(key) is tuple and key and key[0] in (list, tuple):
            _tensor_refs(key[1], out)


def _manual_at(trace: Trace, index: int) -> bool:
    if len(_known) > _KNOWN_LIMIT:
        _known.clear()
    entries = trace.entries
    enter, leave = op_info(FULL_TO_SHARD).id, op_info(SHARD_TO_FULL).id
    manual_tokens = {token for spec, token in ENGINE.spec_tokens.items() if spec.is_manual}
    result: dict[int, bool] = {}
    stack: list[tuple[int, bool]] = [(index, False)]
    while stack:  # post-order over the entries the value derives from
        i, expanded = stack.pop()
        if i in result:
            continue
        entry = entries[i]
        hit = _known.get(id(entry))
        if hit is not None and hit[0] is entry:
            result[i] = hit[1]
            continue
        kind = entry[0]
        if kind == INPUT:
            manual = entry[3] in manual_tokens
        elif kind == enter:
            manual = True
        elif kind == leave:
            manual = False
        else:
            refs: list[int] = []
            if kind == GETITEM:
                refs.append(entry[1])
            else:
                _tensor_refs(entry[1], refs)
                _tensor_refs([k for _, k in entry[2]], refs)
            if not expanded:
                stack.append((i, True))
                stack.extend((j, False) for j in refs if j not in result)
                continue
            manual = any(result[j] for j in refs)
        result[i] = manual
        _known[id(entry)] = (entry, manual)
    return result[index]
