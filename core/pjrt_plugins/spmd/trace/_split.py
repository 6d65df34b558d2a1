"""Running part of the pending trace: the ops a requested value needs, when all that is left is cheap.

Why: a value read on the host (``.item()``, ``bool()``, ``.cpu()``) runs the whole pending trace, and every
live tensor becomes an output of the program. ``generate`` reads a stop flag each token while ``input_ids``
grows by ``cat``: as an output (and the next token's input) it would make each token's program new. When the
ops no requested value needs only rearrange values (``cat``, slices, views, fills, small elementwise ops),
they stay pending in a new trace, the values they read from the part that ran becoming its inputs; the part
that runs then sees the same shapes every token. Anything heavier left over (a backward, an optimizer step)
runs now, in the same program, as before. Of the cheap rest, only what grows (a ``cat`` and what reads it)
waits; the rest's fixed-size values run now, as outputs (:func:`_fixed_size_ops`). A value the part that runs
needs, grown from a waiting ``cat`` (a padded attention mask), is computed on the host when it can be
(:func:`_host_frontier`), so the program reads it with the same shape every step.

Both parts are copies of the trace's entries (:func:`_replay`), walking the prefix tree from its root, so their
programs are keyed and cached as any trace's.
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

import torch

from ..lowering import ScalarSlot
from ..transport import TensorData
from ._host_compute import collect_keys as _collect
from ._host_compute import host_closure, host_entry, replay
from ._record import _append, _ref, pending_data
from ._state import ENGINE
from ._trace import GETITEM, INPUT, LazyValue, Step, Trace

logger = logging.getLogger(__name__)

__all__ = ["CHEAP_OPS", "split_off_rest"]

_CAT = torch.ops.aten.cat.default

#: Ops (by name) that may stay pending while the values they read are computed: they copy, select or fill
#: values, or compute elementwise on them, at a cost of a few operations per element.
CHEAP_OPS = frozenset({
    "alias", "arange", "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "cat", "clone", "copy", "eq",
    "expand", "fill", "full", "full_like", "ge", "gt", "le", "lift_fresh_copy", "logical_and", "logical_not",
    "logical_or", "lt", "masked_fill", "mul", "ne", "neg", "new_ones", "new_zeros", "ones", "ones_like", "permute",
    "reshape", "select", "slice", "squeeze", "sub", "t", "transpose", "unsqueeze", "view", "where", "zeros",
    "zeros_like", "_to_copy", "_unsafe_view", "add", "narrow", "detach",
})


def split_off_rest(trace: Trace, wanted: list[int], holders: dict[int, list[TensorData]]) -> tuple[Trace, Any] | None:
    """The part of ``trace`` that ``wanted`` (entry indices) needs, as a new trace holding the live values it
    computes, and the function that, once that part ran, makes the rest a new pending trace (None when nothing
    live is left); None when the rest is empty or not cheap (then the whole trace runs), except that a trace
    with entries carried over from an earlier split runs without those no live value needs. ``holders``: the
    live tensors of each entry."""
    if all(i in wanted for i in holders) and not trace.carried:  # nothing else is live: the whole trace runs
        return None
    deps = [_dependencies(entry) for entry in trace.entries]
    needed = _closure(trace, wanted, deps)
    hosted = _host_frontier(trace, needed, deps, holders)
    if hosted:  # computed on the host: the part that runs reads them as inputs, not what they grow from
        needed = _closure(trace, wanted, deps, stop=set(hosted))
    rest_roots = [i for i in holders if i not in needed and i not in hosted]
    if not rest_roots:
        # Entries carried over from an earlier part whose tensors died since (the last call's growing cat):
        # dropped, so that the program does not depend on how long that was.
        if not trace.carried or len(needed) == len(trace.entries):
            return None
        first_only, kept = _replay(trace, sorted(needed), hosted)
        for i in needed:
            for data in holders.get(i, ()):
                _repoint(data, first_only, kept[i])
        logger.debug("dropped %d dead entries of %d", len(trace.entries) - len(needed), len(trace.entries))
        return first_only, lambda: None
    rest = _closure(trace, rest_roots, deps, stop=needed | hosted.keys())
    for i in rest:
        kind = trace.entries[i][0]
        if kind > 0:
            info = ENGINE.ops_by_id[kind]
            packet = getattr(info.func, "overloadpacket", None) if info is not None else None
            if packet is None or packet.__name__ not in CHEAP_OPS:
                return None
    fixed = _fixed_size_ops(trace, rest, deps, holders)
    if fixed:  # they run now, in the part that runs; only what grows stays pending
        needed |= _closure(trace, fixed, deps, stop=needed | hosted.keys())
        rest_roots = [i for i in holders if i not in needed and i not in hosted]
        if not rest_roots:
            return None
        rest = _closure(trace, rest_roots, deps, stop=needed | hosted.keys())
    first, first_index = _replay(trace, sorted(needed), hosted)
    for i in needed:
        for data in holders.get(i, ()):
            _repoint(data, first, first_index[i])
    # Values of the first part the rest reads: outputs of the first part (new data for those no tensor holds).
    external: dict[int, TensorData] = dict(hosted)
    for i in rest:
        for j in deps[i]:
            if j in needed and j not in external and trace.entries[j][0] != INPUT:
                held = holders.get(j)
                external[j] = held[0] if held else pending_data(LazyValue(first, first_index[j]))

    def make_rest() -> Trace:
        second, second_index = _replay(trace, sorted(rest), external)
        second.carried = len(second.entries)
        for i in rest:
            for data in holders.get(i, ()):
                _repoint(data, second, second_index[i])
        logger.debug("ran %d of %d pending entries; %d stay pending", len(needed), len(trace.entries), len(rest))
        return second

    return first, make_rest


def _fixed_size_ops(trace: Trace, rest: set[int], deps: list[tuple[int, ...]],
                    holders: dict[int, list[TensorData]]) -> list[int]:
    """The ops of ``rest`` that read no ``cat`` of ``rest``, even through other ops, and whose tensors view no
    pending value of ``rest`` (a view read through a ``cat`` reads its operand, but keeps the ``cat`` as its base):
    their values keep their size from step to step, so they may be outputs of the part that runs.

    Why: left pending, they would begin the next step's trace, and that step's program would differ from the
    following ones whenever they differ from step to step: ``generate``'s first decode step would carry the
    prefill's leftovers (the cache length plus the prompt's length, the next position from the prompt's
    positions), the later steps a decode step's. Run with the values read, each step's program starts from the
    same inputs. A ``cat`` that grows every step, and what reads it, still waits.
    """
    entries = trace.entries
    grows: set[int] = set()
    fixed = []
    for i in sorted(rest):
        kind = entries[i][0]
        if kind == INPUT:
            continue
        if kind == GETITEM:
            if entries[i][1] in grows:
                grows.add(i)
            continue
        info = ENGINE.ops_by_id[kind]
        if (info is not None and info.func is _CAT) or any(d in grows for d in deps[i]) \
                or any(_views_pending(data, trace, rest) for data in holders.get(i, ())):
            grows.add(i)
        elif deps[i]:  # a factory (no tensor read) runs with the ops that read it, and waits with a cat
            fixed.append(i)
    return fixed


def _host_frontier(trace: Trace, needed: set[int], deps: list[tuple[int, ...]],
                   holders: dict[int, list[TensorData]]) -> dict[int, TensorData]:
    """The values of ``needed`` that grow from a ``cat`` carried over from an earlier part, computed on the host
    (``_host_compute``) where a program op that cannot be reads them: entry -> their host data; {} if none.

    Why: ``generate`` with a padded prompt appends a column of ones to the attention mask each token (a ``cat``
    that waits, see :func:`_fixed_size_ops`) and pads it to the cache's length for the model. Read by the
    model's program, the mask would be an input one column longer every token, and each token a new program.
    Its padded value has the same shape every token; computed on the host from the mask's pieces (a data move
    and integer ops, exact) and uploaded, it is an input of the same shape every token: one program.
    """
    if not trace.carried:
        return {}
    entries = trace.entries
    cats = [i for i in needed if i < trace.carried and entries[i][0] > 0
            and ENGINE.ops_by_id[entries[i][0]].func is _CAT]  # type: ignore[union-attr]
    if not cats:
        return {}
    readers: dict[int, list[int]] = {}
    for i in needed:
        for d in deps[i]:
            readers.setdefault(d, []).append(i)
    # From the carried cats to their readers, as far as the host can compute: the last such values are the frontier.
    on_host: dict[int, bool] = {}
    frontier = []
    seen = set(cats)
    todo = list(cats)
    while todo:
        i = todo.pop()
        if not _on_host(trace, i, on_host):
            continue
        after = readers.get(i, ())
        if entries[i][0] > 0 and any(not _on_host(trace, r, on_host) for r in after) \
                and all(data.view_of is None for data in holders.get(i, ())):
            frontier.append(i)
        for r in after:
            if r not in seen:
                seen.add(r)
                todo.append(r)
    if not frontier:
        return {}
    frontier.sort()
    order = host_closure(trace, frontier)
    values = replay(trace, order) if order is not None else None
    if values is None:
        return {}
    logger.debug("computed %d values that grow from carried entries on the host", len(frontier))
    hosted = {}
    for i in frontier:
        held = holders.get(i)
        if held:  # the tensors holding it become host data (uploaded once, when the part that runs reads it)
            for data in held:
                data.set_host(values[i])
            hosted[i] = held[0]
        else:
            hosted[i] = TensorData.from_host(values[i], copy=False)
    return hosted


def _on_host(trace: Trace, i: int, known: dict[int, bool]) -> bool:
    """Whether entry ``i`` and every entry it reads may be computed on the host (``known``: answers so far)."""
    hit = known.get(i)
    if hit is not None:
        return hit
    todo, order = [i], []
    while todo:  # the entries to answer
        j = todo.pop()
        if j in known:
            continue
        known[j] = False  # until answered below
        order.append(j)
        todo.extend(d for d in host_entry(trace, j)[2] if d not in known)
    for j in sorted(order):  # an entry reads only entries before it
        ok, _, found = host_entry(trace, j)
        known[j] = ok and all(known[d] for d in found)
    return known[i]


def _views_pending(data: TensorData, trace: Trace, rest: set[int]) -> bool:
    """Whether ``data`` is a view of a value of ``trace`` that stays pending (in ``rest``)."""
    base_ref = data.lazy.base
    base = base_ref() if base_ref is not None else None
    return base is not None and isinstance(base.lazy, LazyValue) and base.lazy.trace is trace \
        and base.lazy.index in rest


def _dependencies(entry: tuple) -> tuple[int, ...]:
    """The entries an entry reads."""
    kind = entry[0]
    if kind == INPUT:
        return ()
    if kind == GETITEM:
        return (entry[1],)
    found: list[int] = []
    for key in entry[1]:
        _collect(key, found)
    for _, key in entry[2]:
        _collect(key, found)
    return tuple(found)


def _closure(trace: Trace, roots: list[int], deps: list[tuple[int, ...]], stop: set[int] | None = None) -> set[int]:
    """``roots`` and every entry they read, transitively (not past ``stop``); an op's results come with it."""
    entries = trace.entries
    seen: set[int] = set()
    todo = [r for r in roots if not stop or r not in stop]
    while todo:
        i = todo.pop()
        if i in seen:
            continue
        seen.add(i)
        if entries[i][0] > 0:  # every result of a multi-output op: their positions follow it
            j = i + 1
            while j < len(entries) and entries[j][0] == GETITEM and entries[j][1] == i:
                if j not in seen:
                    todo.append(j)
                j += 1
        for d in deps[i]:
            if d not in seen and (stop is None or d not in stop):
                todo.append(d)
    return seen


