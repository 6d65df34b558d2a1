"""Running compiled programs on every device of the virtual device, with each device's buffers.

Never compiles (``_programs``) or records ops (the trace layer); ``run_graph`` is the whole path from
CPU tensors to CPU tensors, for tests, benchmarks and debugging.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx as fx

from ...errors import ExecutionStuckError, LoweringError
from ..devices import VirtualDevice, count, next_rng_keys, rng_keys_tensor, virtual_device
from ..sharding import OpSharding, parse_sharding
from ..transport import gather_shards, upload_host_tensor
from ._programs import CompiledProgram, compile_graph

__all__ = ["describe_program", "execute_program", "run_graph"]


def execute_program(program: CompiledProgram, inputs: Sequence[Sequence[Any]],
                    vd: VirtualDevice | None = None, spent: Sequence[Sequence[Any]] = ()) -> list[list[Any]]:
    """Run ``program``; ``inputs[i][ordinal]`` is input ``i``'s buffer on each device.

    Returns ``outputs[j][ordinal]``: output ``j``'s buffer on each device, laid out by
    ``program.output_shardings[j]``. The RNG key argument of a graph that had none is added
    here: keys of the device RNG stream drawn now, one per random op. ``spent``: columns of
    buffers (``spent[k][ordinal]``, the donated inputs) that the caller gives up: the run frees
    them, and their objects may come back as outputs (``Executable.execute``'s ``recycle``).
    """
    vd = vd if vd is not None else virtual_device()
    n_dev = len(vd.devices)
    columns = [list(col) for col in inputs]
    expected = program.num_inputs - (1 if program.uses_rng else 0)
    if len(columns) != expected:
        raise LoweringError(f"internal: the program takes {expected} inputs, got {len(columns)}")
    if program.uses_rng:
        keys = rng_keys_tensor(next_rng_keys(program.lowered.rng_keys))
        columns.append(upload_host_tensor(keys, None, vd))
    for i, col in enumerate(columns):
        if len(col) != n_dev or None in col:
            raise LoweringError(f"internal: input {i} is not on every device")
    by_ordinal = list(zip(*columns)) if columns else [()] * n_dev  # each device's arguments, transposed in C
    args = [by_ordinal[ordinal] for ordinal in program.device_order]
    recycle = None
    if spent:
        spent_by_ordinal = list(zip(*spent))
        recycle = [spent_by_ordinal[ordinal] for ordinal in program.device_order]
    t0 = time.perf_counter()
    try:
        outs = program.executable.execute(args, recycle=recycle)
    except ExecutionStuckError as exc:
        if hasattr(exc, "add_note"):  # Python 3.11+
            exc.add_note(f"in the SPMD program {describe_program(program)}")
        raise
    count("execute_seconds", time.perf_counter() - t0)
    count("executions")
    rows: list[Any] = [None] * n_dev  # each device's outputs, by ordinal
    for pos, ordinal in enumerate(program.device_order):
        rows[ordinal] = outs[pos]
    if not program.num_outputs:
        return []
    return [list(column) for column in zip(*rows)]  # transposed in C: about 950 buffers a training step


def describe_program(program: CompiledProgram) -> str:
    """``"<key> of 30 ops (aten.addmm x2, aten.mm x2, ...)"``: which traced program this is, for messages."""
    ops = sorted(program.lowered.ops.items(), key=lambda item: (-item[1], item[0]))
    shown = ", ".join(f"{name} x{n}" for name, n in ops[:4]) + (", ..." if len(ops) > 4 else "")
    return f"{program.key[:12]} of {sum(program.lowered.ops.values())} ops ({shown})"


def run_graph(
    graph: fx.Graph | fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    shardings: Sequence[OpSharding | str | None] | None = None,
    vd: VirtualDevice | None = None,
) -> tuple[list[torch.Tensor], CompiledProgram]:
    """Upload ``inputs`` with ``shardings``, run ``graph`` on every device, gather the outputs.

    Returns the global output tensors (CPU) and the compiled program (for its shardings).
    """
    vd = vd if vd is not None else virtual_device()
    g = graph.graph if isinstance(graph, fx.GraphModule) else graph
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise ValueError(f"the graph takes {len(placeholders)} inputs, got {len(inputs)}")
    specs: list[OpSharding] = []
    for i, node in enumerate(placeholders):
        s = shardings[i] if shardings is not None else None
        spec = parse_sharding(s) if isinstance(s, str) else (s or OpSharding.replicated())
        node.meta["sharding"] = spec
        specs.append(spec)
    program = compile_graph(g, vd)
    columns = [upload_host_tensor(t.detach().cpu(), spec, vd) for t, spec in zip(inputs, specs)]
    outs = execute_program(program, columns, vd)
    results = []
    for j, bufs in enumerate(outs):
        shape, dtype = program.lowered.output_shapes[j], program.lowered.output_dtypes[j]
        results.append(gather_shards(shape, dtype, program.output_shardings[j], bufs, vd.device_ids))
    return results, program
