"""Compile lowered graphs through the active plugin (cached by graph structure), run them, count it all.

Compiles with ``num_partitions`` = device count and SPMD partitioning on, reads back the
output shardings the partitioner chose, and executes with each device's shards. Never
records ops (that is ``_lazy``) and never gathers results to the host itself.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch
import torch.fx as fx
from torch.utils import _pytree as pytree

from ..errors import ExecutionStuckError, LoweringError
from ..runtime import CompileOptions
from . import _disk_cache
from .lowering import (
    LoweredModule,
    ScalarSlot,
    LoweringOptions,
    lower_graph,
    op_name,
    sharding_string,
)
from ._sharding import ShardingSpec, parse_sharding, parse_tuple_sharding

logger = logging.getLogger(__name__)

#: Compiled programs kept in memory (least recently used ones are dropped beyond this).
MEMORY_CACHE_SIZE = 256


# =====================================================================================
# metrics
# =====================================================================================


@dataclass(frozen=True)
class Metrics:
    """Counters of the execution engine since the last :func:`reset_metrics` (``xs.metrics()`` returns one).

    ``compiles``: programs compiled by the plugin; ``cache_hits``: compiles avoided by the
    in-memory cache; ``persistent_cache_hits``: executables loaded from the cache directory;
    ``executions``: programs run; ``ops_recorded``: ATen operators traced;
    ``bytes_uploaded`` / ``bytes_downloaded``: host<->device bytes over all devices (from
    the transfer counters); ``fallbacks`` / ``fallback_ops``: operators run on the CPU
    because :func:`~pjrt_plugins.spmd.set_cpu_fallback` is on (total, and per operator);
    ``lowering_seconds`` / ``compile_seconds`` / ``execute_seconds``: wall time per phase.
    A frozen snapshot: compare the fields of two to measure a stretch of work.

    Example::

        before = xs.metrics()
        train_step(); xs.sync()
        after = xs.metrics()
        after.compiles - before.compiles       # 0 once the step is compiled
        print(after)                           # the same text as after.report()
    """

    compiles: int = 0
    cache_hits: int = 0
    persistent_cache_hits: int = 0
    executions: int = 0
    bytes_uploaded: int = 0
    bytes_downloaded: int = 0
    fallbacks: int = 0
    ops_recorded: int = 0
    lowering_seconds: float = 0.0
    compile_seconds: float = 0.0
    execute_seconds: float = 0.0
    fallback_ops: dict[str, int] = field(default_factory=dict)

    def report(self) -> str:
        """A short text report, one counter per line."""
        lines = [
            f"compiles:              {self.compiles}",
            f"cache hits:            {self.cache_hits}",
            f"persistent cache hits: {self.persistent_cache_hits}",
            f"executions:            {self.executions}",
            f"ops recorded:          {self.ops_recorded}",
            f"bytes uploaded:        {self.bytes_uploaded:,}",
            f"bytes downloaded:      {self.bytes_downloaded:,}",
            f"cpu fallbacks:         {self.fallbacks}",
            f"lowering time:         {self.lowering_seconds:.3f} s",
            f"compile time:          {self.compile_seconds:.3f} s",
            f"execute time:          {self.execute_seconds:.3f} s",
        ]
        if self.fallback_ops:
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.fallback_ops.items()))
            lines.append(f"fallback ops:          {ops}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


class _Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, Any] = {}
        self.reset(baseline=False)

    def reset(self, baseline: bool = True) -> None:
        """Zero the counters; byte counts restart from the transfer counters' current totals."""
        with self.lock:
            self.values = {f.name: (0.0 if f.type == "float" else 0) for f in fields(Metrics) if f.name not in
                           ("bytes_uploaded", "bytes_downloaded", "fallback_ops")}
            self.values["fallback_ops"] = {}
            self.upload_base, self.download_base = _transfer_totals() if baseline else (0, 0)

    def add(self, name: str, amount: float = 1) -> None:
        with self.lock:
            self.values[name] += amount

    def add_fallback(self, op: str) -> None:
        with self.lock:
            self.values["fallbacks"] += 1
            ops = self.values["fallback_ops"]
            ops[op] = ops.get(op, 0) + 1

    def snapshot(self) -> Metrics:
        up, down = _transfer_totals()
        with self.lock:
            values = dict(self.values)
            values["fallback_ops"] = dict(values["fallback_ops"])
            # The transfer counters may have been reset since our baseline: then count from zero.
            up = up - self.upload_base if up >= self.upload_base else up
            down = down - self.download_base if down >= self.download_base else down
            return Metrics(bytes_uploaded=up, bytes_downloaded=down, **values)


