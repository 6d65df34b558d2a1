"""The floor under any ``__torch_dispatch__`` tracer: the GPT step of ``gpt_step.py`` with a subclass that records nothing.

The goal is at most 15 us of Python per traced op (docs/benchmarks.md). Part of every op's cost is not the tracer's:
torch's dispatcher, autograd (its engine runs the backward of a ``pjrt`` tensor on a device thread),
the optimizer's Python and one ``_make_wrapper_subclass`` per result. This script measures that part
on the same step, side by side with ours, by running the step on ``FloorTensor``: a wrapper subclass
on the same ``pjrt`` device whose ``__torch_dispatch__`` only replays the result shapes of the call at
the same position in the previous step (computed once on the meta device; no key is built) and makes
the result wrappers: no graph, no lowering, no execution, no check that the step is the same.
The table gives both per traced op of ours (the goal's unit) and per ``__torch_dispatch__`` call;
rounds interleave and the load is printed.

Run: python benchmarks/tracing_floor.py [--d-model 64] [--layers 4] [--rounds 5] [--steps 5] [--fused]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import gpt_step
from _measure import Table

GOAL_US_PER_OP = 15.0  # of Python per traced op (see the module docstring)


def floor_tensor_type() -> type:
    """The recording-free subclass (made here so that importing the module does not import torch)."""
    import torch
    from pjrt_plugins.spmd import frontend
    from torch.utils._pytree import tree_map

    class FloorTensor(torch.Tensor):
        calls = 0
        #: (func, result template) of each call of the step, by position: replay needs no key at all.
        tape: list[tuple[Any, tuple[str, Any]]] = []
        position = 0

        @staticmethod
        def __new__(cls, shape: Any, dtype: torch.dtype, requires_grad: bool = False) -> FloorTensor:
            return torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=frontend.TORCH_DEVICE,
                                                       requires_grad=requires_grad)

        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            cls.calls += 1
            position = cls.position
            cls.position = position + 1
            if position < len(cls.tape) and cls.tape[position][0] is func:
                kind, value = cls.tape[position][1]
            else:
                kind, value = _result_template(func, args, kwargs or {})
                del cls.tape[position:]
                cls.tape.append((func, (kind, value)))
            if kind == "input":  # an in-place op: its result is the written argument
                return args[value]
            return _make(cls, value)

    def _result_template(func: Any, args: tuple, kwargs: dict) -> tuple[str, Any]:
        schema = func._schema
        for ret in schema.returns:
            if ret.alias_info is not None and ret.alias_info.is_write:
                position = next(j for j, a in enumerate(schema.arguments)
                                if a.alias_info is not None and a.alias_info.is_write)
                return "input", position
        if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
            return "template", None  # foreach in place: returns nothing

        def to_meta(v: Any) -> Any:
            if isinstance(v, torch.Tensor):
                return torch.empty(v.shape, dtype=v.dtype, device="meta")
            if isinstance(v, torch.device):
                return torch.device("meta")
            return v

        meta_kwargs = tree_map(to_meta, kwargs)
        if "device" in meta_kwargs:
            meta_kwargs["device"] = torch.device("meta")
        result = func(*tree_map(to_meta, args), **meta_kwargs)
        return "template", tree_map(lambda t: ("T", tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else t,
                                    result)

    def _make(cls: type, template: Any) -> Any:
        if isinstance(template, tuple) and len(template) == 3 and template[0] == "T":
            return cls(template[1], template[2])
        if isinstance(template, (list, tuple)):
            return type(template)(_make(cls, t) for t in template)
        return template

    return FloorTensor


class FloorSide:
    """The GPT step of ``gpt_step.py`` on :func:`floor_tensor_type` tensors (forward, backward, AdamW)."""

    def __init__(self, cfg: gpt_step.Config, fused: bool = False) -> None:
        import pjrt_plugins.spmd  # noqa: F401  (makes "pjrt" a torch device)
        import torch

        self.torch, self.cls = torch, floor_tensor_type()
        model = gpt_step.torch_model(cfg)
        for module in model.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                setattr(module, name, torch.nn.Parameter(self.cls(tuple(p.shape), p.dtype, requires_grad=True)))
        self.model = model
        self.idx = self.cls((gpt_step.BATCH, gpt_step.SEQ), torch.int64)
        self.tgt = self.cls((gpt_step.BATCH, gpt_step.SEQ), torch.int64)
        self.opt = torch.optim.AdamW(model.parameters(), lr=gpt_step.LR, betas=gpt_step.BETAS, eps=gpt_step.EPS,
                                     weight_decay=gpt_step.WEIGHT_DECAY, fused=fused or None)
        self.run(2)

    def run(self, steps: int) -> dict:
        times, cpu, calls = [], [], []
        for _ in range(steps):
            self.cls.position = 0
            c0, t0, n0 = time.process_time(), time.perf_counter(), self.cls.calls
            loss = self.model(self.idx, self.tgt)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            calls.append(self.cls.calls - n0)
        return {"tracing": times, "tracing_cpu": cpu, "calls": calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    gpt_step.add_step_arguments(parser)
    parser.add_argument("--fused", action="store_true", help="AdamW(fused=True) on both sides")
    args = parser.parse_args(argv)
    cfg = gpt_step.Config(args.d_model, args.layers)
    print(f"GPT d_model {cfg.d_model}, {cfg.layers} layers (gpt_step.py's step"
          f"{', AdamW(fused=True)' if args.fused else ''}); {os.cpu_count()} cpus, "
          f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    ours, floor = gpt_step.TorchSide(cfg, "pjrt", args.fused), FloorSide(cfg, args.fused)
    results: dict[str, dict[str, list]] = {"ours": {}, "floor": {}}
    for r in range(args.rounds):
        for name, side in (("ours", ours), ("floor", floor)):
            for k, v in side.run(args.steps).items():
                results[name].setdefault(k, []).extend(v if isinstance(v, list) else [v])
        print(f"  round {r + 1}: ours tracing {statistics.median(results['ours']['tracing']) * 1e3:.1f} ms, floor "
              f"{statistics.median(results['floor']['tracing']) * 1e3:.1f} ms", flush=True)
    ops = statistics.median(results["ours"]["ops"])
    calls = statistics.median(results["floor"]["calls"])
    table = Table([("side", 34, ""), ("tracing ms", 11, ".2f"), ("CPU ms", 9, ".2f"), ("us/op (CPU)", 12, ".1f"),
                   ("us/dispatch", 12, ".1f")])
    print()
    print(f"{ops:.0f} ops recorded per step by ours; {calls:.0f} __torch_dispatch__ calls per step on the floor")
    print(table.header())
    for name, label in (("ours", "ours"), ("floor", "floor (dispatch + autograd + wrappers)")):
        wall = statistics.median(results[name]["tracing"])
        cpu = statistics.median(results[name]["tracing_cpu"])
        print(table.row(label, wall * 1e3, cpu * 1e3, cpu / ops * 1e6, cpu / calls * 1e6))
    floor_cpu = statistics.median(results["floor"]["tracing_cpu"]) / ops * 1e6
    ours_cpu = statistics.median(results["ours"]["tracing_cpu"]) / ops * 1e6
    print()
    print(f"ours / floor: {ours_cpu / floor_cpu:.2f}x; the floor alone is {floor_cpu / GOAL_US_PER_OP:.2f}x the goal's "
          f"{GOAL_US_PER_OP:g} us per op")
    print(f"done (load {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
