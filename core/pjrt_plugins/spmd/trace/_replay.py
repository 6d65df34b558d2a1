"""Recorded steps: the trace of one call of a step function, kept with where each of its inputs and results lives,
so that later calls run its program again without running the function's Python (``capture_step``).

Why: tracing a training step runs the model's, autograd's and the optimizer's Python every step (tens of
milliseconds for a small transformer), only to find the program it ran the step before. A step whose trace is
the same every call (checked on two calls in a row) is recorded once; a replay reads the same tensors' current
buffers, runs the program, and writes the results into the same tensors (or into new ones for what the function
returns), as ``torch.cuda.graphs`` replays a captured CUDA graph.

Only a step that computes everything on the devices can be recorded: a value read on the host, an op on the CPU
fallback, or data made on the host inside the step (``torch.tensor(list)``) would be fixed at its first value.
"""

from __future__ import annotations

import logging
import math
import time
import weakref
from collections.abc import Sequence
from typing import Any, Union

import torch

from ..devices import metrics, next_rng_keys, rng_keys_tensor, transfer_counters, virtual_device
from ..execution import CompiledProgram, execute_program, lowering_options
from ..transport import TensorData, TensorState, gather_shards, upload, upload_host_tensor
from ._donation import columns_unshared, donation_enabled
from ._materialize import RunRecord, program_for_run, realign_inputs, run_whole, store_results, sync
from ._state import ENGINE
from ._trace import Trace, TraceInput

logger = logging.getLogger(__name__)

#: Host data made inside a step (``torch.arange(n).to(device)``) is recorded up to this size: it is read back to
#: compare the calls, and replays keep its recorded value.
MADE_BYTES = 1 << 20

__all__ = ["CallWatch", "NotReplayable", "Recording", "ReplayMiss", "record_call", "replay", "watch_call"]

#: Where a recorded input or result lives: an argument (its position among the call's tensor arguments), a tensor
#: that lives on between calls (a weak reference: parameters, optimizer state), a result (``("result", r)``), or
#: for an input, host data made inside the step and moved to the devices (``("made", k)``: its recorded buffers).
Binding = Union[int, "weakref.ref[TensorData]", tuple[str, int]]


class NotReplayable(Exception):
    """Why a traced call cannot be recorded (a value read on the host, an op on the CPU fallback, ...)."""


class ReplayMiss(Exception):
    """A recorded step cannot run for these tensors (one changed shape, layout or device, or was freed)."""


class CallWatch:
    """The engine's counters before a traced call, to tell afterwards whether it can be recorded."""

    __slots__ = ("executions", "fallbacks", "downloads", "host_reads", "first_id")

    def __init__(self) -> None:
        done = metrics()
        self.executions = done.executions
        self.fallbacks = done.fallbacks
        self.downloads = transfer_counters().downloads
        self.host_reads = ENGINE.host_reads
        self.first_id = TensorData((), torch.float32).id  # data made from here on was made inside the call

    def refusal(self) -> str | None:
        """Why the call that ran since cannot be recorded, or None."""
        done = metrics()
        if done.executions != self.executions:
            return ("a program ran inside the step: it reads a value on the host (.item(), .tolist(), print, "
                    "a branch on a tensor), so its Python depends on values only known by running it")
        if done.fallbacks != self.fallbacks:
            return "an op of the step ran on the CPU fallback, which computes on the host"
        if transfer_counters().downloads != self.downloads or ENGINE.host_reads != self.host_reads:
            return "the step copies a device value to the host (.item(), .cpu(), print)"
        return None


def watch_call() -> CallWatch:
    """Run what is pending (a recorded step holds only its own ops), then count."""
    sync()
    return CallWatch()


class Recording:
    """One call of a step: its trace (without buffers), program and the bindings of its inputs and results.

    ``signature`` is what must be equal for two calls to be the same step: the sequence of ops (the prefix tree
    node the trace ended on), its run-time scalars, random ops, pins, outputs, and the bindings.
    """

    __slots__ = ("trace", "outputs", "pins", "base", "donated", "program", "undonated", "inputs", "made", "holders",
                 "results", "scalar_buffers", "generation", "signature")

    def __init__(self, trace: Trace, run: RunRecord, inputs: list[Binding], holders: list[list[Binding]],
                 results: int, scalar_buffers: list[Any] | None, generation: int, tokens: tuple) -> None:
        self.trace = trace
        self.outputs = run.outputs
        self.pins = run.pins
        self.base = run.base
        self.donated = run.donated
        self.program = run.program
        self.undonated: CompiledProgram | None = None if run.donated else run.program
        self.inputs = inputs
        #: The buffers of the inputs made on the host inside the step (the same contents in the calls compared).
        self.made = {k: trace.inputs[k].buffers for k, b in enumerate(inputs) if isinstance(b, tuple)}
        self.holders = holders
        self.results = results
        self.scalar_buffers = scalar_buffers
        self.generation = generation
        self.signature = (run.base, run.donated, tuple(trace.scalars), len(trace.rng), tokens)