def _transfer_totals() -> tuple[int, int]:
    from ._transfer import transfer_counters

    c = transfer_counters()
    return c.total_uploaded, c.total_downloaded


_counters = _Counters()


def metrics() -> Metrics:
    """A snapshot of the execution counters (compiles, cache hits, executions, bytes, fallbacks).

    Example (a training loop that repeats one step compiles it once)::

        import pjrt_plugins.spmd as xs
        xs.reset_metrics()
        for _ in range(10):
            loss = model(x).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
            xs.sync()
        m = xs.metrics()
        m.compiles, m.cache_hits, m.executions   # (1, 9, 10)
    """
    return _counters.snapshot()


def reset_metrics() -> None:
    """Zero the execution counters (the transfer counters are not touched).

    Byte counts restart from the transfer counters' totals at this moment.

    Example::

        xs.reset_metrics()
        xs.metrics().executions   # 0
    """
    _counters.reset()


def metrics_report() -> str:
    """:func:`metrics` as a short text report, one counter per line.

    Example::

        print(xs.metrics_report())
        # compiles:              1
        # cache hits:            9
        # executions:            10
        # ...
    """
    return metrics().report()


def count(name: str, amount: float = 1) -> None:
    """Add to one counter (used by the lazy tracer)."""
    _counters.add(name, amount)


def count_fallback(op: str) -> None:
    _counters.add_fallback(op)


# =====================================================================================
# the compile cache
# =====================================================================================


@dataclass
class CompiledProgram:
    """A compiled graph: the executable and what goes in and out of it.

    ``output_shardings`` are the shardings the partitioner chose for the outputs; the
    inputs' are ``lowered.input_shardings``.
    """

    key: str
    lowered: LoweredModule
    executable: Any
    output_shardings: list[ShardingSpec]
    device_order: list[int]  # ordinal of the device at each position of executable.addressable_devices
    from_disk: bool = False

    @property
    def num_inputs(self) -> int:
        """One per placeholder of the graph, then the RNG keys if ``uses_rng``."""
        return len(self.lowered.input_shardings)

    @property
    def uses_rng(self) -> bool:
        return self.lowered.uses_rng

    @property
    def num_outputs(self) -> int:
        return len(self.lowered.output_shapes)


