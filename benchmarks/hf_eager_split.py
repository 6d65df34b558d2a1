"""Where the Python of ``hf_step.py``'s eager step goes: per phase, per ``__torch_dispatch__`` call, and per op kind.

Why: the eager step is bound by per-op tracing (docs/benchmarks.md, "A transformers model"). This script splits
each phase of our eager step (forward, backward, optimizer, ``zero_grad``, ``xs.sync()``) into the time inside
the executables, the time inside our ``__torch_dispatch__`` (a timer around it, about 0.3 us per call) and the rest
(torch's dispatcher and autograd, transformers' and the optimizer's Python, the runtime after a program), and
counts the ops each phase records by kind (from the pending trace just before ``xs.sync()``).

Run: python benchmarks/hf_eager_split.py [--steps 10] [--mesh data|megatron]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from typing import Any

import hf_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--mesh", default="data", choices=sorted(hf_step.MESHES))
    parser.add_argument("--kinds", type=int, default=25, help="op kinds to list (most recorded first)")
    args = parser.parse_args(argv)

    from pjrt_plugins.spmd.frontend import tensor as frontend_tensor
    from pjrt_plugins.spmd.trace import _state

    side = hf_step.TorchSide("pjrt", args.mesh)
    xs, clock = side.xs, time.perf_counter
    cls = frontend_tensor.XLAShardedTensor
    original = cls.__dict__["__torch_dispatch__"].__func__
    inside = [0.0, 0]

    def timed(owner: Any, func: Any, types: Any, a: tuple = (), kw: dict | None = None) -> Any:
        t0 = clock()
        try:
            return original(owner, func, types, a, kw)
        finally:
            inside[0] += clock() - t0
            inside[1] += 1

    cls.__torch_dispatch__ = classmethod(timed)  # type: ignore[assignment]
    split: dict[str, dict[str, list[float]]] = {}
    kinds: collections.Counter[str] = collections.Counter()

    def phase(name: str, fn: Any) -> Any:
        m0, d0, n0, t0 = xs.metrics(), inside[0], inside[1], clock()
        result = fn()
        wall, m1 = clock() - t0, xs.metrics()
        execute = m1.execute_seconds - m0.execute_seconds
        row = split.setdefault(name, {"python": [], "dispatch": [], "calls": [], "execute": []})
        row["python"].append(wall - execute)
        row["dispatch"].append(inside[0] - d0)
        row["calls"].append(inside[1] - n0)
        row["execute"].append(execute)
        return result

    try:
        for step in range(args.steps):
            loss = phase("forward", lambda: side.forward(input_ids=side.ids, labels=side.labels).loss)
            phase("backward", loss.backward)
            phase("optimizer", side.opt.step)
            phase("zero_grad", side.opt.zero_grad)
            if step == args.steps - 1:  # the ops the step's last program runs, by kind
                trace, ops = _state.ENGINE.trace, _state.ENGINE.ops_by_id
                for entry in trace.entries if trace is not None else ():
                    if entry[0] > 0:
                        kinds[str(ops[entry[0]].func)] += 1
            phase("sync", side.sync)
    finally:
        cls.__torch_dispatch__ = classmethod(original)  # type: ignore[assignment]

    def ms(values: list[float]) -> float:
        return statistics.median(values) * 1e3

    print(f"hf_step.py's Llama, eager, {args.mesh} mesh, {args.steps} steps; {os.cpu_count()} cpus, load "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; medians in ms")
    print(f"{'phase':12} {'python':>8} {'in dispatch':>12} {'calls':>6} {'us/call':>8} {'execute':>8}")
    total = 0.0
    for name, row in split.items():
        calls = statistics.median(row["calls"])
        per_call = ms(row["dispatch"]) / calls * 1e3 if calls else 0.0
        total += ms(row["python"])
        print(f"{name:12} {ms(row['python']):8.2f} {ms(row['dispatch']):12.2f} {calls:6.0f} {per_call:8.1f} "
              f"{ms(row['execute']):8.2f}")
    print(f"{'step':12} {total:8.2f}")
    print(f"\nops of the step's last program by kind ({sum(kinds.values())} ops):")
    for name, n in kinds.most_common(args.kinds):
        print(f"{n:6} {name}")
    print(f"done (load {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
