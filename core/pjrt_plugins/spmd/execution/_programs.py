"""The compile cache: programs compiled through the active plugin, kept in memory (LRU) and on disk.

On a miss the graph is lowered, then loaded from the cache directory (``_disk_cache``) or compiled with
``num_partitions`` = device count and SPMD partitioning on; the output shardings the partitioner chose
are read back. Never records ops (the trace layer) and never runs programs (``_execute``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch.fx as fx
from jaxlib import xla_client

from ...errors import LoweringError
from ..devices import VirtualDevice, count, virtual_device
from ..lowering import LoweredModule, LoweringOptions, lower_graph
from ..sharding import OpSharding, parse_sharding, parse_tuple_sharding
from . import _disk_cache as disk_cache
from ._program_key import compile_options, lowering_options, plugin_identity, program_key

logger = logging.getLogger(__name__)

__all__ = [
    "MEMORY_CACHE_SIZE",
    "PROGRAMS",
    "CompiledProgram",
    "ProgramCache",
    "clear_compile_cache",
    "compile_graph",
    "compiled_programs",
    "last_program",
    "parameter_shardings",
    "program_for",
    "read_output_shardings",
]

#: Compiled programs kept in memory (least recently used ones are dropped beyond this).
MEMORY_CACHE_SIZE = 256

@dataclass
class CompiledProgram:
    """A compiled graph: the executable and what goes in and out of it.

    ``output_shardings`` are the shardings the partitioner chose for the outputs; the
    inputs' are ``lowered.input_shardings``.
    """

    key: str
    lowered: LoweredModule
    executable: Any
    output_shardings: list[OpSharding]
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


class ProgramCache:
    """The in-memory LRU of compiled programs, keyed by any hashable that determines the program.

    Keys are compared for equality, not only hashed, so two graphs whose keys collide in
    their hash can never share a program.
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.programs: OrderedDict[Hashable, CompiledProgram] = OrderedDict()
        #: The program the last materialization ran.
        self.last: CompiledProgram | None = None
        #: program key -> the argument shardings its executable wants (see :func:`parameter_shardings`).
        self.parameter_shardings: dict[str, list[OpSharding] | None] = {}
        #: keys of traces whose program XLA would not compile with donated inputs (the trace's ``_materialize``).
        self.donation_refused: set[Hashable] = set()
        #: per such key, which (input, output) pairs match in shape, dtype and sharding (the trace's ``_donation``).
        self.donation_fits: dict[Hashable, dict[tuple[int, int], bool]] = {}

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
        """Forget every program (and what was read from their executables)."""
        with self.lock:
            self.programs.clear()
            self.parameter_shardings.clear()
            self.donation_refused.clear()
            self.donation_fits.clear()
            self.last = None


#: The process's compiled programs (part of the engine's state: ``trace``'s ``ENGINE.reset()`` clears it).
PROGRAMS = ProgramCache()


def clear_compile_cache() -> None:
    """Forget every compiled program held in memory (the cache directory is kept).

    The next run of each graph compiles again (or loads it from :func:`set_cache_dir`'s
    directory). Useful to measure compile time, or to free the executables' memory.

    Example::

        xs.clear_compile_cache()
        y = (x @ w).relu(); xs.sync()
        xs.metrics().compiles   # one more than before
    """
    PROGRAMS.clear()


def compiled_programs() -> int:
    """How many compiled programs the in-memory cache holds."""
    return len(PROGRAMS.programs)


def last_program() -> CompiledProgram | None:
    """The program the last materialization ran (its ``lowered.text`` is the StableHLO), or None."""
    return PROGRAMS.last


def compile_graph(graph: fx.Graph, vd: VirtualDevice | None = None, *, options: LoweringOptions | None = None,
                  signature: Any = None) -> CompiledProgram:
    """The compiled program for ``graph`` on the virtual device (from the cache when it was seen before).

    ``signature`` (optional) is a hashable-by-repr description that determines the graph
    (see :func:`program_key`).
    """
    vd = vd if vd is not None else virtual_device()
    options = options or lowering_options(vd)
    key = program_key(graph, options, plugin_identity(vd), signature)
    return program_for(key, lambda: graph, vd, options, name=key)


