"""The experts paths of a transformers Mixtral on 8 CPU devices: programs compiled per training step, CPU
fallbacks, tokens dropped and step time against CPU eager.

The model is the tiny Mixtral of ``tests/models`` (one layer, hidden 32, 4 experts, top-2, vocabulary 64), the
batch 8 x 8 tokens sharded on an ``(8,)`` data mesh, plain SGD. Each path trains ``--steps`` steps on new random
batches (so the routing changes every step); for each step the script prints the programs compiled
(``xs.metrics().compiles``) and the CPU fallbacks, then the median step time of the steps after the first two
against the same model in CPU eager. Paths: transformers' ``eager`` (``nonzero`` in a loop over the experts),
``grouped_mm`` (its default: sort + ``aten._grouped_mm``), ``batched_mm`` (each choice gathers its expert's
weights) and ``pjrt_plugins.spmd.moe.capacity_experts`` with no drop and with a capacity factor of 1.0.

Why: a training loop with data-dependent routing must stop compiling after its first steps (issue 29). The counts
are the behaviour; the times measure only (never asserted).

Run: python benchmarks/moe_paths.py [--steps 8] [--paths eager,grouped_mm,...] [--large]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a config, random weights: nothing to download

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.integrations.moe import ExpertsInterface  # noqa: E402

import pjrt_plugins.spmd as xs  # noqa: E402
from pjrt_plugins.spmd import moe  # noqa: E402
from _measure import Table  # noqa: E402

VOCAB, BATCH, LR = 64, 8, 0.1
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2)
#: ``--large``: 8 experts of hidden 128 / intermediate 512, 8 x 64 tokens (where the experts' FLOPs dominate).
LARGE = dict(hidden_size=128, intermediate_size=512, num_local_experts=8)
PATHS = {"eager": "eager", "grouped_mm": "grouped_mm", "batched_mm": "batched_mm",
         "capacity (no drop)": "pjrt_capacity", "capacity 1.0": "pjrt_capacity_1"}


def _register() -> None:
    ExpertsInterface.register("pjrt_capacity", moe.capacity_experts())
    ExpertsInterface.register("pjrt_capacity_1", moe.capacity_experts(1.0))


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor) -> torch.Tensor:
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def run_path(implementation: str, steps: int, mesh: xs.Mesh, large: bool) -> dict[str, object]:
    torch.manual_seed(0)
    config = transformers.MixtralConfig(**{**CONFIG, **(LARGE if large else {})})
    seq = 64 if large else 8
    cpu = transformers.AutoModelForCausalLM.from_config(config, experts_implementation=implementation).train()
    dev = copy.deepcopy(cpu).to("pjrt")
    opt_cpu, opt_dev = torch.optim.SGD(cpu.parameters(), lr=LR), torch.optim.SGD(dev.parameters(), lr=LR)
    g = torch.Generator().manual_seed(1)
    compiles, fallbacks, t_dev, t_cpu, worst = [], [], [], [], 0.0
    for _ in range(steps):
        ids = torch.randint(0, VOCAB, (BATCH, seq), generator=g)
        start = time.perf_counter()
        want = _step(cpu, opt_cpu, ids).item()
        t_cpu.append(time.perf_counter() - start)
        before = xs.metrics()
        start = time.perf_counter()
        got = _step(dev, opt_dev, xs.mark_sharding(ids.to("pjrt"), mesh, ("data", None))).item()
        t_dev.append(time.perf_counter() - start)
        after = xs.metrics()
        compiles.append(after.compiles - before.compiles)
        fallbacks.append(after.fallbacks - before.fallbacks)
        worst = max(worst, abs(got - want) / abs(want))
    return {"compiles": compiles, "fallbacks": fallbacks, "ms": 1e3 * statistics.median(t_dev[2:]),
            "cpu_ms": 1e3 * statistics.median(t_cpu[2:]), "loss_rel_err": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated, from: " + ", ".join(PATHS))
    parser.add_argument("--large", action="store_true", help="8 experts, hidden 128, 8 x 64 tokens")
    args = parser.parse_args()
    if args.steps < 3:
        parser.error("--steps must be at least 3 (the first two steps are not timed)")
    xs.set_plugin("cpu", options={"cpu_device_count": 8})
    mesh = xs.Mesh(range(8), (8,), ("data",))
    _register()
    warnings.simplefilter("ignore")  # the eager path's fallback warning: counted below instead
    table = Table([("experts path", 20, ""), ("ms/step", 9, ".1f"), ("CPU ms", 8, ".1f"), ("ratio", 7, ".2f"),
                   ("loss err", 9, ".1e")])
    rows = []
    for name in args.paths.split(","):
        r = run_path(PATHS[name], args.steps, mesh, args.large)
        print(f"{name}: compiles per step {r['compiles']}, CPU fallbacks per step {r['fallbacks']}", flush=True)
        rows.append(table.row(name, r["ms"], r["cpu_ms"], r["ms"] / r["cpu_ms"], r["loss_rel_err"]))
    print(f"\nload {os.getloadavg()[0]:.1f}; median step after the first two, 8 CPU devices")
    print(table.header())
    print("\n".join(rows))


if __name__ == "__main__":
    main()
