"""Collectives in the compiled GPT and MLP training steps: ours with Shardy and with GSPMD, against jax's.

The programs are those of ``gpt_step.py`` (GPT with AdamW, mesh (2, 4) data x model, Megatron-sharded
weights) and ``spmd_mlp.py`` (Linear-ReLU-Linear with SGD), at their default sizes. Ours is the
steady-state step program (``execution.last_program()``), compiled once per partitioner
(``xs.set_partitioner``); jax's is ``jax.jit(step).lower(...).compile()`` in a worker process, with
``JAX_USE_SHARDY_PARTITIONER`` on and off. Each optimized HLO module is counted by instruction:
all-gather, all-reduce, reduce-scatter, all-to-all and collective-permute (their ``-start`` forms
included, ``-done`` not). Counts, not times: nothing here is timed.

Run: python benchmarks/collectives.py [--layers 4] [--d-model 64] [--no-jax]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from pathlib import Path

from _measure import JaxWorker

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_OP = re.compile(r"=\s*\S+(?:\[[^\]]*\])?(?:\{[^}]*\})?\s+(" + "|".join(KINDS) + r")(?:-start)?\(")
HERE = Path(__file__).resolve().parent


def count_collectives(hlo_text: str) -> Counter:
    """Collective instructions in an HLO module's text, by kind."""
    counts: Counter = Counter({k: 0 for k in KINDS})
    for line in hlo_text.splitlines():
        m = _OP.search(line)
        if m:
            counts[m.group(1)] += 1
    return counts


def ours(layers: int, d_model: int) -> dict[str, dict[str, Counter]]:
    """{model: {partitioner: counts}} for our programs."""
    import gpt_step
    import spmd_mlp

    import pjrt_plugins.spmd as xs
    from pjrt_plugins.spmd import execution

    out: dict[str, dict[str, Counter]] = {"GPT": {}, "MLP": {}}
    for mode in ("shardy", "gspmd"):
        xs.set_partitioner(mode)
        execution.clear_compile_cache()
        gpt_step.TorchSide(gpt_step.Config(d_model, layers), "pjrt")
        program = execution.last_program()
        assert program is not None and program.lowered.partitioner == mode, program and program.lowered.partitioner
        out["GPT"][mode] = count_collectives(program.executable.optimized_hlo_text())
        execution.clear_compile_cache()
        spmd_mlp.Ours(256, 1024, 4096)
        program = execution.last_program()
        assert program is not None and program.lowered.partitioner == mode
        out["MLP"][mode] = count_collectives(program.executable.optimized_hlo_text())
    xs.set_partitioner(None)
    return out


def jax_side(layers: int, d_model: int) -> tuple[str, dict[str, dict[str, Counter]]]:
    """jax's version and {model: {partitioner: counts}} for its programs."""
    out: dict[str, dict[str, Counter]] = {"GPT": {}, "MLP": {}}
    version = "?"
    for mode, flag in (("shardy", "true"), ("gspmd", "false")):
        os.environ["JAX_USE_SHARDY_PARTITIONER"] = flag  # the workers inherit it
        try:
            for model, script, args in (
                ("GPT", HERE / "gpt_step.py", ["--d-model", str(d_model), "--layers", str(layers)]),
                ("MLP", HERE / "spmd_mlp.py", []),
            ):
                with JaxWorker(str(script), args, devices=8) as worker:
                    version = worker.info["version"]
                    out[model][mode] = count_collectives(worker.request("hlo")["hlo"])
        finally:
            os.environ.pop("JAX_USE_SHARDY_PARTITIONER", None)
    return version, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--no-jax", action="store_true", help="count ours only")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    rows = [(f"ours, {mode}", model, counts) for model, by in ours(args.layers, args.d_model).items()
            for mode, counts in by.items()]
    if not args.no_jax:
        version, theirs = jax_side(args.layers, args.d_model)
        rows += [(f"jax {version}, {mode}", model, counts) for model, by in theirs.items()
                 for mode, counts in by.items()]
    rows.sort(key=lambda r: (r[1], r[0]))
    print(f"collectives per compiled training step (GPT d_model {args.d_model}, {args.layers} layers; "
          "MLP 256x1024x4096; mesh (2, 4))")
    header = f"{'model':<5} {'program':<22}" + "".join(f" {k:>18}" for k in KINDS) + f" {'total':>6}"
    print(header)
    for name, model, counts in rows:
        print(f"{model:<5} {name:<22}" + "".join(f" {counts[k]:>18}" for k in KINDS) + f" {sum(counts.values()):>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