class _ProgramCache:
    """The in-memory LRU of compiled programs, keyed by any hashable that determines the program.

    Keys are compared for equality, not only hashed, so two graphs whose keys collide in
    their hash can never share a program.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.programs: OrderedDict[Hashable, CompiledProgram] = OrderedDict()

    def get(self, key: Hashable) -> CompiledProgram | None:
        with self.lock:
            program = self.programs.get(key)
            if program is not None:
                self.programs.move_to_end(key)
            return program

    def put(self, key: Hashable, program: CompiledProgram) -> None:
        with self.lock:
            self.programs[key] = program
            self.programs.move_to_end(key)
            while len(self.programs) > MEMORY_CACHE_SIZE:
                self.programs.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self.programs.clear()


_cache = _ProgramCache()
_last_program: CompiledProgram | None = None


def clear_compile_cache() -> None:
    """Forget every compiled program held in memory (the cache directory is kept).

    The next run of each graph compiles again (or loads it from :func:`set_cache_dir`'s
    directory). Useful to measure compile time, or to free the executables' memory.

    Example::

        xs.clear_compile_cache()
        y = (x @ w).relu(); xs.sync()
        xs.metrics().compiles   # one more than before
    """
    _cache.clear()


def compiled_programs() -> int:
    """How many compiled programs the in-memory cache holds."""
    return len(_cache.programs)


def last_program() -> CompiledProgram | None:
    """The program the last materialization ran (its ``lowered.text`` is the StableHLO), or None."""
    return _last_program


def lowering_options(vd: Any) -> LoweringOptions:
    """What the lowering takes from the active plugin (its gather factor, RNG default and StableHLO
    version) and from torch (the float32 matmul precision)."""
    plugin = vd.plugin
    version = None
    try:
        attrs = vd.client.library.attributes
        v = attrs.get("stablehlo_current_version")
        if v is not None:
            version = ".".join(str(int(p)) for p in v)
    except Exception as exc:  # noqa: BLE001 - a plugin without attributes gets jaxlib's own version
        logger.debug("no StableHLO version from the plugin: %s", exc)
    return LoweringOptions(
        num_partitions=len(vd.devices),
        dense_gather_factor=int(plugin.dense_gather_factor()),
        rng_algorithm=plugin.rng_default(),
        target_version=version,
        matmul_precision=torch.get_float32_matmul_precision(),
    )


def plugin_identity(vd: Any) -> tuple:
    """Everything about the plugin a compiled program depends on."""
    plugin = vd.plugin
    client = vd.client
    return (
        getattr(plugin, "name", None) or type(plugin).__name__,
        getattr(plugin, "distribution", None),
        getattr(plugin, "distribution_version", None),
        getattr(client, "platform_name", None),
        getattr(client, "platform_version", None),
        str(getattr(client.library, "path", "")),
        tuple(vd.device_assignment),
    )


def _const_repr(value: Any) -> Any:
    if isinstance(value, ScalarSlot):
        return ("slot", value.index)  # its value is an input, not part of the program
    if isinstance(value, float):
        return ("f", value.hex()) if math.isfinite(value) else ("f", repr(value))
    if isinstance(value, (bool, int, str, type(None))):
        return value
    if isinstance(value, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(value)
    if isinstance(value, ShardingSpec):
        return value.to_hlo()
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        return ("tensor", str(t.dtype), tuple(t.shape), hashlib.sha1(t.view(torch.uint8).numpy().tobytes()).hexdigest()
                if t.numel() else "")
    return repr(value)


def graph_signature(graph: fx.Graph) -> list:
    """The structure of ``graph``: ops, constants, shapes, dtypes and shardings, with nodes as positions."""
    index: dict[fx.Node, int] = {}
    parts: list = []
    for i, node in enumerate(graph.nodes):
        index[node] = i

        def ref(a: Any) -> Any:
            return ("%", index[a]) if isinstance(a, fx.Node) else _const_repr(a)

        val = node.meta.get("val")
        vals = pytree.tree_leaves(val) if val is not None else []
        meta = tuple((tuple(v.shape), str(v.dtype)) for v in vals if isinstance(v, torch.Tensor))
        sharding = sharding_string(node.meta.get("sharding"))
        if node.op == "get_attr":
            from .lowering._module import _fetch_attr

            parts.append(("const", _const_repr(_fetch_attr(node))))
            continue
        target = op_name(node.target) if node.op == "call_function" else str(node.op)
        args = pytree.tree_map(ref, (node.args, dict(sorted(node.kwargs.items()))))
        if node.op == "placeholder":
            args = None
        parts.append((node.op, target, args, meta, sharding))
    return parts


def program_key(graph: fx.Graph, options: LoweringOptions, identity: tuple, signature: Any = None) -> str:
    """A hex digest naming a compiled program (graph structure + lowering options + plugin).

    ``signature``, when given, stands for the graph's structure (the lazy tracer builds one
    while recording, which is cheaper than walking the graph).
    """
    structure = graph_signature(graph) if signature is None else ("recorded", signature)
    text = repr((structure, options, identity))
    return hashlib.sha256(text.encode()).hexdigest()


def compile_options(num_partitions: int, device_assignment: Sequence[int]) -> CompileOptions:
    """One replica, ``num_partitions`` partitions on ``device_assignment``, SPMD partitioning on.

    Outputs carry no sharding in the module, so ``allow_spmd_sharding_propagation_to_output``
    lets the partitioner choose their layouts (read back by :func:`read_output_shardings`).
    """
    return CompileOptions(
        num_replicas=1,
        num_partitions=num_partitions,
        use_spmd_partitioning=num_partitions > 1,
        device_assignment=[list(device_assignment)],
        allow_spmd_sharding_propagation_to_output=True,
    )


def compile_graph(graph: fx.Graph, vd: Any = None, *, options: LoweringOptions | None = None,
                  signature: Any = None) -> CompiledProgram:
    """The compiled program for ``graph`` on the virtual device (from the cache when it was seen before).

    ``signature`` (optional) is a hashable-by-repr description that determines the graph
    (see :func:`program_key`).
    """
    vd = vd if vd is not None else _virtual_device()
    options = options or lowering_options(vd)
    key = program_key(graph, options, plugin_identity(vd), signature)
    return program_for(key, lambda: graph, vd, options, name=key)


def program_for(key: Hashable, build_graph: Callable[[], fx.Graph], vd: Any, options: LoweringOptions, *,
                name: str | None = None) -> CompiledProgram:
    """The program cached in memory under ``key``; on a miss, ``build_graph()`` is lowered, then
    loaded from the cache directory (``_disk_cache``, keyed by the lowering) or compiled.

    ``key`` is any hashable that determines the graph together with ``options`` and the
    plugin (the tracer's is a tuple, so a hit costs a tuple hash and comparison, and the
    graph is never built then). ``name`` is the program's ``CompiledProgram.key`` (logs and
    per-program tables; default: :func:`program_key` of the built graph).
    """
    global _last_program
    program = _cache.get(key)
    if program is not None and not _executable_stale(program, vd):
        count("cache_hits")
    else:
        graph = build_graph()
        program = _compile(name or program_key(graph, options, plugin_identity(vd)), graph, options, vd)
        _cache.put(key, program)
    _last_program = program
    return program


def _executable_stale(program: CompiledProgram, vd: Any) -> bool:
    exe = program.executable
    return getattr(exe, "is_deleted", False) or getattr(exe, "client", vd.client) is not vd.client


def _compile(key: str, graph: fx.Graph, options: LoweringOptions, vd: Any) -> CompiledProgram:
    """Lower ``graph``; load the executable stored for that lowering, or compile (and store) it."""
    t0 = time.perf_counter()
    graph.eliminate_dead_code()  # keeps placeholders, so the argument list is unchanged
    lowered = lower_graph(graph, options)
    t1 = time.perf_counter()
    count("lowering_seconds", t1 - t0)
    compile_opts = compile_options(options.num_partitions, list(vd.device_assignment))
    identity = plugin_identity(vd)
    stored = _disk_cache.load_executable(vd.client, lowered.artifact, compile_opts, identity)
    if stored is not None:
        count("persistent_cache_hits")
        exe, shardings = stored
        return _finish_program(key, lowered, exe, vd, True, [parse_sharding(s) for s in shardings])
    exe = vd.client.compile(lowered.artifact, compile_opts)
    count("compile_seconds", time.perf_counter() - t1)
    count("compiles")
    logger.info("compiled a program of %d ops for %d devices in %.2f s", sum(lowered.ops.values()),
                options.num_partitions, time.perf_counter() - t0)
    program = _finish_program(key, lowered, exe, vd)
    _disk_cache.store_executable(vd.client, lowered.artifact, compile_opts, identity, exe,
                                 [s.to_hlo() for s in program.output_shardings])
    return program


def _finish_program(key: str, lowered: LoweredModule, exe: Any, vd: Any, from_disk: bool = False,
                    output_shardings: list[ShardingSpec] | None = None) -> CompiledProgram:
    n_out = len(lowered.output_shapes)
    if output_shardings is None:
        output_shardings = read_output_shardings(exe, n_out, lowered.num_partitions)
    position = {int(d.id): i for i, d in enumerate(vd.devices)}
    order = [position[int(d.id)] for d in exe.addressable_devices]
    return CompiledProgram(key, lowered, exe, output_shardings, order, from_disk)


def read_output_shardings(exe: Any, num_outputs: int, num_partitions: int) -> list[ShardingSpec]:
    """The shardings the SPMD partitioner chose for the outputs, from the optimized HLO module."""
    if num_partitions == 1:
        return [ShardingSpec.replicated()] * num_outputs
    try:
        code = exe.optimized_hlo_module()
    except NotImplementedError as exc:
        raise LoweringError(f"cannot read the output shardings the partitioner chose: {exc}") from exc
    from jaxlib import xla_client

    module = xla_client.hlo.HloModule.from_serialized_hlo_module_proto(code)
    proto = module.spmd_output_sharding
    text = str(xla_client.HloSharding.from_proto(proto))
    specs = parse_tuple_sharding(text)
    if len(specs) != num_outputs:
        if len(specs) == 1 and num_outputs > 1:
            specs = specs * num_outputs
        else:
            raise LoweringError(f"internal: the partitioner reports {len(specs)} output shardings for {num_outputs} outputs")
    return specs


def parameter_shardings(program: CompiledProgram) -> list[ShardingSpec] | None:
    """The shardings the compiled program wants its arguments in (from the optimized HLO module), or None.

    Usually those the module declared; XLA compiles some programs (an identity of an unevenly
    tiled argument) for other ones, and the arguments must then be laid out again. Read once
    per program.
    """
    cached = _parameter_shardings.get(program.key, _MISSING)
    if cached is not _MISSING:
        return cached
    specs = None
    if program.lowered.num_partitions > 1:
        try:
            from jaxlib import xla_client

            module = xla_client.hlo.HloModule.from_serialized_hlo_module_proto(
                program.executable.optimized_hlo_module())
            specs = [parse_sharding(str(xla_client.HloSharding.from_proto(p)))
                     for p in module.spmd_parameters_shardings] or None
        except Exception as exc:  # noqa: BLE001 - unknown: the runtime's own shape check still guards the call
            logger.debug("parameter shardings of program %s are unknown: %s", program.key[:12], exc)
    _parameter_shardings[program.key] = specs
    return specs


_MISSING = object()
_parameter_shardings: dict[str, Any] = {}


# =====================================================================================
# execution
# =====================================================================================

def manual_seed(seed: int) -> None:
    """Restart the device RNG stream from ``seed`` (the state lives with the device: ``_device.set_seed``)."""
    from ._device import set_seed

    set_seed(seed)


def rng_keys_tensor(keys: Sequence[tuple[int, int]]) -> torch.Tensor:
    """The ``uint64[n, 2]`` RNG key table of a program whose random ops drew ``keys`` ``(seed, offset)``."""
    from ._device import rng_key_rows

    return torch.from_numpy(rng_key_rows(list(keys)))


def execute_program(program: CompiledProgram, inputs: Sequence[Sequence[Any]], vd: Any = None) -> list[list[Any]]:
    """Run ``program``; ``inputs[i][ordinal]`` is input ``i``'s buffer on each device.

    Returns ``outputs[j][ordinal]``: output ``j``'s buffer on each device, laid out by
    ``program.output_shardings[j]``. The RNG key argument of a graph that had none is added
    here: keys of the device RNG stream drawn now, one per random op.
    """
    vd = vd if vd is not None else _virtual_device()
    n_dev = len(vd.devices)
    columns = [list(col) for col in inputs]
    expected = program.num_inputs - (1 if program.uses_rng else 0)
    if len(columns) != expected:
        raise LoweringError(f"internal: the program takes {expected} inputs, got {len(columns)}")
    if program.uses_rng:
        from ._device import next_rng_keys
        from ._transfer import upload_host_tensor

        keys = rng_keys_tensor(next_rng_keys(program.lowered.rng_keys))
        columns.append(upload_host_tensor(keys, None, vd))
    for i, col in enumerate(columns):
        if len(col) != n_dev or any(b is None for b in col):
            raise LoweringError(f"internal: input {i} is not on every device")
    args = [[col[ordinal] for col in columns] for ordinal in program.device_order]
    t0 = time.perf_counter()
    try:
        outs = program.executable.execute(args)
    except ExecutionStuckError as exc:
        exc.add_note(f"in the SPMD program {describe_program(program)}")
        raise
    count("execute_seconds", time.perf_counter() - t0)
    count("executions")
    result: list[list[Any]] = [[None] * n_dev for _ in range(program.num_outputs)]
    for pos, ordinal in enumerate(program.device_order):
        for j in range(program.num_outputs):
            result[j][ordinal] = outs[pos][j]
    return result


def describe_program(program: CompiledProgram) -> str:
    """``"<key> of 30 ops (aten.addmm x2, aten.mm x2, ...)"``: which traced program this is, for messages."""
    ops = sorted(program.lowered.ops.items(), key=lambda item: (-item[1], item[0]))
    shown = ", ".join(f"{name} x{n}" for name, n in ops[:4]) + (", ..." if len(ops) > 4 else "")
    return f"{program.key[:12]} of {sum(program.lowered.ops.values())} ops ({shown})"


def _virtual_device() -> Any:
    from ._device import virtual_device

    return virtual_device()


# -- a whole graph, from CPU tensors to CPU tensors (tests, benchmarks, debugging) ---------------


def run_graph(
    graph: fx.Graph | fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    shardings: Sequence[ShardingSpec | str | None] | None = None,
    vd: Any = None,
) -> tuple[list[torch.Tensor], CompiledProgram]:
    """Upload ``inputs`` with ``shardings``, run ``graph`` on every device, gather the outputs.

    Returns the global output tensors (CPU) and the compiled program (for its shardings).
    """
    from ._transfer import gather_shards, upload_host_tensor

    vd = vd if vd is not None else _virtual_device()
    g = graph.graph if isinstance(graph, fx.GraphModule) else graph
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise ValueError(f"the graph takes {len(placeholders)} inputs, got {len(inputs)}")
    specs: list[ShardingSpec] = []
    for i, node in enumerate(placeholders):
        s = shardings[i] if shardings is not None else None
        spec = parse_sharding(s) if isinstance(s, str) else (s or ShardingSpec.replicated())
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


__all__ = [
    "CompiledProgram",
    "Metrics",
    "clear_compile_cache",
    "compile_graph",
    "compiled_programs",
    "execute_program",
    "program_for",
    "last_program",
    "lowering_options",
    "manual_seed",
    "metrics",
    "metrics_report",
    "program_key",
    "reset_metrics",
    "rng_keys_tensor",
    "run_graph",
]