def _replay(old: Trace, keep: list[int], external: dict[int, TensorData]) -> tuple[Trace, dict[int, int]]:
    """A new trace of ``old``'s entries ``keep`` (in order), reading ``external`` data where they read entries
    not kept; returns it and where each kept entry went.

    An input a kept op reads takes its place where that op first reads it, as when recorded afresh: a trace
    carried over from an earlier part may hold the input further back (the prompt, an operand of the last call's
    ``cat``s), and the program must not depend on that."""
    new = Trace(ENGINE.root)
    reads: list[int] = []
    for i in keep:
        entry = old.entries[i]
        if entry[0] > 0:
            for key in (*entry[1], *(k for _, k in entry[2])):
                _collect(key, reads)
    read = set(reads)
    index: dict[int, int] = {}
    ordinal = {i: n for n, i in enumerate(i for i, e in enumerate(old.entries) if e[0] == INPUT)}
    random_keys = {}
    if old.rng:
        randoms = [i for i, e in enumerate(old.entries) if e[0] > 0 and ENGINE.ops_by_id[e[0]].random]  # type: ignore
        random_keys = dict(zip(randoms, old.rng))

    def remap(key: Any) -> Any:
        kind = type(key)
        if kind is int:
            hit = index.get(key)
            if hit is not None:
                return hit
            if old.entries[key][0] == INPUT:  # an input both parts read: an input of this one too
                hit = index[key] = _append(new, old.entries[key], old.outs[key])
                new.inputs.append(old.inputs[ordinal[key]])
                return hit
            return _ref(new, external[key])
        if kind is not tuple or not key:
            return key
        tag = key[0]
        if tag is ScalarSlot:
            new.scalars.append(old.scalars[key[1]])
            return (ScalarSlot, len(new.scalars) - 1, *key[2:])  # an int or bool keeps its type
        if tag is list or tag is tuple:
            return (tag, tuple([remap(k) for k in key[1]]))
        return key

    for i in keep:
        entry, out = old.entries[i], old.outs[i]
        kind = entry[0]
        if kind == INPUT and i in read:
            continue  # placed where an op first reads it (remap)
        if kind == GETITEM:
            entry = (GETITEM, index[entry[1]], entry[2])
        elif kind == INPUT:
            new.inputs.append(old.inputs[ordinal[i]])
        else:
            entry = (kind, tuple([remap(k) for k in entry[1]]), tuple([(n, remap(k)) for n, k in entry[2]]))
            new.ops += 1
            if i in random_keys:
                new.rng.append(random_keys[i])
        if kind != GETITEM:  # GETITEM entries follow their op outside the prefix tree, as when recorded
            step = new.cursor.next.get(entry)
            if step is None:
                step = new.cursor.next[entry] = Step(out, entry)
                ENGINE.steps += 1
            new.cursor = step
            entry = step.entry  # type: ignore[assignment]
        index[i] = len(new.entries)
        new.entries.append(entry)
        new.outs.append(out)
    for key, i in old.input_ids.items():
        if i in index:
            new.input_ids[key] = index[i]
    for i, spec in old.pins.items():
        if i in index:
            new.pins[index[i]] = spec
    return new, index


def _repoint(data: TensorData, trace: Trace, index: int) -> None:
    """Make pending ``data`` hold entry ``index`` of ``trace`` (its base and pinned layout kept)."""
    old: LazyValue = data.lazy
    value = LazyValue(trace, index)
    value.base, value.view, value.keep_sharding = old.base, old.view, old.keep_sharding
    data.lazy = value
    trace.values.append(weakref.ref(data))

