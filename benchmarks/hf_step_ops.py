"""The step programs of ``hf_step.py`` split into their ops: each compiled by jaxlib's XLA and profiled per op.

``hf_step.py --dump-programs DIR`` writes our compiled step's StableHLO and torchax's; this script runs each under
``jax.profiler`` on jaxlib's XLA (8 CPU devices, in a worker process) and sums the time of every op of the
optimized program, by kind: dots (a dot, or a fusion around one), collectives (the time includes waiting for the
slowest device at the rendezvous), reductions, other fusions, copies and layout ops, the rest. Each kind's figure is
milliseconds per execution and device (the sum over the 8 devices divided by 8), so the kinds add up to what one
device's thread spends in ops; the difference to the execution's wall time is the runtime between ops.

Why jaxlib's XLA for our program too: the CPU plugin (xla-cpu-pjrt) has no PJRT profiler extension, so its
executable cannot be split; the same program on jaxlib's XLA is split instead, and ``xla_cross_compile.py`` times
the two compilers against each other. A program that spends more in one kind of op on the same compiler is the
program's doing, not the compiler's. Measures only; never asserts a timing.

Run: python benchmarks/hf_step_ops.py DIR/*.mlir [--rounds 3] [--calls 5] [--top 8]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from _measure import Table, Worker, serve_commands
from xla_cross_compile import DEVICES, jaxlib_compile, prepare

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
LAYOUT = ("copy", "transpose", "bitcast", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad",
          "reshape", "broadcast", "gather", "scatter")
KINDS = ("dot", "collective", "reduce", "other fusion", "copy/layout", "other")


#: ``[ROOT] %name = type opcode(`` (a tuple type has spaces: the opcode is the first word followed by a parenthesis).
_INSTRUCTION = re.compile(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*\S.*?\s([a-z][\w\-]*)\(")


def op_kinds(hlo: str) -> dict[str, str]:
    """The kind (one of ``KINDS``) of every instruction of the optimized HLO text ``hlo``, by name."""
    bodies: dict[str, str] = {}
    current, lines = None, []
    for line in hlo.splitlines():
        if _INSTRUCTION.match(line):
            lines.append(line)
        elif line.rstrip().endswith("{"):  # a computation's header: [ENTRY] %name (params) -> type {
            header = re.match(r"\s*(?:ENTRY\s+)?%?([\w.\-]+)", line)
            current, lines = (header.group(1) if header else None), []
        elif line.strip() == "}" and current is not None:
            bodies[current] = "\n".join(lines)
            current = None
    kinds: dict[str, str] = {}
    for body in bodies.values():
        for line in body.splitlines():
            m = _INSTRUCTION.match(line)
            if m is None:
                continue
            name, opcode = m.groups()
            kinds[name] = _kind(opcode, line, bodies)
    return kinds


def _kind(opcode: str, line: str, bodies: dict[str, str]) -> str:
    base = re.sub(r"-(start|done)$", "", opcode)
    if base in COLLECTIVES:
        return "collective"
    if opcode in ("dot", "convolution"):
        return "dot"
    if opcode == "fusion":
        called = re.search(r"calls=%?([\w.\-]+)", line)
        body = bodies.get(called.group(1), "") if called else ""
        if re.search(r"\s(dot|convolution)\(", body):
            return "dot"
        if re.search(r"\sreduce(-window)?\(", body):
            return "reduce"
        return "other fusion"
    if opcode in ("reduce", "reduce-window"):
        return "reduce"
    if opcode in LAYOUT:
        return "copy/layout"
    return "other"


# -- the worker: jaxlib's XLA under jax.profiler ------------------------------------------------------


def worker(paths: list[str]) -> int:
    import jax
    from pjrt_plugins.runtime._xspace import trace_events

    programs = {}
    for path in paths:
        text = prepare(Path(path).read_text())
        exe, arrays = jaxlib_compile(text)
        hlo = "\n".join(m.to_string() for m in exe.hlo_modules())
        programs[path] = (exe, arrays, op_kinds(hlo))

    def call(path: str) -> None:
        exe, arrays, _ = programs[path]
        for pieces in exe.execute_sharded(arrays).disassemble_into_single_device_arrays():
            for piece in pieces:
                piece.block_until_ready()

    for path in paths:
        call(path)
        call(path)

    def handle(words: list[str]) -> dict:
        path, calls = words[1], int(words[2])
        kinds = programs[path][2]
        with tempfile.TemporaryDirectory() as tmp:
            with jax.profiler.trace(tmp):
                for _ in range(calls):
                    call(path)
            data = next(Path(tmp).rglob("*.xplane.pb")).read_bytes()
        per_op: Counter = Counter()
        for event in trace_events(data):
            if event.name in kinds:
                per_op[event.name] += event.duration_ns
        scale = 1e-6 / (calls * DEVICES)  # ns summed over calls and devices -> ms per execution and device
        by_kind: Counter = Counter()
        for name, ns in per_op.items():
            by_kind[kinds[name]] += ns * scale
        return {"kinds": dict(by_kind), "ops": {n: ns * scale for n, ns in per_op.most_common(40)},
                "op_kinds": {n: kinds[n] for n, _ in per_op.most_common(40)},
                "counts": dict(Counter(kinds[n] for n in per_op))}

    return serve_commands({"ready": len(programs)}, handle)


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="+", help="StableHLO text files from hf_step.py --dump-programs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5, help="profiled calls per round and module")
    parser.add_argument("--top", type=int, default=8, help="ops listed per module")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    paths = [str(Path(p).resolve()) for p in args.modules]
    if args.worker:
        return worker(paths)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"{len(paths)} modules on jaxlib's XLA, {DEVICES} CPU devices; {os.cpu_count()} cpus, load {load}",
          flush=True)
    flags = " ".join([os.environ.get("XLA_FLAGS", ""), f"--xla_force_host_platform_device_count={DEVICES}"]).strip()
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags, "TF_CPP_MIN_LOG_LEVEL": "3"}
    results: dict[str, list[dict[str, Any]]] = {}
    with Worker(__file__, paths, flag="--worker", env=env) as w:
        for r in range(args.rounds):
            for path in paths:
                results.setdefault(path, []).append(w.request("profile", path, args.calls))
            print(f"  round {r + 1}: load " + " ".join(f"{x:.2f}" for x in os.getloadavg()), flush=True)
    print()
    print("ms per execution and device, by kind of op (median over rounds); (n): ops of that kind that ran")
    table = Table([("module", 30, ""), *((k, 14, "") for k in KINDS), ("all ops", 8, ".1f")])
    print(table.header())
    for path, rounds in results.items():
        counts = rounds[0]["counts"]
        cells = [f"{statistics.median(r['kinds'].get(k, 0.0) for r in rounds):.1f} ({counts.get(k, 0)})"
                 for k in KINDS]
        total = statistics.median(sum(r["kinds"].values()) for r in rounds)
        print(table.row(Path(path).name, *cells, total))
    for path, rounds in results.items():
        last = rounds[-1]
        print(f"\n{Path(path).name}: the {args.top} slowest ops (last round, ms per execution and device)")
        for name, ms in list(last["ops"].items())[:args.top]:
            print(f"  {ms:7.2f}  {name} ({last['op_kinds'][name]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
