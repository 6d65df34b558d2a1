"""Materialization: the pending trace becomes one program (from the compile cache, or lowered and compiled
from its torch.fx graph) and runs on every device; the tensors it feeds then hold device buffers.

Never records ops (``_record``) and never compiles itself (the execution layer does).
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
import torch.fx as fx

from ...errors import PjrtError, VirtualDeviceError
from ..devices import VirtualDevice, count, rng_keys_tensor, virtual_device
from ..execution import (
    CompiledProgram,
    execute_program,
    lowering_options,
    parameter_shardings,
    plugin_identity,
    program_for,
)
from ..sharding import OpSharding
from ..transport import TensorData, TensorState, reshard_buffers, upload_host_tensor
from ._closures import run_step_closures
from ._donation import donated_inputs
from ._output_specs import out_meta
from ._manual import is_region_value
from ._record import key_value, raise_stale, spec_token
from ._split import split_off_rest
from ._state import ENGINE
from ._trace import GETITEM, INPUT, LazyValue, Trace

logger = logging.getLogger(__name__)

__all__ = ["RunRecord", "build_graph", "last_run_timings", "live_outputs", "materialize", "output_pins",
           "program_for_run", "realign_inputs", "run_whole", "store_results", "sync"]

_LAZY = TensorState.LAZY
_FITS_KEPT = 4096  # keys whose donation fits are remembered (ENGINE.programs.donation_fits)


def sync(wait: bool = True) -> None:
    """Run everything recorded so far (PyTorch/XLA's ``mark_step``); results stay on the devices.

    Call it once per training step: the step's operators become one program, compiled on
    the first step and taken from the cache afterwards. Every pending tensor becomes device
    data laid out as the partitioner chose (see its ``sharding_spec``). ``.cpu()``,
    ``.item()``, printing and ``local_shards`` run pending work too. ``wait`` is accepted
    for PyTorch/XLA compatibility; execution is synchronous.

    Example::

        loss = F.mse_loss(model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
        xs.sync()                       # was: xm.mark_step()
        model[0].weight.sharding_spec   # the layout it keeps across steps

    Then the step closures queued with ``xm.add_step_closure`` run.
    """
    with ENGINE.lock:
        trace = ENGINE.trace
        if trace is not None and trace.ops > 0:
            # A trace carried over from a partial run may hold dead entries of another length: run the live part.
            if not (trace.carried and _run_part(trace, sorted(live_outputs(trace)))):
                _run(trace)
    run_step_closures()  # outside the lock: closures read tensors, maybe from other threads


def materialize(datas: Sequence[TensorData]) -> None:
    """Bring pending ``datas`` to the DEVICE state: runs the pending graph once, all of it, except the cheap
    rearranging ops no requested value needs, which stay pending (``_split``)."""
    with ENGINE.lock:
        for data in datas:
            if data.state is not _LAZY:
                continue
            value: LazyValue = data.lazy
            trace = value.trace
            if trace.done or trace.error is not None:
                raise_stale(value)
            wanted = [d.lazy.index for d in datas if d.state is _LAZY and d.lazy.trace is trace]
            if not _run_part(trace, wanted):
                _run(trace)


def _run_part(trace: Trace, wanted: list[int]) -> bool:
    """Run only what ``wanted`` needs when the rest is cheap; the rest becomes the pending trace. False when
    the whole trace should run."""
    holders = live_outputs(trace)
    parts = split_off_rest(trace, wanted, holders)
    if parts is None:
        return False
    first, make_rest = parts
    was_current = ENGINE.trace is trace
    if was_current:
        ENGINE.trace = None
    trace.done = True
    try:
        _run(first)
    except BaseException as exc:
        trace.error = exc  # the rest's tensors still hold values of this trace: they raise with the cause
        raise
    rest = make_rest()
    if rest is not None and was_current and ENGINE.trace is None:
        ENGINE.trace = rest
    return True


def _run(trace: Trace) -> RunRecord | None:
    if ENGINE.trace is trace:
        ENGINE.trace = None  # ops recorded from here on go to a new trace
    trace.done = True
    count("ops_recorded", trace.ops)
    try:
        return _execute(trace)
    except BaseException as exc:
        trace.error = exc
        raise


def run_whole(trace: Trace) -> RunRecord | None:
    """Run all of the pending ``trace``, as ``sync`` does, and say how it ran (``_replay`` records that)."""
    with ENGINE.lock:
        return _run(trace)


def _scalar_buffers(values: list[float], vd: VirtualDevice) -> list[Any]:
    """The replicated float64 buffers holding ``values``; a step whose scalars did not change (a constant
    learning rate) reuses the last ones, since programs never write their inputs."""
    key = tuple(values)
    last = ENGINE.last_scalars
    if last is not None and last[0] == key and last[1] == vd.generation:
        return last[2]
    buffers = upload_host_tensor(torch.tensor(key, dtype=torch.float64), None, vd)
    ENGINE.last_scalars = (key, vd.generation, buffers)
    return buffers


def live_outputs(trace: Trace) -> dict[int, list[TensorData]]:
    """The entries some live tensor still holds, with those tensors."""
    holders: dict[int, list[TensorData]] = {}
    for ref in trace.values:
        data = ref()
        if data is None or data.state is not _LAZY:
            continue
        value = data.lazy
        if value.trace is not trace:
            continue
        held = holders.get(value.index)
        if held is None:
            holders[value.index] = [data]
        elif all(d is not data for d in held):
            held.append(data)
    return holders


def build_graph(trace: Trace, outputs: list[int], pins: dict[int, OpSharding],
                donated: tuple[tuple[int, int], ...] = ()) -> fx.Graph:
    """The torch.fx graph of ``trace``'s entries (on a compile-cache miss only): inputs are its placeholders,
    ``outputs`` its results, ``pins`` its sharding constraints, ``donated`` its ``(input, output)`` aliases."""
    graph = fx.Graph()
    nodes: list[fx.Node] = []
    inputs = iter(trace.inputs)
    aliases = dict(donated)
    placeholders = 0
    scalars = trace.scalars
    rng_rows = 0
    for entry, out in zip(trace.entries, trace.outs):
        kind = entry[0]
        if kind == INPUT:
            source = next(inputs)
            node = graph.placeholder(f"in{len(nodes)}")
            node.meta["sharding"] = source.sharding
            if placeholders in aliases:
                node.meta["aliasing_output"] = aliases[placeholders]
            placeholders += 1
            if source.mesh is not None:  # the lowering's Shardy mesh takes its axis names
                mesh = source.mesh
                node.meta["mesh"] = (mesh.mesh_shape, mesh.axis_names, tuple(mesh.device_ids.tolist()))
        elif kind == GETITEM:
            node = graph.call_function(operator.getitem, (nodes[entry[1]], entry[2]), name="getitem")
        else:
            info = ENGINE.ops_by_id[kind]
            assert info is not None
            args = tuple(key_value(k, nodes, scalars) for k in entry[1])
            kwargs = {name: key_value(k, nodes, scalars) for name, k in entry[2]}
            node = graph.call_function(info.func, args, kwargs, name=info.node_name)
            if info.random:
                node.meta["rng_key"] = rng_rows
                rng_rows += 1
        meta = out_meta(out)
        node.meta["val"] = tuple(meta) if isinstance(meta, list) else meta
        nodes.append(node)
    for index, spec in pins.items():
        nodes[index].meta["sharding"] = spec
    if scalars:
        pool = graph.placeholder("scalars")
        pool.meta.update(val=torch.empty(len(scalars), dtype=torch.float64, device="meta"),
                         sharding=OpSharding.replicated(), scalar_pool=True)
    if rng_rows:
        keys = graph.placeholder("rng_keys")
        keys.meta.update(val=torch.empty(rng_rows, 2, dtype=torch.uint64, device="meta"),
                         sharding=OpSharding.replicated(), rng_keys=True)
    graph.output(tuple(nodes[i] for i in outputs))
    return graph


def output_pins(trace: Trace, holders: dict[int, list[TensorData]], outputs: list[int]) -> dict[int, OpSharding]:
    """The trace's sharding constraints, plus the sharding an output's holder keeps (``keep_sharding``)."""
    pins = dict(trace.pins)
    for index in outputs:
        if index not in pins:
            for data in holders[index]:
                kept = data.lazy.keep_sharding
                if kept is not None:
                    pins[index] = kept
                    break
    return pins


def realign_inputs(program: CompiledProgram, trace: Trace, columns: list[Any], vd: VirtualDevice) -> None:
    """Lay out again the inputs the compiled program wants in another sharding than the one they have
    (positions kept per program key in ``ENGINE.realign_positions``: usually none)."""
    positions = ENGINE.realign_positions.get(program.key)
    if positions == []:
        return
    inputs = trace.inputs
    wanted = parameter_shardings(program)
    if positions is None:
        positions = [] if wanted is None else [i for i, source in enumerate(inputs)
                                               if i < len(wanted) and wanted[i] != source.sharding]
        ENGINE.realign_positions[program.key] = positions
    for i in positions:
        source = inputs[i]
        assert wanted is not None
        columns[i] = reshard_buffers(columns[i], source.shape, source.dtype, source.sharding, wanted[i], vd)


def last_run_timings() -> dict[str, float]:
    """Where the last materialization's time went: finding its program (``key``), executing it (``execute``)
    and storing its results (``after``), in seconds."""
    return dict(ENGINE.last_timings)


class RunRecord(NamedTuple):
    """How a trace ran: its live outputs and their holders, sharding pins, program key (without the donation
    part), donated ``(input, output)`` pairs and program."""

    outputs: list[int]
    holders: dict[int, list[TensorData]]
    pins: dict[int, OpSharding]
    base: tuple
    donated: tuple[tuple[int, int], ...]
    program: CompiledProgram


def _execute(trace: Trace) -> RunRecord | None:
    t0 = time.perf_counter()
    holders = live_outputs(trace)
    if not holders:
        return None
    outputs = sorted(holders)
    pins = output_pins(trace, holders, outputs)
    vd = virtual_device()
    if any(source.generation != vd.generation for source in trace.inputs):
        raise VirtualDeviceError("an input of the pending graph lives on a virtual device that was replaced; "
                                 "move it to pjrt again from a CPU copy")
    columns = [source.buffers for source in trace.inputs]  # no name left holding an input (see _donation)
    if trace.scalars:
        columns.append(_scalar_buffers(trace.scalars, vd))
    if trace.rng:
        columns.append(upload_host_tensor(rng_keys_tensor(trace.rng), None, vd))
    options = lowering_options(vd)
    # The step the trace ended on stands for its whole sequence of entries (see the note on recording).
    base = (trace.cursor, tuple(outputs), tuple(sorted((i, spec_token(s)) for i, s in pins.items())), options,
            plugin_identity(vd))
    refused = ENGINE.programs.donation_refused
    donated: tuple[tuple[int, int], ...] = ()
    if base not in refused:
        fits = ENGINE.programs.donation_fits
        known = fits.get(base)
        if known is None:
            if len(fits) >= _FITS_KEPT:  # a bound like the compile cache's: start again rather than grow
                fits.clear()
            known = fits[base] = {}
        donated = donated_inputs(trace, holders, outputs, pins, columns, known)
    program, donated = program_for_run(trace, base, outputs, pins, donated, vd, options)
    realign_inputs(program, trace, columns, vd)
    spent = [columns[k] for k, _ in donated]  # the plugin owns those buffers' memory: freed by the run
    t1 = time.perf_counter()
    results = execute_program(program, columns, vd, spent)
    t2 = time.perf_counter()
    for k, _ in donated:
        trace.inputs[k].buffers = []
    store_results(trace, program, outputs, [holders[index] for index in outputs], results, vd, len(donated))
    ENGINE.last_timings.update(key=t1 - t0, execute=t2 - t1, after=time.perf_counter() - t2)
    logger.debug("ran %d ops with %d inputs and %d outputs", trace.ops, len(columns), len(outputs))
    return RunRecord(outputs, holders, pins, base, donated, program)


def program_for_run(trace: Trace, base: tuple, outputs: list[int], pins: dict[int, OpSharding],
                    donated: tuple[tuple[int, int], ...], vd: VirtualDevice, options: Any,
                    ) -> tuple[CompiledProgram, tuple[tuple[int, int], ...]]:
    """The program of ``trace`` under key ``base`` with the ``donated`` aliases, and the aliases it got: none when
    XLA refuses them (the refusal is remembered per key)."""
    try:
        return program_for((*base, donated), lambda: build_graph(trace, outputs, pins, donated), vd, options), donated
    except PjrtError as exc:
        if not donated or "alias" not in str(exc):
            raise
        # XLA gave an output another layout than its donated input has (it may change the layouts of outputs):
        # this program runs without donation from now on.
        logger.info("a program cannot donate its inputs (%s); it runs without donation", exc)
        ENGINE.programs.donation_refused.add(base)
        return program_for((*base, ()), lambda: build_graph(trace, outputs, pins), vd, options), ()


def store_results(trace: Trace, program: CompiledProgram, outputs: list[int], holders: list[list[TensorData]],
                  results: list[list[Any]], vd: VirtualDevice, donated: int) -> None:
    """Give output ``j``'s buffers to each TensorData of ``holders[j]``; ``donated``: how many inputs the run
    took over (their buffers were freed by it, see ``execute_program``'s ``spent``)."""
    generation = vd.generation
    single = program.lowered.num_partitions == 1
    for j, index in enumerate(outputs):
        spec = program.output_shardings[j]
        if single and is_region_value(trace, index):  # XLA reports one partition's outputs all replicated
            spec = OpSharding.manual()
        buffers = results[j]
        for data in holders[j]:
            data.set_device(buffers, spec, generation)
            if data.annotation is None:
                data.annotation = spec
    if donated:
        count("donated_buffers", donated * len(vd.devices))