def program_for(key: Hashable, build_graph: Callable[[], fx.Graph], vd: VirtualDevice, options: LoweringOptions, *,
                name: str | None = None) -> CompiledProgram:
    """The program cached in memory under ``key``; on a miss, ``build_graph()`` is lowered, then
    loaded from the cache directory (``_disk_cache``, keyed by the lowering) or compiled.

    ``key`` is any hashable that determines the graph together with ``options`` and the
    plugin (the tracer's is a tuple, so a hit costs a tuple hash and comparison, and the
    graph is never built then). ``name`` is the program's ``CompiledProgram.key`` (logs and
    per-program tables; default: :func:`program_key` of the built graph).
    """
    program = PROGRAMS.get(key)
    if program is not None and not _executable_stale(program, vd):
        count("cache_hits")
    else:
        graph = build_graph()
        program = _compile(name or program_key(graph, options, plugin_identity(vd)), graph, options, vd)
        PROGRAMS.put(key, program)
    PROGRAMS.last = program
    return program


def _executable_stale(program: CompiledProgram, vd: VirtualDevice) -> bool:
    exe = program.executable
    return getattr(exe, "is_deleted", False) or getattr(exe, "client", vd.client) is not vd.client


def _compile(key: str, graph: fx.Graph, options: LoweringOptions, vd: VirtualDevice) -> CompiledProgram:
    """Lower ``graph``; load the executable stored for that lowering, or compile (and store) it."""
    t0 = time.perf_counter()
    graph.eliminate_dead_code()  # keeps placeholders, so the argument list is unchanged
    lowered = lower_graph(graph, options)
    t1 = time.perf_counter()
    count("lowering_seconds", t1 - t0)
    compile_opts = compile_options(options.num_partitions, list(vd.device_assignment), lowered.partitioner == "shardy",
                                   lowered.pinned_outputs, len(lowered.output_shapes))
    identity = plugin_identity(vd)
    stored = disk_cache.load_executable(vd.client, lowered.artifact, compile_opts, identity)
    if stored is not None:
        count("persistent_cache_hits")
        exe, shardings = stored
        return _finish_program(key, lowered, exe, vd, True, [parse_sharding(s) for s in shardings])
    exe = vd.client.compile(lowered.artifact, compile_opts)
    count("compile_seconds", time.perf_counter() - t1)
    count("compiles")
    logger.info("compiled a program of %d ops for %d devices (%s) in %.2f s", sum(lowered.ops.values()),
                options.num_partitions, lowered.partitioner, time.perf_counter() - t0)
    program = _finish_program(key, lowered, exe, vd)
    disk_cache.store_executable(vd.client, lowered.artifact, compile_opts, identity, exe,
                                 [s.to_hlo() for s in program.output_shardings])
    return program


def _finish_program(key: str, lowered: LoweredModule, exe: Any, vd: VirtualDevice, from_disk: bool = False,
                    output_shardings: list[OpSharding] | None = None) -> CompiledProgram:
    n_out = len(lowered.output_shapes)
    if output_shardings is None:
        output_shardings = read_output_shardings(exe, n_out, lowered.num_partitions)
    position = {int(d.id): i for i, d in enumerate(vd.devices)}
    order = [position[int(d.id)] for d in exe.addressable_devices]
    return CompiledProgram(key, lowered, exe, output_shardings, order, from_disk)


def read_output_shardings(exe: Any, num_outputs: int, num_partitions: int) -> list[OpSharding]:
    """The shardings the SPMD partitioner chose for the outputs, from the optimized HLO module."""
    if num_partitions == 1:
        return [OpSharding.replicated()] * num_outputs
    try:
        code = exe.optimized_hlo_module()
    except NotImplementedError as exc:
        raise LoweringError(f"cannot read the output shardings the partitioner chose: {exc}") from exc
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


def parameter_shardings(program: CompiledProgram) -> list[OpSharding] | None:
    """The shardings the compiled program wants its arguments in (from the optimized HLO module), or None.

    Usually those the module declared; XLA compiles some programs (an identity of an unevenly
    tiled argument) for other ones, and the arguments must then be laid out again. Read once
    per program.
    """
    known = PROGRAMS.parameter_shardings
    if program.key in known:
        return known[program.key]
    specs = None
    if program.lowered.num_partitions > 1:
        try:
            module = xla_client.hlo.HloModule.from_serialized_hlo_module_proto(
                program.executable.optimized_hlo_module())
            specs = [parse_sharding(str(xla_client.HloSharding.from_proto(p)))
                     for p in module.spmd_parameters_shardings] or None
        except Exception as exc:  # noqa: BLE001 - unknown: the runtime's own shape check still guards the call
            logger.debug("parameter shardings of program %s are unknown: %s", program.key[:12], exc)
    PROGRAMS.parameter_shardings[program.key] = specs
    return specs
