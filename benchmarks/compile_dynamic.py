"""Sequence lengths that change from step to step, under ``torch.compile(backend="pjrt")``.

The GPT of ``gpt_step.py`` (8 CPU devices, mesh (2, 4), AdamW) trains with the sequence length
cycling over ``--lengths``. Dynamo makes the length symbolic once it has changed; the backend then
makes a region per length on its first call, so a step still records a handful of ops. Sides, in one
process, rounds interleaved, each round a full cycle of lengths after every length was seen:

- compiled: ``torch.compile(model, backend="pjrt")`` (dynamo's automatic dynamic shapes);
- compiled, static: the same with ``dynamic=False``, a graph per length: nothing symbolic, the best
  a compiled step can do;
- eager: the module on ``pjrt:0`` without ``torch.compile`` (every ATen op recorded);
- torch: eager PyTorch on the CPU, the baseline of the ratios.

Losses agree between the pjrt sides and torch. Never asserts a timing.

    python benchmarks/compile_dynamic.py [--lengths 32,48,64] [--d-model 64] [--layers 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

from _measure import Table
from gpt_step import BATCH, BETAS, EPS, LR, MESH, SEQ, WEIGHT_DECAY, Config, host_data, spec_of, torch_model


class Side:
    """One training loop that takes a sequence length per step."""

    def __init__(self, model, idx, tgt, kind: str) -> None:
        import torch

        self.kind = kind
        self.sync = lambda: None
        if kind == "torch":
            self.model, self.idx, self.tgt = model, idx, tgt
        else:
            import pjrt_plugins.spmd as xs

            mesh = xs.Mesh(range(8), *MESH)
            self.model = model.to("pjrt")
            for name, p in self.model.named_parameters():
                if any(s is not None for s in spec_of(name)):
                    xs.mark_sharding(p, mesh, spec_of(name))
            self.idx = xs.mark_sharding(idx.to("pjrt"), mesh, ("data", None))
            self.tgt = xs.mark_sharding(tgt.to("pjrt"), mesh, ("data", None))
            self.sync, self.xs = xs.sync, xs
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)

        def loss_of(idx, tgt, length):  # slices inside: a compiled function takes no pjrt slice (docs/missing.md)
            return self.model(idx[:, :length], tgt[:, :length])

        self.forward = loss_of
        if kind == "compiled":
            self.forward = torch.compile(loss_of, backend="pjrt")
        elif kind == "compiled, static":
            self.forward = torch.compile(loss_of, backend="pjrt", dynamic=False)

    def step(self, length: int) -> float:
        loss = self.forward(self.idx, self.tgt, length)
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        self.sync()
        return loss

    def ops_recorded(self) -> int:
        return self.xs.metrics().ops_recorded if self.kind != "torch" else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="32,48,64", help=f"comma-separated sequence lengths, each <= {SEQ}")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    lengths = [int(v) for v in args.lengths.split(",")]
    if not lengths or any(not 1 < n <= SEQ for n in lengths):
        parser.error(f"--lengths: each length must be from 2 to {SEQ}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import torch

    import pjrt_plugins.spmd as xs

    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    cfg = Config(args.d_model, args.layers)
    _, idx, tgt = host_data(cfg)
    idx, tgt = torch.from_numpy(idx), torch.from_numpy(tgt)
    model = torch_model(cfg)
    sides = {kind: Side(copy.deepcopy(model), idx, tgt, kind)
             for kind in ("compiled", "compiled, static", "eager", "torch")}
    losses = {kind: [] for kind in sides}
    for _ in range(2):  # every length seen twice: compiles, and the second length makes dynamo's graph dynamic
        for kind, side in sides.items():
            for n in lengths:
                losses[kind].append(side.step(n).item())
    times = {kind: [] for kind in sides}
    ops = {kind: [] for kind in sides}
    for _ in range(args.rounds):
        for kind, side in sides.items():
            before = side.ops_recorded()
            start = time.perf_counter()
            for n in lengths:
                losses[kind].append(side.step(n).item())
            times[kind].append((time.perf_counter() - start) / len(lengths))
            ops[kind].append((side.ops_recorded() - before) / len(lengths))

    print(f"GPT d_model {cfg.d_model}, {cfg.layers} layers, batch {BATCH}, lengths {lengths} cycling, "
          f"{args.rounds} rounds (load {os.getloadavg()[0]:.1f})")
    table = Table([("side", 18, ""), ("step ms", 9, ".1f"), ("/ torch", 8, ".2f"), ("ops/step", 9, ".0f")])
    print(table.header())
    base = statistics.median(times["torch"])
    for kind in sides:
        ms = statistics.median(times[kind])
        print(table.row(kind, ms * 1e3, ms / base, statistics.median(ops[kind])))
    worst = max(abs(a - b) for kind in sides for a, b in zip(losses[kind], losses["torch"]))
    print(f"largest loss difference from torch: {worst:.2e} over {len(losses['torch'])} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
