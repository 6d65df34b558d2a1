"""A GPT training step on 8 CPU devices, mesh (2, 4) data x model, against PyTorch/XLA 2.9, jax and eager torch.

The model: token + position embeddings, ``--layers`` pre-norm blocks (causal
``scaled_dot_product_attention`` with 4 heads, GELU MLP), final LayerNorm and LM head; vocabulary 512,
batch 8 x 64 tokens, cross-entropy, AdamW (torch's defaults, lr 1e-3). Batch sharded on ``data``,
attention and MLP weights Megatron-style on ``model``. Every side starts from the same weights and
data (numpy, seeded), so losses agree.

- ours: the model on ``pjrt:0`` (pjrt-plugin-cpu, 8 devices), ``xs.sync()`` per step; its step is
  split into tracing (forward, backward and optimizer recorded), key (the compile-cache lookup),
  execute (inside the executable) and after (bookkeeping of the results);
- PyTorch/XLA 2.9 (``--torch-xla-python``, an interpreter with torch_xla 2.9): the same module,
  ``xm.mark_step()`` then ``xm.wait_device_ops()``; its tracing is the time until ``mark_step``
  returns (it launches execution asynchronously);
- jax 0.10.2: the same model and AdamW written in jax, ``jax.jit`` with ``NamedSharding``;
- eager: the same module on the CPU (torch's own threads).

Peers run in worker processes (one XLA runtime per process); rounds interleave so machine load hits
every side alike, and the load average is printed. ``--sweep 1,2,4,...`` measures ours and PyTorch/XLA
at each depth and reports the per-layer slope of the step time and of the tracing overhead.

``--fused`` gives ours and eager torch ``AdamW(fused=True)`` (PyTorch/XLA keeps its foreach path).
``--compile`` adds a side "ours, torch.compile": the same model under ``torch.compile(backend="pjrt")``
(forward and backward recorded as one op each; the optimizer as without it). Its Python per traced op
divides its tracing CPU time by the ATen ops the eager ours records for the same step.

Run: python benchmarks/gpt_step.py [--d-model 64] [--layers 4] [--rounds 5] [--steps 5] [--fused] [--compile]
     [--torch-xla-python PATH] [--sweep 1,2,4,8,16,32]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from _measure import JaxWorker, Table, Worker, serve_commands

VOCAB = 512
HEADS = 4
BATCH = 8
SEQ = 64
LR = 1e-3
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 1e-2
MESH = ((2, 4), ("data", "model"))
#: Partition specs of the Megatron-sharded weights (the others are replicated), by name suffix.
WEIGHT_SPECS = {
    "attn.qkv.weight": ("model", None), "attn.qkv.bias": ("model",),
    "attn.proj.weight": (None, "model"),
    "mlp.fc.weight": ("model", None), "mlp.fc.bias": ("model",),
    "mlp.out.weight": (None, "model"),
}


@dataclass(frozen=True)
class Config:
    d_model: int
    layers: int

    def args(self) -> list[str]:
        return ["--d-model", str(self.d_model), "--layers", str(self.layers)]


def param_shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes, in the order of the torch module's ``named_parameters``."""
    d = cfg.d_model
    shapes = {"tok.weight": (VOCAB, d), "pos.weight": (SEQ, d)}
    for i in range(cfg.layers):
        p = f"blocks.{i}."
        shapes.update({
            p + "ln1.weight": (d,), p + "ln1.bias": (d,),
            p + "attn.qkv.weight": (3 * d, d), p + "attn.qkv.bias": (3 * d,),
            p + "attn.proj.weight": (d, d), p + "attn.proj.bias": (d,),
            p + "ln2.weight": (d,), p + "ln2.bias": (d,),
            p + "mlp.fc.weight": (4 * d, d), p + "mlp.fc.bias": (4 * d,),
            p + "mlp.out.weight": (d, 4 * d), p + "mlp.out.bias": (d,),
        })
    shapes.update({"ln_f.weight": (d,), "ln_f.bias": (d,), "head.weight": (VOCAB, d)})
    return shapes


def host_data(cfg: Config, seed: int = 0) -> tuple[dict, object, object]:
    """The same initial weights (GPT-2 style) and batch on every side, as numpy arrays."""
    import numpy as np

    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("bias"):
            params[name] = np.zeros(shape, np.float32)
        elif ".ln" in name or name.startswith("ln"):
            params[name] = np.ones(shape, np.float32)
        else:
            params[name] = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    tokens = rng.integers(0, VOCAB, (BATCH, SEQ + 1))
    return params, tokens[:, :-1].copy(), tokens[:, 1:].copy()


