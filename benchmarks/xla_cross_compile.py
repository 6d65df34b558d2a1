"""The same StableHLO programs compiled by two XLAs: the CPU plugin's and jaxlib's, to tell program from compiler.

When our step's executable is slower than another system's (``hf_step.py``: ours against torchax), either our
program is worse or the plugin's XLA (xla-cpu-pjrt, PJRT C API 0.81) compiles it worse than jaxlib's. This script
runs each given module on both, on 8 CPU devices, in worker processes with rounds interleaved:

- "plugin XLA": compiled and run through ``pjrt_plugins`` on pjrt-plugin-cpu;
- "jaxlib XLA": compiled and run by jaxlib's own CPU client;
- "jaxlib XLA, no YNN fusions": the same with ``--xla_cpu_experimental_ynn_fusion_type=`` (jaxlib 0.10.2 fuses
  dots and reductions into YNNPACK kernels, which the plugin's XLA does not have).

The modules are StableHLO text for 8 partitions with GSPMD shardings (``mhlo.sharding``) or Shardy ones
(``sdy.sharding`` over an ``sdy.mesh`` in device order), such as those ``hf_step.py --dump-programs DIR`` writes (ours,
torchax's). Donation attributes are dropped, so the inputs (0.01
for floats, zeros otherwise; the values do not change the work) are reused across calls. ``--donate`` adds the
columns "plugin XLA, donating" and "jaxlib XLA, donating": the modules as they are (``tf.aliasing_output``: inputs
aliased to outputs, as jax donates a step's state), each call's aliased outputs fed back as the next call's inputs,
as a training loop does. Each cell is the median of ``--rounds`` rounds of ``--calls`` calls, each call waiting for
every output; a second table gives each call's CPU time (all threads of the worker process), which the machine's
load moves less than the wall time. Measures only.

``--plugin-only`` keeps the plugin's columns: an A/B of two programs on one compiler, without the load of the jaxlib
workers.

Run: python benchmarks/xla_cross_compile.py DIR/*.mlir [--rounds 5] [--calls 5] [--donate] [--plugin-only]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _measure import Table, Worker, serve_commands

DEVICES = 8
_DTYPES = {"f32": "float32", "f64": "float64", "f16": "float16", "bf16": "bfloat16", "i64": "int64", "i32": "int32",
           "i8": "int8", "i1": "bool", "ui8": "uint8", "ui32": "uint32", "ui64": "uint64"}


def prepare(text: str, donate: bool = False) -> str:
    """The module without its donation attributes (our timing loop reuses the inputs), or as it is (``donate``)."""
    if donate:
        return text
    donation = r"(tf\.aliasing_output = \d+ : i32|jax\.buffer_donor = true)"
    text = re.sub(rf"\s*\{{{donation}\}}", "", text)
    text = re.sub(rf",\s*{donation}", "", text)
    return re.sub(rf"\{{\s*{donation}\s*,\s*", "{", text)


def arguments(text: str) -> list[tuple[tuple[int, ...], str, str]]:
    """``(shape, numpy dtype name, HLO sharding)`` of each argument of ``@main``."""
    start = text.index("func.func public @main(") + len("func.func public @main")
    depth, end = 0, start
    while True:
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
        if depth == 0:
            break
    out = []
    for chunk in text[start:end].split("%arg")[1:]:
        match = re.match(r"\d+: tensor<([^>]*)>", chunk)
        if match is None:
            raise ValueError(f"cannot read the argument type in {chunk[:80]!r}")
        *dims, element = match.group(1).split("x")
        sharding = re.search(r'mhlo\.sharding = "([^"]*)"', chunk)
        sdy = re.search(r"sdy\.sharding = #sdy\.sharding<@(\w+), \[(.*?)\]( replicated=\{[^}]*\})?>", chunk)
        if sharding:
            hlo = sharding.group(1)
        elif sdy:
            hlo = sdy_to_hlo(_sdy_meshes(text)[sdy.group(1)], re.findall(r"\{([^}]*)\}", sdy.group(2)))
        else:
            hlo = "{replicated}"
        out.append((tuple(int(d) for d in dims), _DTYPES[element], hlo))
    return out


def uses_shardy(text: str) -> bool:
    """Whether the module carries Shardy shardings (it must then be partitioned by Shardy, not GSPMD)."""
    return "sdy.mesh @" in text


def _sdy_meshes(text: str) -> dict[str, list[tuple[str, int]]]:
    """The Shardy meshes a module declares (``sdy.mesh @mesh = <["data"=2, "model"=4]>``): name -> axes."""
    meshes = {}
    for name, body, rest in re.findall(r"sdy\.mesh @(\w+) = <\[([^\]]*)\]([^>]*)>", text):
        if "device_ids" in rest:
            raise ValueError(f"mesh @{name} lists its device ids; only meshes in device order are read")
        meshes[name] = [(axis, int(size)) for axis, size in re.findall(r'"(\w+)"=(\d+)', body)]
    return meshes


def sdy_to_hlo(mesh: list[tuple[str, int]], dims: list[str]) -> str:
    """A Shardy argument sharding (the axes of each dimension, e.g. ``['"data"', '']``, over ``mesh``'s axes in
    device order) as the HLO sharding string ``parse_sharding`` reads (the iota form with a transpose)."""
    sizes = dict(mesh)
    order = [a for a, _ in mesh]
    per_dim = [re.findall(r'"(\w+)"', d) for d in dims]
    used = [a for axes in per_dim for a in axes]
    if not used:
        return "{replicated}"
    rest = [a for a in order if a not in used]
    tiles = [1] * len(per_dim)
    for i, axes in enumerate(per_dim):
        for a in axes:
            tiles[i] *= sizes[a]
    replicate = 1
    for a in rest:
        replicate *= sizes[a]
    perm = [order.index(a) for a in used + rest]
    tile_text = ",".join(str(t) for t in tiles + ([replicate] if rest else []))
    iota = f"<=[{','.join(str(s) for _, s in mesh)}]"
    if perm != sorted(perm):
        iota += f"T({','.join(map(str, perm))})"
    return "{devices=[" + tile_text + "]" + iota + (" last_tile_dim_replicate" if rest else "") + "}"


def _value(shape: tuple[int, ...], dtype: str) -> Any:
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return np.full(shape, 0.01, ml_dtypes.bfloat16)
    return np.full(shape, 0.01, dtype) if dtype.startswith("float") else np.zeros(shape, dtype)


def aliases(text: str) -> dict[int, int]:
    """``{argument: output}`` of the module's donated arguments (``tf.aliasing_output``)."""
    start = text.index("func.func public @main(")
    signature = text[start:text.index("{\n", start)]
    out = {}
    for chunk in signature.split("%arg")[1:]:
        number, alias = re.match(r"(\d+):", chunk), re.search(r"tf\.aliasing_output = (\d+) : i32", chunk)
        if number and alias:
            out[int(number.group(1))] = int(alias.group(1))
    return out