def record_call(watch: CallWatch, args: Sequence[TensorData | None], results: Sequence[TensorData]) -> Recording:
    """Run the call's pending trace as ``sync`` would, and record it; raise NotReplayable (after running it) when it
    cannot be replayed. ``args`` / ``results``: the data of the call's tensor arguments and returned tensors."""
    refusal = watch.refusal()
    trace = ENGINE.trace
    if refusal is None and (trace is None or trace.ops == 0):
        refusal = "the step computes nothing on the devices"
    if refusal is None and trace is not None and trace.carried:
        refusal = "the step runs a part of its work early (a value read on the host)"
    if refusal is not None:
        sync()
        raise NotReplayable(refusal)
    assert trace is not None
    for r, data in enumerate(results):
        if data.id < watch.first_id:
            sync()
            raise NotReplayable(f"returned tensor {r} is an argument or a tensor made before the step: return only "
                                "tensors the step computes")
    arg_position = {id(d): p for p, d in enumerate(args) if d is not None}
    result_position = {id(d): r for r, d in enumerate(results)}
    inputs = _input_bindings(trace, arg_position, watch.first_id)  # a function: no name here holds an input
    frozen = _frozen(trace)
    for k, binding in enumerate(inputs):
        if isinstance(binding, tuple):
            frozen.inputs[k].buffers = trace.inputs[k].buffers
    scalars = list(trace.scalars)
    # host data made inside the step is compared by its contents: equal in the calls compared, it is a constant
    input_tokens = tuple(b if isinstance(b, int) else _contents(s) if isinstance(b, tuple) else ("lasting", s.data_id)
                         for b, s in zip(inputs, frozen.inputs))
    run = run_whole(trace)
    if run is None:
        raise NotReplayable("the step leaves no value on the devices that anything still holds")
    for r, data in enumerate(results):
        if not any(d is data for index in run.outputs for d in run.holders[index]):
            raise NotReplayable(f"returned tensor {r} is not computed by the step (return what it computes, or "
                                "return nothing for tensors it only reads)")
    holders: list[list[Binding]] = []
    tokens: list[Any] = [input_tokens]
    for index in run.outputs:
        bound: list[Binding] = []
        for data in run.holders[index]:
            if id(data) in arg_position:
                bound.append(arg_position[id(data)])
                tokens.append(arg_position[id(data)])
            elif id(data) in result_position:
                bound.append(("result", result_position[id(data)]))
                tokens.append(("result", result_position[id(data)]))
            else:
                bound.append(weakref.ref(data))
                # a tensor made inside the step and kept outside its results is a new one each traced call
                tokens.append(("made", index) if data.id >= watch.first_id else ("lasting", data.id))
        holders.append(bound)
    vd = virtual_device()
    scalar_buffers = upload_host_tensor(torch.tensor(scalars, dtype=torch.float64), None, vd) if scalars else None
    return Recording(frozen, run, inputs, holders, len(results), scalar_buffers, vd.generation, tuple(tokens))


def _input_bindings(trace: Trace, arg_position: dict[int, int], first_id: int) -> list[Binding]:
    """Where each input of ``trace`` is read from: an argument's position, a lasting tensor (weakly), or, for an
    input made on the host inside the step, its recorded buffers (``("made", k)``)."""
    inputs: list[Binding] = []
    for source in trace.inputs:
        read = source.source()
        if read is not None and id(read) in arg_position:
            inputs.append(arg_position[id(read)])
        elif source.data_id >= first_id:  # host data made inside (an arange moved over, an empty cache)
            if math.prod(source.shape) * source.dtype.itemsize > MADE_BYTES:
                sync()
                raise NotReplayable(f"the step moves more than {MADE_BYTES} bytes of data it made on the host to "
                                    "the devices: make it with device ops or pass it as an argument")
            inputs.append(("made", len(inputs)))
        elif read is None:
            sync()
            raise NotReplayable("the step reads a tensor that is freed before it ends")
        else:
            inputs.append(source.source)
    return inputs