def spec_of(name: str) -> tuple:
    for suffix, spec in WEIGHT_SPECS.items():
        if name.endswith(suffix):
            return spec
    return (None,) * (1 if name.endswith(("bias", "ln1.weight", "ln2.weight", "ln_f.weight")) else 2)


# -- the torch model (ours, PyTorch/XLA, eager) ------------------------------------------------------


def torch_model(cfg: Config):
    """The GPT as a torch module with the weights of :func:`host_data`, on the CPU."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Attention(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class MLP(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.fc = nn.Linear(d, 4 * d)
            self.out = nn.Linear(4 * d, d)

        def forward(self, x):
            return self.out(F.gelu(self.fc(x)))

    class Block(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.ln1, self.attn = nn.LayerNorm(d), Attention(d)
            self.ln2, self.mlp = nn.LayerNorm(d), MLP(d)

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(VOCAB, cfg.d_model)
            self.pos = nn.Embedding(SEQ, cfg.d_model)
            self.blocks = nn.ModuleList(Block(cfg.d_model) for _ in range(cfg.layers))
            self.ln_f = nn.LayerNorm(cfg.d_model)
            self.head = nn.Linear(cfg.d_model, VOCAB, bias=False)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok(idx) + self.pos(pos)
            for block in self.blocks:
                x = block(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, VOCAB), targets.reshape(-1))

    model = GPT()
    params, _, _ = host_data(cfg)
    names = [n for n, _ in model.named_parameters()]
    assert names == list(params), "param_shapes does not match the torch module"
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(params[name]))
    return model


class TorchSide:
    """One torch training loop: eager CPU, ours (``pjrt``) or PyTorch/XLA (``xla``)."""

    def __init__(self, cfg: Config, kind: str, fused: bool = False, compiled: bool = False) -> None:
        import torch

        self.torch, self.kind = torch, kind
        _, idx, tgt = host_data(cfg)
        model = torch_model(cfg)
        idx, tgt = torch.from_numpy(idx), torch.from_numpy(tgt)
        self.sync: Callable[[], None] = lambda: None
        self.wait: Callable[[], None] = lambda: None
        self.split = None
        if kind == "pjrt":
            import pjrt_plugins.spmd as xs

            xs.set_plugin("cpu", options={"cpu_device_count": 8})
            mesh = xs.Mesh(range(8), *MESH)
            self.xs = xs
            self._setup(model, idx, tgt, "pjrt", xs.mark_sharding, mesh)
            self.sync = xs.sync
        elif kind == "xla":
            import torch_xla.core.xla_model as xm
            import torch_xla.distributed.spmd as xxs
            import torch_xla.runtime as xr

            xr.use_spmd()
            mesh = xxs.Mesh(list(range(8)), *MESH)
            self._setup(model, idx, tgt, xm.xla_device(), xxs.mark_sharding, mesh)
            self.sync, self.wait = xm.mark_step, xm.wait_device_ops
        else:
            self.model, self.idx, self.tgt = model, idx, tgt
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                     weight_decay=WEIGHT_DECAY, fused=fused or None)
        self.forward = torch.compile(self.model, backend="pjrt") if compiled else self.model
        self.loss = None
        self.run(2)  # the first step creates the optimizer state, the second is the steady-state program

    def _setup(self, model, idx, tgt, device, mark, mesh) -> None:
        self.model = model.to(device)
        for name, p in self.model.named_parameters():
            spec = spec_of(name)
            if any(s is not None for s in spec):
                mark(p, mesh, spec)
        self.idx = idx.to(device)
        self.tgt = tgt.to(device)
        mark(self.idx, mesh, ("data", None))
        mark(self.tgt, mesh, ("data", None))

    def run(self, steps: int) -> dict:
        clock, cpu = time.perf_counter, time.process_time
        times, tracing, tracing_cpu, splits = [], [], [], []
        pjrt = self.kind == "pjrt"
        ops_before = self.xs.metrics().ops_recorded if pjrt else 0
        for _ in range(steps):
            if pjrt:
                self.xs.metrics()  # nothing pending: keeps the engine's timers out of the next step
            c0, t0 = cpu(), clock()
            loss = self.forward(self.idx, self.tgt)
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            t1, c1 = clock(), cpu()
            self.sync()
            t2, c2 = clock(), cpu()
            self.wait()
            t3 = clock()
            times.append(t3 - t0)
            tracing.append((t2 if self.kind == "xla" else t1) - t0)
            tracing_cpu.append((c2 if self.kind == "xla" else c1) - c0)
            if pjrt:
                splits.append(_last_run_split())
            self.loss = loss
        out = {"times": times, "tracing": tracing, "tracing_cpu": tracing_cpu, "loss": float(self.loss.item())}
        if pjrt:
            out["split"] = splits
            out["ops"] = (self.xs.metrics().ops_recorded - ops_before) / steps
        return out


def _last_run_split() -> dict:
    """Seconds of the last ``sync``: cache key, execution, bookkeeping after (from the engine's timers)."""
    from pjrt_plugins.spmd import trace

    return dict(trace.last_run_timings())


# -- jax --------------------------------------------------------------------------------------------


def jax_worker(cfg: Config) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    params, idx, tgt = host_data(cfg)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(MESH[0]), MESH[1])
    shard = {k: NamedSharding(mesh, P(*spec_of(k))) for k in params}
    data_sharding = NamedSharding(mesh, P("data", None))
    p = {k: jax.device_put(v, shard[k]) for k, v in params.items()}
    state = {"p": p, "m": jax.tree.map(jnp.zeros_like, p), "v": jax.tree.map(jnp.zeros_like, p),
             "t": jnp.zeros((), jnp.float32)}
    idx, tgt = jax.device_put(idx, data_sharding), jax.device_put(tgt, data_sharding)
    hd = cfg.d_model // HEADS

    def layer_norm(x, w, b):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * w + b

    def linear(x, p, name, bias=True):
        y = x @ p[name + ".weight"].T
        return y + p[name + ".bias"] if bias else y

    def loss_fn(p, idx, tgt):
        b, t = idx.shape
        x = p["tok.weight"][idx] + p["pos.weight"][jnp.arange(t)]
        causal = jnp.tril(jnp.ones((t, t), bool))
        for i in range(cfg.layers):
            pre = f"blocks.{i}."
            h = layer_norm(x, p[pre + "ln1.weight"], p[pre + "ln1.bias"])
            q, k, v = jnp.split(linear(h, p, pre + "attn.qkv"), 3, axis=-1)
            q, k, v = (z.reshape(b, t, HEADS, hd).transpose(0, 2, 1, 3) for z in (q, k, v))
            att = jnp.where(causal, q @ k.swapaxes(-1, -2) / math.sqrt(hd), -jnp.inf)
            y = (jax.nn.softmax(att, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, cfg.d_model)
            x = x + linear(y, p, pre + "attn.proj")
            h = layer_norm(x, p[pre + "ln2.weight"], p[pre + "ln2.bias"])
            x = x + linear(jax.nn.gelu(linear(h, p, pre + "mlp.fc"), approximate=False), p, pre + "mlp.out")
        logits = linear(layer_norm(x, p["ln_f.weight"], p["ln_f.bias"]), p, "head", bias=False)
        logp = jax.nn.log_softmax(logits.reshape(-1, VOCAB), axis=-1)
        return -jnp.take_along_axis(logp, tgt.reshape(-1, 1), axis=1).mean()

    def step(state, idx, tgt):
        loss, grads = jax.value_and_grad(loss_fn)(state["p"], idx, tgt)
        t = state["t"] + 1
        b1, b2 = BETAS

        def adamw(p, g, m, v):  # torch.optim.AdamW's update
            p = p * (1 - LR * WEIGHT_DECAY)
            m = m + (g - m) * (1 - b1)
            v = v * b2 + (1 - b2) * g * g
            denom = jnp.sqrt(v) / jnp.sqrt(1 - b2 ** t) + EPS
            return p - (LR / (1 - b1 ** t)) * m / denom, m, v

        new = {k: adamw(state["p"][k], grads[k], state["m"][k], state["v"][k]) for k in grads}
        out = {"p": {k: n[0] for k, n in new.items()}, "m": {k: n[1] for k, n in new.items()},
               "v": {k: n[2] for k, n in new.items()}, "t": t}
        return out, loss

    state_sharding = {"p": shard, "m": shard, "v": shard, "t": NamedSharding(mesh, P())}
    train = jax.jit(step, in_shardings=(state_sharding, data_sharding, data_sharding),
                    out_shardings=(state_sharding, NamedSharding(mesh, P())), donate_argnums=(0,))
    state, loss = train(state, idx, tgt)
    state, loss = train(state, idx, tgt)
    loss.block_until_ready()

    def run(command: list[str]) -> dict:
        nonlocal state, loss
        if command[0] == "hlo":  # the optimized program (benchmarks/collectives.py counts its collectives)
            return {"hlo": train.lower(state, idx, tgt).compile().as_text()}
        times, dispatch, dispatch_cpu = [], [], []
        for _ in range(int(command[1])):
            c0, t0 = time.process_time(), time.perf_counter()
            state, loss = train(state, idx, tgt)
            t1, c1 = time.perf_counter(), time.process_time()
            loss.block_until_ready()
            times.append(time.perf_counter() - t0)
            dispatch.append(t1 - t0)
            dispatch_cpu.append(c1 - c0)
        return {"times": times, "tracing": dispatch, "tracing_cpu": dispatch_cpu, "loss": float(loss)}

    return serve_commands({"ready": len(jax.devices()), "version": jax.__version__}, run)


# -- PyTorch/XLA ------------------------------------------------------------------------------------


def torch_xla_worker(cfg: Config) -> int:
    import torch
    import torch_xla

    side = TorchSide(cfg, "xla")
    return serve_commands({"ready": 8, "version": torch_xla.__version__, "torch": torch.__version__},
                          lambda words: side.run(int(words[1])))


def torch_xla_env() -> dict[str, str]:
    return {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8", "TF_CPP_MIN_LOG_LEVEL": "3",
            "PYTHONWARNINGS": "ignore", "XLA_USE_SPMD": "1"}


# -- main -------------------------------------------------------------------------------------------


def _median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def _load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


COMPILED = "ours, torch.compile"


def compare(cfg: Config, args: argparse.Namespace) -> None:
    """The step of every side at one size, interleaved, with our split."""
    print(f"GPT d_model {cfg.d_model}, {cfg.layers} layers, vocab {VOCAB}, batch {BATCH}x{SEQ}, "
          f"AdamW{' (fused=True for ours and eager)' if args.fused else ''}"
          f"{', ours also under torch.compile' if args.compile else ''}, "
          f"mesh (2, 4), 8 CPU devices; {os.cpu_count()} cpus, {_load()}", flush=True)
    import torch

    peers: dict[str, Worker] = {}
    try:
        if args.torch_xla_python:
            t0 = time.perf_counter()
            peers["PyTorch/XLA"] = Worker(__file__, cfg.args(), flag="--torch-xla-worker",
                                          python=args.torch_xla_python, env=torch_xla_env())
            print(f"PyTorch/XLA {peers['PyTorch/XLA'].info['version']} (torch {peers['PyTorch/XLA'].info['torch']}) "
                  f"ready in {time.perf_counter() - t0:.1f} s", flush=True)
        if not args.no_jax:
            t0 = time.perf_counter()
            peers["jax"] = JaxWorker(__file__, cfg.args(), devices=8)
            print(f"jax {peers['jax'].info['version']} ready in {time.perf_counter() - t0:.1f} s", flush=True)
        t0 = time.perf_counter()
        ours = TorchSide(cfg, "pjrt", args.fused)
        print(f"ours ready in {time.perf_counter() - t0:.1f} s (two steps traced, compiled, run)", flush=True)
        sides = {"ours": ours}
        if args.compile:
            t0 = time.perf_counter()
            sides[COMPILED] = TorchSide(cfg, "pjrt", args.fused, compiled=True)
            print(f"{COMPILED} ready in {time.perf_counter() - t0:.1f} s", flush=True)
        eager = TorchSide(cfg, "cpu", args.fused)
        results: dict[str, dict[str, list]] = {}

        def add(name: str, r: dict) -> None:
            acc = results.setdefault(name, {})
            for k, v in r.items():
                acc.setdefault(k, []).extend(v if isinstance(v, list) else [v])

        for r in range(args.rounds):
            line = []
            for name, worker in peers.items():
                add(name, worker.request("run", args.steps))
            for name, side in sides.items():
                add(name, side.run(args.steps))
            add("eager torch", eager.run(args.steps))
            for name in results:
                line.append(f"{name} {_median_ms(results[name]['times'][-args.steps:]):.1f} ms "
                            f"(loss {results[name]['loss'][-1]:.5f})")
            print(f"  round {r + 1} ({_load()}): " + ", ".join(line), flush=True)
    finally:
        for worker in peers.values():
            worker.close()

    ours_step = _median_ms(results["ours"]["times"])
    ops = statistics.median(results["ours"]["ops"])
    table = Table([("side", 24, ""), ("step ms", 9, ".1f"), ("best ms", 9, ".1f"), ("tracing ms", 11, ".1f"),
                   ("tracing CPU ms", 15, ".1f"), ("ours / side", 12, ".2f")])
    print()
    print(table.header())
    for name, r in results.items():
        step = _median_ms(r["times"])
        print(table.row(name, step, min(r["times"]) * 1e3, _median_ms(r["tracing"]), _median_ms(r["tracing_cpu"]),
                        ours_step / step))
    split = results["ours"]["split"]
    parts = {k: [s[k] for s in split] for k in split[0]}
    print()
    print(f"our step split (medians over {len(split)} steps, {ops:.0f} ops recorded per step)")
    split_table = Table([("part", 24, ""), ("ms", 9, ".2f"), ("us per op", 10, ".1f")])
    print(split_table.header())
    tracing = results["ours"]["tracing"]
    print(split_table.row("tracing", _median_ms(tracing), statistics.median(tracing) / ops * 1e6))
    tracing_cpu = results["ours"]["tracing_cpu"]
    print(split_table.row("tracing, CPU time", _median_ms(tracing_cpu), statistics.median(tracing_cpu) / ops * 1e6))
    for k, v in parts.items():
        print(split_table.row(k, _median_ms(v), statistics.median(v) / ops * 1e6))
    overhead = [t - s["execute"] for t, s in zip(results["ours"]["times"], split)]
    print(split_table.row("python (step - execute)", _median_ms(overhead), statistics.median(overhead) / ops * 1e6))
    losses = {name: r["loss"][-1] for name, r in results.items()}
    print("last losses: " + ", ".join(f"{k} {v:.5f}" for k, v in losses.items()))
    print()
    goals = [(f"step / {name}", ours_step / _median_ms(results[name]["times"]), goal)
             for name, goal in (("PyTorch/XLA", 0.8), ("jax", 2.0)) if name in results]
    goals.append(("tracing CPU us per op", statistics.median(tracing_cpu) / ops * 1e6, 15.0))
    if COMPILED in results:
        compiled = results[COMPILED]
        compiled_step = _median_ms(compiled["times"])
        print(f"{COMPILED}: {statistics.median(compiled['ops']):.0f} ops recorded per step; tracing CPU "
              f"{_median_ms(compiled['tracing_cpu']):.2f} ms, {statistics.median(compiled['tracing_cpu']) / ops * 1e6:.1f} "
              f"us per ATen op of the eager step ({ops:.0f})")
        goals += [(f"{COMPILED} step / {name}", compiled_step / _median_ms(results[name]["times"]), goal)
                  for name, goal in (("PyTorch/XLA", 0.8), ("jax", 2.0)) if name in results]
        goals.append((f"{COMPILED} tracing CPU us per op", statistics.median(compiled["tracing_cpu"]) / ops * 1e6, 15.0))
    for name, value, goal in goals:
        print(f"goal {name} <= {goal:g}: {value:.2f} -> {'met' if value <= goal else 'not met'}")
    print(f"done ({_load()})")


def _slope(xs: list[int], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def sweep(d_model: int, depths: list[int], args: argparse.Namespace) -> None:
    """Ours and PyTorch/XLA at each depth: step time and tracing overhead, and their slopes per layer."""
    print(f"depth sweep: GPT d_model {d_model}, layers {depths}; {os.cpu_count()} cpus, {_load()}", flush=True)
    rows = []
    for layers in depths:
        cfg = Config(d_model, layers)
        worker = None
        try:
            if args.torch_xla_python:
                worker = Worker(__file__, cfg.args(), flag="--torch-xla-worker", python=args.torch_xla_python,
                                env=torch_xla_env())
            ours = TorchSide(cfg, "pjrt")
            acc: dict[str, list[float]] = {"ours": [], "ours_over": [], "ours_cpu": [], "xla": [], "xla_trace": [],
                                           "xla_cpu": []}
            for _ in range(args.rounds):
                if worker is not None:
                    x = worker.request("run", args.steps)
                    acc["xla"] += x["times"]
                    acc["xla_trace"] += x["tracing"]
                    acc["xla_cpu"] += x["tracing_cpu"]
                o = ours.run(args.steps)
                acc["ours"] += o["times"]
                acc["ours_over"] += [t - s["execute"] for t, s in zip(o["times"], o["split"])]
                acc["ours_cpu"] += o["tracing_cpu"]
        finally:
            if worker is not None:
                worker.close()
        med = {k: (_median_ms(v) if v else float("nan")) for k, v in acc.items()}
        rows.append((layers, med))
        print(f"  {layers:>2} layers ({_load()}): ours {med['ours']:.1f} ms (python {med['ours_over']:.1f}, tracing "
              f"CPU {med['ours_cpu']:.1f}), PyTorch/XLA {med['xla']:.1f} ms (tracing {med['xla_trace']:.1f}, CPU "
              f"{med['xla_cpu']:.1f})", flush=True)
        ours.xs.clear_compile_cache()
    table = Table([("layers", 8, ""), ("ours ms", 9, ".1f"), ("ours python", 12, ".1f"), ("ours trace CPU", 15, ".1f"),
                   ("XLA ms", 9, ".1f"), ("XLA tracing", 12, ".1f"), ("XLA trace CPU", 14, ".1f"),
                   ("ours/XLA", 9, ".2f")])
    print()
    print(table.header())
    for layers, m in rows:
        print(table.row(str(layers), m["ours"], m["ours_over"], m["ours_cpu"], m["xla"], m["xla_trace"], m["xla_cpu"],
                        m["ours"] / m["xla"]))
    layers = [r[0] for r in rows]
    if len(rows) > 1:
        slopes = {k: _slope(layers, [r[1][k] for r in rows]) for k in rows[0][1]}
        print(f"slope per layer: step ours {slopes['ours']:.2f} ms, PyTorch/XLA {slopes['xla']:.2f} ms "
              f"(ratio {slopes['ours'] / slopes['xla']:.2f}); overhead ours {slopes['ours_over']:.2f} ms, "
              f"PyTorch/XLA tracing {slopes['xla_trace']:.2f} ms (ratio {slopes['ours_over'] / slopes['xla_trace']:.2f}); "
              f"tracing CPU ours {slopes['ours_cpu']:.2f} ms, PyTorch/XLA {slopes['xla_cpu']:.2f} ms "
              f"(ratio {slopes['ours_cpu'] / slopes['xla_cpu']:.2f})")
        # Linear: the per-layer cost of the deeper half is close to that of the shallower half.
        half = len(rows) // 2
        if half >= 2 and len(rows) - half >= 2:
            lo, hi = (_slope(layers[a:b], [r[1]["ours_cpu"] for r in rows[a:b]]) for a, b in ((0, half), (half, None)))
            print(f"ours tracing CPU per layer: {lo:.2f} ms up to {layers[half - 1]} layers, {hi:.2f} ms from "
                  f"{layers[half]} (ratio {hi / lo:.2f}; 1.00 is linear)")
    print(f"done ({_load()})")


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """The model size and the rounds of steps measured (shared with tracing_floor.py)."""
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps per round and side")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(parser)
    parser.add_argument("--torch-xla-python", default=os.environ.get("TORCH_XLA_PYTHON"),
                        help="an interpreter with torch_xla 2.9 (default: $TORCH_XLA_PYTHON; none: skip it)")
    parser.add_argument("--no-jax", action="store_true", help="skip the jax side")
    parser.add_argument("--fused", action="store_true",
                        help="AdamW(fused=True) for ours and eager torch (one recorded op per optimizer step)")
    parser.add_argument("--compile", action="store_true",
                        help='also run ours under torch.compile(backend="pjrt") (forward and backward one op each)')
    parser.add_argument("--sweep", default=None, help="comma-separated depths: run the depth sweep instead")
    parser.add_argument("--jax-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--torch-xla-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cfg = Config(args.d_model, args.layers)
    if args.jax_worker:
        return jax_worker(cfg)
    if args.torch_xla_worker:
        return torch_xla_worker(cfg)
    if args.sweep:
        sweep(args.d_model, [int(x) for x in args.sweep.split(",")], args)
    else:
        compare(cfg, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