def plugin_runner(text: str, donate: bool = False) -> Callable[[], float]:
    """``text`` compiled by the CPU plugin's XLA through pjrt_plugins; a call runs it, drops the outputs and returns
    the seconds the execute took (with ``donate``, the donated arguments' outputs become the next call's inputs)."""
    import pjrt_plugins.spmd as xs
    from pjrt_plugins.runtime import CompileOptions

    xs.set_plugin("cpu", options={"cpu_device_count": DEVICES})
    vd = xs.virtual_device()
    exe = vd.client.compile(text, CompileOptions(num_replicas=1, num_partitions=DEVICES, use_spmd_partitioning=True,
                                                 use_shardy_partitioner=uses_shardy(text),
                                                 device_assignment=[list(vd.device_assignment)]))
    per_device: dict[int, list[Any]] = {ordinal: [] for ordinal in vd.device_ids}  # shardings name ordinals
    for shape, dtype, sharding in arguments(text):
        value = _value(shape, dtype)
        for shard in xs.parse_sharding(sharding).shards(shape, vd.device_ids):
            piece = value if shard.indices is Ellipsis else value[shard.indices]
            per_device[shard.device].append(vd.client.buffer_from_host(piece, vd.devices[shard.device]))
    ordinal_of = {int(d.id): ordinal for ordinal, d in enumerate(vd.devices)}
    args = [per_device[ordinal_of[int(d.id)]] for d in exe.addressable_devices]
    fed_back = aliases(text) if donate else {}

    def run() -> float:
        t0 = time.perf_counter()
        outputs = exe.execute(args)
        seconds = time.perf_counter() - t0
        for row, out in zip(args, outputs):
            for i, j in fed_back.items():
                row[i] = out[j]
        del outputs
        return seconds

    return run


def jaxlib_compile(text: str) -> tuple[Any, list[Any]]:
    """``text`` compiled by jaxlib's XLA (its CPU client, 8 host devices), and arguments laid out as it asks."""
    import jax
    import numpy as np
    from jax._src import xla_bridge
    from jax._src.lib import xla_client as xc
    from jax._src.sharding_impls import GSPMDSharding

    jax.config.update("jax_enable_x64", True)  # int64 inputs stay int64
    devices = jax.devices()[:DEVICES]
    options = xc.CompileOptions()
    build = options.executable_build_options
    build.num_replicas, build.num_partitions, build.use_spmd_partitioning = 1, DEVICES, True
    build.use_shardy_partitioner = uses_shardy(text)
    build.device_assignment = xc.DeviceAssignment.create(np.arange(DEVICES).reshape(1, DEVICES))
    exe = xla_bridge.get_backend("cpu").compile_and_load(text, xc.DeviceList(tuple(devices)), options)
    arrays = [jax.device_put(_value(shape, dtype), GSPMDSharding(devices, sharding))
              for (shape, dtype, _), sharding in zip(arguments(text), exe.get_parameter_shardings())]
    return exe, arrays