def replay(recording: Recording, args: Sequence[TensorData | None]) -> list[TensorData | None]:
    """Run ``recording`` again on the current buffers of its inputs (``args``: the new call's tensor arguments);
    returns the data of the results. Raises ReplayMiss, before running anything, when an input changed."""
    sync()
    with ENGINE.lock:
        t0 = time.perf_counter()
        vd = virtual_device()
        if vd.generation != recording.generation:
            raise ReplayMiss("the virtual device was replaced since the step was recorded")
        trace = recording.trace
        sources: list[TensorData | None] = []
        columns: list[Any] = []
        for k, binding in enumerate(recording.inputs):
            if isinstance(binding, tuple):
                sources.append(None)
                columns.append(recording.made[k])
                continue
            data = _resolve(binding, args)
            if data is None:
                raise ReplayMiss(f"input {k} of the recorded step was freed")
            if data.state is TensorState.HOST:  # a copy_ from the CPU left it on the host
                upload(data, data.annotation)
            if data.state is not TensorState.DEVICE:
                raise ReplayMiss(f"input {k} of the recorded step is not on the devices")
            expected = trace.inputs[k]
            if (data.shape != expected.shape or data.dtype != expected.dtype or data.sharding != expected.sharding
                    or data.generation != vd.generation):
                raise ReplayMiss(f"input {k} of the recorded step changed shape, dtype or layout since")
            sources.append(data)
            columns.append(data.buffers)
        if recording.scalar_buffers is not None:
            columns.append(recording.scalar_buffers)
        if trace.rng:
            columns.append(upload_host_tensor(rng_keys_tensor(next_rng_keys(len(trace.rng))), None, vd))
        program = recording.program
        donated = recording.donated
        if donated and not (donation_enabled() and columns_unshared(columns, [k for k, _ in donated])):
            program, donated = _undonated(recording, vd), ()
        realign_inputs(program, trace, columns, vd)
        spent = [columns[k] for k, _ in donated]
        t1 = time.perf_counter()
        results = execute_program(program, columns, vd, spent)
        t2 = time.perf_counter()
        del columns, sources, spent
        made: list[TensorData | None] = [None] * recording.results
        holders: list[list[TensorData]] = []
        for j, index in enumerate(recording.outputs):
            found = []
            for binding in recording.holders[j]:
                if isinstance(binding, tuple):  # a result: new data each call
                    _, shape, dtype = trace.outs[index]
                    data = made[binding[1]] = TensorData(shape, dtype)
                else:
                    data = _resolve(binding, args)
                if data is not None:  # None: a tensor the step kept outside its results was freed since
                    found.append(data)
            holders.append(found)
        for r, data in enumerate(made):
            if data is None:
                raise ReplayMiss(f"internal: result {r} of the recorded step has no output")
        store_results(trace, program, recording.outputs, holders, results, vd, len(donated))
        ENGINE.last_timings.update(key=t1 - t0, execute=t2 - t1, after=time.perf_counter() - t2)
        return made


def _resolve(binding: Binding, args: Sequence[TensorData | None]) -> TensorData | None:
    """The data an argument or lasting binding stands for in this call (None: freed since)."""
    if isinstance(binding, int):
        return args[binding]
    assert not isinstance(binding, tuple)
    return binding()


def _contents(source: TraceInput) -> tuple:
    """A recorded input made on the host inside the step, by value (read back once per traced call)."""
    assert source.buffers
    value = gather_shards(source.shape, source.dtype, source.sharding, source.buffers, virtual_device().device_ids)
    flat = torch.empty(value.numel(), dtype=value.dtype).copy_(value.reshape(-1))  # unit strides, even for 1 element
    return ("made", source.shape, str(source.dtype), flat.view(torch.uint8).numpy().tobytes())


def _undonated(recording: Recording, vd: Any) -> CompiledProgram:
    """The recorded step's program without buffer donation (someone else still holds a donated buffer)."""
    if recording.undonated is None:
        recording.undonated, _ = program_for_run(recording.trace, recording.base, recording.outputs,
                                                  recording.pins, (), vd, lowering_options(vd))
    return recording.undonated


def _frozen(trace: Trace) -> Trace:
    """A copy of ``trace``'s entries and inputs without their buffers: enough to build its graph again."""
    copy = Trace.__new__(Trace)
    copy.entries = trace.entries
    copy.outs = trace.outs
    copy.cursor = trace.cursor
    copy.inputs = [_bufferless(source) for source in trace.inputs]
    copy.input_ids = {}
    copy.scalars = list(trace.scalars)
    copy.rng = list(trace.rng)
    copy.values = []
    copy.pins = dict(trace.pins)
    copy.ops = trace.ops
    copy.error = None
    copy.done = True
    copy.carried = 0
    return copy


def _bufferless(source: TraceInput) -> TraceInput:
    copy = TraceInput.__new__(TraceInput)
    for name in TraceInput.__slots__:
        setattr(copy, name, getattr(source, name))
    copy.buffers = []
    copy.host = None
    return copy
