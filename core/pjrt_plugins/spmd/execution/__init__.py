"""Layer 5 of the SPMD engine: the compile cache (in memory and on disk) and execution on every device.

May use the layers below (sharding, device, transport, lowering) and the runtime; must not record ops
or make torch tensors on the ``pjrt`` device. Importing it loads jaxlib (through the lowering). Not a
public API: use ``pjrt_plugins.spmd``.
"""

from __future__ import annotations

from . import _disk_cache as disk_cache
from ._disk_cache import set_cache_dir
from ._execute import describe_program, execute_program, run_graph
from ._partitioner import (
    ENV_PARTITIONER,
    get_partitioner,
    partitioner_for,
    partitioner_mode,
    reset_partitioner_probes,
    set_partitioner,
    shardy_probe_result,
)
from ._program_key import compile_options, graph_signature, lowering_options, plugin_identity, program_key
from ._programs import (
    MEMORY_CACHE_SIZE,
    PROGRAMS,
    CompiledProgram,
    ProgramCache,
    clear_compile_cache,
    compile_graph,
    compiled_programs,
    last_program,
    parameter_shardings,
    program_for,
    read_output_shardings,
)

__all__ = [
    "ENV_PARTITIONER",
    "MEMORY_CACHE_SIZE",
    "PROGRAMS",
    "CompiledProgram",
    "ProgramCache",
    "clear_compile_cache",
    "compile_graph",
    "compile_options",
    "compiled_programs",
    "describe_program",
    "disk_cache",
    "execute_program",
    "get_partitioner",
    "graph_signature",
    "last_program",
    "lowering_options",
    "parameter_shardings",
    "partitioner_for",
    "partitioner_mode",
    "plugin_identity",
    "program_for",
    "program_key",
    "read_output_shardings",
    "reset_partitioner_probes",
    "run_graph",
    "set_cache_dir",
    "set_partitioner",
    "shardy_probe_result",
]