def jaxlib_runner(text: str, donate: bool = False) -> Callable[[], float]:
    """``text`` compiled by jaxlib's XLA; a call runs it, waits for it and returns the seconds that took (with
    ``donate``, the donated arguments' outputs become the next call's inputs, as for the plugin)."""
    import jax

    exe, arrays = jaxlib_compile(text)
    fed_back = aliases(text) if donate else {}

    def run() -> float:
        t0 = time.perf_counter()
        outputs = exe.execute_sharded(arrays).disassemble_into_single_device_arrays()
        for pieces in outputs:
            for piece in pieces:
                piece.block_until_ready()
        seconds = time.perf_counter() - t0
        for i, j in fed_back.items():
            old = arrays[i]
            arrays[i] = jax.make_array_from_single_device_arrays(old.shape, old.sharding, outputs[j])
        return seconds

    return run


def worker(kind: str, paths: list[str], donate: bool = False) -> int:
    if kind == "plugin":
        runners = {path: plugin_runner(prepare(Path(path).read_text(), donate), donate) for path in paths}
    else:
        runners = {path: jaxlib_runner(prepare(Path(path).read_text(), donate), donate) for path in paths}
    for run in runners.values():
        run()
        run()

    def handle(words: list[str]) -> dict:
        run = runners[words[1]]
        times = []
        cpu = time.process_time()  # every thread of this process: the executable's work, whatever the load
        for _ in range(int(words[2])):
            times.append(run())
        return {"ms": statistics.median(times) * 1e3, "cpu_ms": (time.process_time() - cpu) / len(times) * 1e3}

    return serve_commands({"ready": len(runners)}, handle)


COMPILERS = {
    "plugin XLA": ("plugin", {}),
    "jaxlib XLA": ("jaxlib", {}),
    "jaxlib XLA, no YNN fusions": ("jaxlib", {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type="}),
}
DONATING = "plugin XLA, donating"
JAXLIB_DONATING = "jaxlib XLA, donating"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="+", help="StableHLO text files (GSPMD or Shardy shardings, 8 partitions)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5, help="calls per round, module and compiler")
    parser.add_argument("--donate", action="store_true",
                        help="add both XLAs running the modules with their donation (inputs aliased to outputs), "
                             "each call's aliased outputs fed back as the next call's inputs")
    parser.add_argument("--plugin-only", action="store_true",
                        help="only the plugin's XLA (an A/B of programs, without the jaxlib workers' load)")
    parser.add_argument("--worker", choices=("plugin", "jaxlib"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    paths = [str(Path(p).resolve()) for p in args.modules]
    if args.worker:
        return worker(args.worker, paths, args.donate)
    print(f"{len(paths)} modules on {DEVICES} CPU devices; {os.cpu_count()} cpus, load "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    columns = {**COMPILERS, **({DONATING: ("plugin", {}), JAXLIB_DONATING: ("jaxlib", {})} if args.donate else {})}
    if args.plugin_only:
        columns = {name: column for name, column in columns.items() if column[0] == "plugin"}
    workers: dict[str, Worker] = {}
    try:
        for name, (kind, env) in columns.items():
            flags = " ".join([os.environ.get("XLA_FLAGS", ""), f"--xla_force_host_platform_device_count={DEVICES}",
                              env.get("XLA_FLAGS", "")]).strip()
            jax_env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags, "TF_CPP_MIN_LOG_LEVEL": "3"}
            extra = jax_env if kind == "jaxlib" else {}
            t0 = time.perf_counter()
            donate = ["--donate"] if name in (DONATING, JAXLIB_DONATING) else []
            workers[name] = Worker(__file__, [*paths, *donate], flag=f"--worker={kind}", python=sys.executable,
                                   env=extra)
            print(f"{name}: compiled in {time.perf_counter() - t0:.1f} s", flush=True)
        results: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            for name, w in workers.items():
                for path in paths:
                    got = w.request("run", path, args.calls)
                    results.setdefault((name, path), []).append(got["ms"])
                    cpu.setdefault((name, path), []).append(got["cpu_ms"])
            print(f"  round {r + 1}: load " + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    finally:
        for w in workers.values():
            w.close()
    table = Table([("module", 36, ""), *((f"{name} ms", len(name) + 3, ".1f") for name in columns)])
    for title, values in (("wall time per call (median)", results),
                          ("CPU time per call, all threads of the process (median): the work, less hit by the load",
                           cpu)):
        print()
        print(title)
        print(table.header())
        for path in paths:
            print(table.row(Path(path).name, *(statistics.median(values[(name, path)]) for name in columns)))
    print(json.dumps({Path(p).name: {n: results[(n, p)] for n in columns} for p in paths}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
