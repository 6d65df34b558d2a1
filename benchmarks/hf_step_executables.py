"""Where the executable of our compiled Llama step loses to torchax's: the same three programs in their steps and alone.

``hf_step.py`` times our ``torch.compile`` step's executable against torchax's (after its dispatch). This script takes
three step programs of that model and mesh and times each executable in four places, rounds interleaved, the load
printed:

- programs: (a) ours compiled (``torch.compile(model)``, AOTAutograd's forward and backward regions, torch's foreach
  AdamW traced op by op, ``xs.sync()``); (b) ours functional: torchax's step math (``torch.func.functional_call``
  under ``torch.func.grad_and_value``, the AdamW update written out) traced by our engine
  (``hf_step.FunctionalSide``); (c) torchax's jitted step (``hf_step.torchax_worker``, its StableHLO dumped);
- places: "in its step" (ours: the engine's execute time inside the step; torchax: its step after dispatch, in its
  worker, on jaxlib's XLA); "alone here" (the program compiled by the CPU plugin in this process, the one running our
  steps, each call's donated outputs fed back as the next call's inputs); "alone, plugin worker" and "alone, jaxlib
  worker" (the same in a fresh process: ``xla_cross_compile.py --donate``'s workers).

Same program, different place: the runtime or the process; same place, different program: the program; plugin
against jaxlib worker: the compiler. Ratios are to torchax's executable in its step; torchax's whole step and its
dispatch follow (jax starts the executable during the dispatch, so "after dispatch" leaves part of it out), then the
CPU time of the isolated calls (all threads of the process running them), which the load moves less than wall
times. The load printed counts this run's own device threads too. Measures only.

Run: python benchmarks/hf_step_executables.py --torchax-python PATH [--meshes data,megatron] [--rounds 5] [--calls 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import hf_step
import xla_cross_compile
from _measure import Table, Worker

PROGRAMS = ("ours compiled", "ours functional", "torchax")
PLACES = ("in its step", "alone here", "alone, plugin worker", "alone, jaxlib worker")
FILES = {"ours compiled": "ours-compiled", "ours functional": "ours-functional", "torchax": "torchax"}


def _load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _new_step_program(before: set[Any], programs: dict[Any, Any]) -> Any:
    """The largest program compiled since ``before`` (the training step's)."""
    return max((p for k, p in programs.items() if k not in before), key=lambda p: len(p.lowered.text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torchax-python", default=os.environ.get("TORCHAX_PYTHON"),
                        help="an interpreter from benchmarks/envs/torchax-venv.sh (default: $TORCHAX_PYTHON)")
    parser.add_argument("--meshes", default="data,megatron", help="comma-separated: data, megatron")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3, help="steps or calls per round, program and place")
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the programs' StableHLO in DIR (default: a new temporary folder)")
    args = parser.parse_args(argv)
    if not args.torchax_python:
        parser.error("--torchax-python (or $TORCHAX_PYTHON) is needed: torchax's step is the reference")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    meshes = args.meshes.split(",")
    unknown = set(meshes) - set(hf_step.MESHES)
    if unknown:
        parser.error(f"unknown meshes {sorted(unknown)}; choose from {sorted(hf_step.MESHES)}")
    from pjrt_plugins.spmd import execution

    folder = args.keep or tempfile.mkdtemp(prefix="hf-step-executables-")
    os.makedirs(folder, exist_ok=True)
    print(f"{', '.join(meshes)} meshes, 8 CPU devices, {os.cpu_count()} cpus, {_load()}; programs in {folder}",
          flush=True)
    steps: dict[tuple[str, str], Any] = {}  # (program, mesh) -> a side with run(n) or a worker
    workers: list[Worker] = []
    try:
        for mesh in meshes:
            w = Worker(hf_step.__file__, ["--mesh", mesh, "--dump-programs", folder], flag="--torchax-worker",
                       python=args.torchax_python, env=hf_step.torchax_env())
            workers.append(w)
            steps[("torchax", mesh)] = w
            for name, make in (("ours compiled", lambda m: hf_step.TorchSide("pjrt", m, compiled=True)),
                               ("ours functional", hf_step.FunctionalSide)):
                before = set(execution.PROGRAMS.programs)
                steps[(name, mesh)] = make(mesh)
                program = _new_step_program(before, execution.PROGRAMS.programs)
                Path(folder, f"{FILES[name]}-{mesh}.mlir").write_text(program.lowered.text)
            print(f"mesh {mesh}: steps ready ({_load()})", flush=True)
        paths = {(name, mesh): str(Path(folder, f"{FILES[name]}-{mesh}.mlir")) for name in PROGRAMS for mesh in meshes}
        here = {key: xla_cross_compile.plugin_runner(xla_cross_compile.prepare(Path(path).read_text(), True), True)
                for key, path in paths.items()}
        alone: dict[str, Worker] = {}
        for place, kind, env in (("alone, plugin worker", "plugin", {}), ("alone, jaxlib worker", "jaxlib",
                                                                          hf_step.torchax_env())):
            alone[place] = Worker(xla_cross_compile.__file__, [*paths.values(), "--donate"], flag=f"--worker={kind}",
                                  env=env)
            workers.append(alone[place])
        print(f"isolated runners compiled ({_load()})", flush=True)
        times: dict[tuple[str, str, str], list[float]] = {}
        cpu_ms: dict[tuple[str, str, str], list[float]] = {}  # the process's CPU time per call, all its threads
        for r in range(args.rounds):
            for (name, mesh), side in steps.items():
                if isinstance(side, Worker):  # torchax: the step after its dispatch
                    got = side.request("run", args.calls)
                    ms = [(t - d) * 1e3 for t, d in zip(got["times"], got["dispatch"])]
                    times.setdefault((name, mesh, "whole step"), []).extend(t * 1e3 for t in got["times"])
                    times.setdefault((name, mesh, "dispatch"), []).extend(d * 1e3 for d in got["dispatch"])
                else:
                    ms = [e * 1e3 for e in side.run(args.calls)["execute"]]
                times.setdefault((name, mesh, "in its step"), []).extend(ms)
            for key, run in here.items():
                cpu = time.process_time()
                times.setdefault((*key, "alone here"), []).extend(run() * 1e3 for _ in range(args.calls))
                cpu_ms.setdefault((*key, "alone here"), []).append((time.process_time() - cpu) / args.calls * 1e3)
            for place, w in alone.items():
                for key, path in paths.items():
                    got = w.request("run", path, args.calls)
                    times.setdefault((*key, place), []).append(got["ms"])
                    cpu_ms.setdefault((*key, place), []).append(got["cpu_ms"])
            print(f"  round {r + 1} ({_load()})", flush=True)
    finally:
        for w in workers:
            w.close()
    print()
    print("executable ms (medians), and each / torchax's in its step")
    table = Table([("mesh, program", 26, ""), *((f"{p} ms", len(p) + 3, ".1f") for p in PLACES),
                   *((f"{p} /", len(p) + 2, ".2f") for p in PLACES)])
    print(table.header())
    for mesh in meshes:
        reference = statistics.median(times[("torchax", mesh, "in its step")])
        for name in PROGRAMS:
            medians = [statistics.median(times[(name, mesh, p)]) for p in PLACES]
            print(table.row(f"{mesh}, {name}", *medians, *(m / reference for m in medians)))
        whole, dispatch = (statistics.median(times[("torchax", mesh, k)]) for k in ("whole step", "dispatch"))
        print(f"{mesh}, torchax's whole step {whole:.1f} ms, its dispatch {dispatch:.1f} ms (its executable starts "
              "during the dispatch: 'after dispatch' counts only what is left of it)")
    print()
    print("CPU ms per call of the isolated runs (all threads of the process running it; the load's effect on these "
          "is smaller than on wall times)")
    alone_places = PLACES[1:]
    cpu_table = Table([("mesh, program", 26, ""), *((f"{p} ms", len(p) + 3, ".1f") for p in alone_places)])
    print(cpu_table.header())
    for mesh in meshes:
        for name in PROGRAMS:
            print(cpu_table.row(f"{mesh}, {name}", *(statistics.median(cpu_ms[(name, mesh, p)]) for p in alone_places)))
    print(f"done ({_load()}; the load counts this run's own device threads too)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
