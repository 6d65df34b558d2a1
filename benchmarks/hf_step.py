"""A transformers Llama training step on 8 CPU devices: ours eager and compiled, against PyTorch/XLA 2.9 and torchax.

The model is transformers' ``LlamaForCausalLM`` built from its config (4 layers, hidden 128, 4 query heads sharing
2 key/value heads, MLP 512, vocabulary 512; ``use_cache=False``: a training step needs no KV cache, and the peers
then run the same graph), batch 8 x 64 tokens without an attention mask, the model's own
cross-entropy loss, AdamW (lr 1e-3, weight decay 0.01). Two meshes: ``(8,)`` data-parallel (the batch sharded), and
``(2, 4)`` data x model with the MLP Megatron-sharded (gate and up projections by rows, down projection by
columns). Every side starts from the same weights (numpy, seeded) and data, so their losses agree.

- ours: the model on ``pjrt:0`` (pjrt-plugin-cpu, 8 devices), ``xs.sync()`` per step, eager and under
  ``torch.compile(backend="pjrt")``. Our step is split into Python (the step's wall time outside the executables),
  execute (inside them), and the key and after of its last program (``last_run_timings``);
- PyTorch/XLA 2.9 (``--torch-xla-python``, an interpreter with torch_xla 2.9 and transformers, e.g. from
  ``../shared/tools/torch-xla-2.9-venv.sh`` plus ``pip install transformers==5.24.0``): the same module,
  ``xm.mark_step()`` then ``xm.wait_device_ops()``;
- torchax (``--torchax-python``, an interpreter from ``benchmarks/envs/torchax-venv.sh``): the same module run by
  torchax under ``jax.jit`` (``torch.func.functional_call`` viewed as a jax function, ``jax.value_and_grad``, torch's
  AdamW update written in jax), weights and batch placed with ``NamedSharding``.

Peers run in worker processes (one XLA runtime per process); rounds interleave so machine load hits every side
alike, and the load average is printed. After the table: programs per step, and the collective, fusion and dot
counts of each side's optimized step program (HLO text: ours from the plugin, torchax from jax; PyTorch/XLA's is not
read). Measures only; never asserts a timing.

``--dump-programs DIR`` also writes the StableHLO of our compiled step and of torchax's (each with its own
partitioner's shardings, Shardy on both sides today) for each mesh; ``xla_cross_compile.py DIR/*.mlir`` then runs both
programs on both compilers (the plugin's XLA and jaxlib's), which tells a slower program from a slower compiler, and
``hf_step_ops.py DIR/*.mlir`` splits each program's execution into its ops. ``hf_step_executables.py`` times our
compiled step's executable, that of ``FunctionalSide`` (torchax's step math traced by our engine) and torchax's, each in
its step and alone on both compilers.

``--torchax-without-donation`` adds torchax's step jitted without ``donate_argnums``: every step then writes its
state to new buffers. ``--ours-without-donation`` adds our compiled step with ``xs.set_donation(False)`` (our engine
donates the parameters and optimizer state a step replaces in place by default). Together they size what donation
is worth on each side.
``--fused`` gives ours ``AdamW(fused=True)``: the whole update is one recorded op instead of torch's foreach ops.
``--compiled-optimizer`` adds ours with the optimizer step compiled too (``torch.compile(opt.step, backend="pjrt")``,
torch's recipe, and ``AdamW(capturable=True)``): the AdamW update becomes one traced region, as in torchax's jitted
step.
``--captured`` adds ours eager and compiled with the whole step (forward, backward, AdamW with ``capturable=True``,
``zero_grad``) under ``xs.capture_step``: traced until two calls agree, then replayed without its Python, as torchax
runs one jitted function per step. They warm up with one step more than the other sides (the first makes AdamW's
state, the next two must agree to be recorded), so their last loss is one step further. ``--captured-only`` runs only
the compiled one of ours: every program in a process holding several of our sides' models and optimizer state runs a
few percent slower (``hf_step_executables.py``), so with one mesh it gives ours a process of its own, as each peer has.
``--phases`` runs only our compiled step and splits its Python phase by phase (forward, backward, optimizer,
``zero_grad``, the sync around the executable, the garbage collector's time).
``--processes N`` runs every side, ours too, in N worker processes, created round-robin with another side first
each time, and gives each side the median of its processes' medians, with a table of each process's. On the
development machine a process runs the same program at its own speed for its whole life, the first ones created in
a burst up to 25 % more CPU time (docs/benchmarks.md, "Processes"): with one process per side, which side drew the
slow process moves a ratio more than anything a side does.

Every round starts with another side (rotated), since a side's time also depends on which ran just before it.

Run: python benchmarks/hf_step.py [--rounds 5] [--steps 5] [--torch-xla-python PATH] [--torchax-python PATH]
     [--meshes data,megatron] [--fused] [--torchax-without-donation] [--ours-without-donation]
     [--dump-programs DIR] [--compiled-optimizer] [--captured] [--captured-only] [--phases] [--processes N]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from typing import Any

from _measure import Table, Worker, serve_commands

VOCAB = 512
HIDDEN = 128
LAYERS = 4
HEADS, KV_HEADS = 4, 2
MLP = 512
BATCH, SEQ = 8, 64
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 1e-2
MESHES = {"data": ((8,), ("data",)), "megatron": ((2, 4), ("data", "model"))}
#: Partition specs of the Megatron-sharded weights by name suffix (others are replicated), on the megatron mesh.
MEGATRON = {"mlp.gate_proj.weight": ("model", None), "mlp.up_proj.weight": ("model", None),
            "mlp.down_proj.weight": (None, "model")}
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def llama_config() -> Any:
    import transformers

    return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=MLP,
                                    num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                                    num_key_value_heads=KV_HEADS, max_position_embeddings=SEQ, use_cache=False)


def build_model() -> Any:
    """The Llama on the CPU with the same weights on every side (numpy, seeded; norms start at one)."""
    import numpy as np
    import torch
    import transformers

    model = transformers.LlamaForCausalLM(llama_config())
    rng = np.random.default_rng(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.copy_(torch.from_numpy((rng.standard_normal(tuple(p.shape)) * 0.02).astype(np.float32)))
    return model


def batch() -> tuple[Any, Any]:
    """Token ids (the labels are the same ids: the model shifts them) as numpy int64."""
    import numpy as np

    tokens = np.random.default_rng(1).integers(0, VOCAB, (BATCH, SEQ))
    return tokens, tokens.copy()


def spec_of(name: str, mesh: str) -> tuple | None:
    """The partition spec of a parameter on ``mesh``; None when it is replicated."""
    if mesh == "megatron":
        for suffix, spec in MEGATRON.items():
            if name.endswith(suffix):
                return spec
    return None


def hlo_counts(text: str) -> dict[str, int]:
    """Collectives (by kind, async starts included), fusions, dots and custom calls in optimized HLO text."""
    counts = {kind: len(re.findall(rf"\s{kind}(?:-start)?\(", text)) for kind in COLLECTIVES}
    counts["fusion"] = len(re.findall(r"\sfusion\(", text))
    counts["dot"] = len(re.findall(r"\sdot\(", text))
    counts["custom-call"] = len(re.findall(r"\scustom-call\(", text))
    return counts


# -- torch sides: ours (pjrt) and PyTorch/XLA ---------------------------------------------------------


class TorchSide:
    """One torch training loop on ``pjrt`` (ours, eager or compiled) or ``xla`` (PyTorch/XLA)."""

    def __init__(self, kind: str, mesh_name: str, compiled: bool = False, fused: bool = False,
                 donate: bool = True, compiled_optimizer: bool = False, captured: bool = False) -> None:
        import torch

        self.kind = kind
        self.donate = donate
        shape, axes = MESHES[mesh_name]
        ids, labels = (torch.from_numpy(a) for a in batch())
        model = build_model()
        self.sync = self.wait = lambda: None
        if kind == "pjrt":
            import pjrt_plugins.spmd as xs

            self.xs = xs
            xs.set_plugin("cpu", options={"cpu_device_count": 8})
            xs.set_donation(donate)
            device, mark, mesh = "pjrt", xs.mark_sharding, xs.Mesh(range(8), shape, axes)
            self.sync = xs.sync
        else:
            import torch_xla.core.xla_model as xm
            import torch_xla.distributed.spmd as xxs
            import torch_xla.runtime as xr

            xr.use_spmd()
            device, mark, mesh = xm.xla_device(), xxs.mark_sharding, xxs.Mesh(list(range(8)), shape, axes)
            self.sync, self.wait = xm.mark_step, xm.wait_device_ops
        self.model = model.to(device)
        for name, p in self.model.named_parameters():
            spec = spec_of(name, mesh_name)
            if spec is not None:
                mark(p, mesh, spec)
        self.ids, self.labels = ids.to(device), labels.to(device)
        for t in (self.ids, self.labels):
            mark(t, mesh, ("data", None))
        # compiled, AdamW keeps its step counters on the device (capturable): CPU counters make the update no region
        # captured, it must too: a replayed step keeps the Python numbers of the call it recorded
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY,
                                     fused=fused or None, capturable=compiled_optimizer or captured)
        self.forward = torch.compile(self.model, backend="pjrt") if compiled else self.model
        # torch's recipe for compiling an optimizer step: the update becomes one traced region instead of foreach ops
        self.step = torch.compile(self.opt.step, backend="pjrt") if compiled_optimizer else self.opt.step
        self.loss = None
        self.captured = self.xs.capture_step(self._detached_step) if captured else None
        # the first step makes the optimizer state; the second runs the steady-state program(s), which a captured
        # step records on the third
        self.run(3 if captured else 2)

    def _detached_step(self, ids: Any, labels: Any) -> Any:
        return self.train_step(ids, labels).detach()  # a captured step returns no autograd history

    def train_step(self, ids: Any, labels: Any) -> Any:
        """Forward, backward, the optimizer step and ``zero_grad``, before the sync; returns the loss."""
        loss = self.forward(input_ids=ids, labels=labels).loss
        loss.backward()
        self.step()
        self.opt.zero_grad()
        return loss

    def run(self, steps: int) -> dict[str, Any]:
        clock = time.perf_counter
        out: dict[str, list] = {"times": [], "execute": [], "programs": [], "ops": [], "key": [], "after": [],
                               "donated": []}
        pjrt = self.kind == "pjrt"
        if pjrt:
            self.xs.set_donation(self.donate)  # sides share the process: each runs with its own setting
        for _ in range(steps):
            before = self.xs.metrics() if pjrt else None
            t0 = clock()
            if self.captured is not None:  # syncs as its last step
                loss = self.captured(self.ids, self.labels)
            else:
                loss = self.train_step(self.ids, self.labels)
                self.sync()
                self.wait()
            out["times"].append(clock() - t0)
            if pjrt:
                after = self.xs.metrics()
                out["execute"].append(after.execute_seconds - before.execute_seconds)
                out["programs"].append(after.executions - before.executions)
                out["ops"].append(after.ops_recorded - before.ops_recorded)
                out["donated"].append(after.donated_buffers - before.donated_buffers)
                split = _last_run_split()
                out["key"].append(split.get("key", float("nan")))
                out["after"].append(split.get("after", float("nan")))
            self.loss = loss
        out["loss"] = [float(self.loss.item())]
        return out


class FunctionalSide(TorchSide):
    """torchax's step math run by our engine: ``torch.func.functional_call`` under ``torch.func.grad_and_value``, the
    AdamW update written out as in :func:`torchax_worker`, traced op by op (eager) and run as one program by
    ``xs.sync()``. The state is updated in place (``copy_``), so our engine donates it as torchax's
    ``donate_argnums`` does. Against ``TorchSide(compiled=True)`` it tells the torch.compile step's structure
    (AOTAutograd's regions, foreach AdamW) from the lowering of the same math."""

    def __init__(self, mesh_name: str) -> None:  # TorchSide's __init__ not called: no optimizer, no compile
        import pjrt_plugins.spmd as xs
        import torch

        self.kind, self.donate, self.xs, self.sync, self.wait = "pjrt", True, xs, xs.sync, (lambda: None)
        self.captured = None
        shape, axes = MESHES[mesh_name]
        xs.set_plugin("cpu", options={"cpu_device_count": 8})
        mesh = xs.Mesh(range(8), shape, axes)
        self.model = build_model().to("pjrt")
        for name, p in self.model.named_parameters():
            spec = spec_of(name, mesh_name)
            if spec is not None:
                xs.mark_sharding(p, mesh, spec)
        self.ids, self.labels = (torch.from_numpy(a).to("pjrt") for a in batch())
        for t in (self.ids, self.labels):
            xs.mark_sharding(t, mesh, ("data", None))
        self.buffers = dict(self.model.named_buffers())
        self.p = {n: q.detach() for n, q in self.model.named_parameters()}
        self.m = {n: torch.zeros_like(q) for n, q in self.p.items()}
        self.v = {n: torch.zeros_like(q) for n, q in self.p.items()}
        self.t = torch.zeros((), device="pjrt")
        self.loss = None
        self.run(2)

    def _loss(self, weights: dict, ids: Any, labels: Any) -> Any:
        import torch

        return torch.func.functional_call(self.model, {**weights, **self.buffers}, (),
                                          {"input_ids": ids, "labels": labels}).loss

    def train_step(self, ids: Any, labels: Any) -> Any:
        """Gradients and the AdamW update of :func:`torchax_worker`, in place; returns the loss."""
        import torch

        grads, loss = torch.func.grad_and_value(self._loss)(self.p, ids, labels)
        t = self.t + 1
        b1, b2 = BETAS
        for k, w in self.p.items():
            g, m, v = grads[k], self.m[k], self.v[k]
            new_m = m + (g - m) * (1 - b1)
            new_v = v * b2 + (1 - b2) * g * g
            denom = torch.sqrt(new_v) / torch.sqrt(1 - b2 ** t) + EPS
            w.copy_(w * (1 - LR * WEIGHT_DECAY) - (LR / (1 - b1 ** t)) * new_m / denom)
            m.copy_(new_m)
            v.copy_(new_v)
        self.t.copy_(t)
        return loss


def _last_run_split() -> dict[str, float]:
    """Seconds of the last program's cache key and bookkeeping after it (the engine's timers)."""
    from pjrt_plugins.spmd import trace

    return dict(trace.last_run_timings())


def _our_programs() -> dict[Any, Any]:
    """The programs in our compile cache by key (to find those a side compiled)."""
    from pjrt_plugins.spmd import execution

    return dict(execution.PROGRAMS.programs)


def _largest_hlo(programs: list[Any]) -> str:
    """The optimized HLO text of the largest of ``programs`` (the training step's)."""
    from jaxlib import xla_client

    texts = []
    for program in programs:
        try:
            proto = program.executable.optimized_hlo_module()
        except (AttributeError, NotImplementedError, ValueError):
            continue
        texts.append(xla_client.hlo.HloModule.from_serialized_hlo_module_proto(proto).to_string())
    return max(texts, key=len, default="")


# -- workers ------------------------------------------------------------------------------------------


def torch_xla_worker(mesh_name: str) -> int:
    import torch
    import torch_xla
    import transformers

    side = TorchSide("xla", mesh_name)
    return serve_commands({"version": torch_xla.__version__, "torch": torch.__version__,
                           "transformers": transformers.__version__},
                          lambda words: side.run(int(words[1])))


def torchax_worker(mesh_name: str, dump: str | None = None, donate: bool = True) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    import torchax
    import transformers
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from torchax.interop import jax_view

    shape, axes = MESHES[mesh_name]
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(shape), axes)
    model = build_model()
    names = [n for n, _ in model.named_parameters()]
    params = {n: p.detach().numpy() for n, p in model.named_parameters()}
    torchax.enable_globally()
    model.to("jax")
    buffers = {n: jax_view(b) for n, b in model.named_buffers()}

    def shard(name: str) -> NamedSharding:
        return NamedSharding(mesh, P(*(spec_of(name, mesh_name) or ())))

    p = {n: jax.device_put(params[n], shard(n)) for n in names}
    data = NamedSharding(mesh, P("data", None))
    ids, labels = (jax.device_put(a, data) for a in batch())

    def loss_torch(weights: dict, bufs: dict, ids: Any, labels: Any) -> Any:
        return torch.func.functional_call(model, {**weights, **bufs}, (), {"input_ids": ids, "labels": labels}).loss

    loss_jax = jax_view(loss_torch)

    def step(state: dict, ids: Any, labels: Any) -> tuple[dict, Any]:
        loss, grads = jax.value_and_grad(loss_jax)(state["p"], buffers, ids, labels)
        t = state["t"] + 1
        b1, b2 = BETAS

        def adamw(w, g, m, v):  # torch.optim.AdamW's update
            w = w * (1 - LR * WEIGHT_DECAY)
            m = m + (g - m) * (1 - b1)
            v = v * b2 + (1 - b2) * g * g
            denom = jnp.sqrt(v) / jnp.sqrt(1 - b2 ** t) + EPS
            return w - (LR / (1 - b1 ** t)) * m / denom, m, v

        new = {k: adamw(state["p"][k], grads[k], state["m"][k], state["v"][k]) for k in grads}
        return ({"p": {k: n[0] for k, n in new.items()}, "m": {k: n[1] for k, n in new.items()},
                 "v": {k: n[2] for k, n in new.items()}, "t": t}, loss)

    shardings = {n: shard(n) for n in names}
    state_sharding = {"p": shardings, "m": shardings, "v": shardings, "t": NamedSharding(mesh, P())}
    state = {"p": p, "m": jax.tree.map(jnp.zeros_like, p), "v": jax.tree.map(jnp.zeros_like, p),
             "t": jnp.zeros((), jnp.float32)}
    train = jax.jit(step, in_shardings=(state_sharding, data, data),
                    out_shardings=(state_sharding, NamedSharding(mesh, P())), donate_argnums=(0,) if donate else ())
    hlo = train.lower(state, ids, labels).compile().as_text()
    if dump:  # StableHLO with jax's shardings, which the CPU plugin's XLA compiles too (xla_cross_compile.py)
        text = train.lower(state, ids, labels).as_text()  # jax's partitioner, as the timed step (Shardy)
        with open(os.path.join(dump, f"torchax-{mesh_name}.mlir"), "w") as f:
            f.write(text)
    loss = None
    for _ in range(2):
        state, loss = train(state, ids, labels)
    loss.block_until_ready()

    def run(command: list[str]) -> dict:
        nonlocal state, loss
        times, dispatch = [], []
        for _ in range(int(command[1])):
            t0 = time.perf_counter()
            state, loss = train(state, ids, labels)
            t1 = time.perf_counter()
            loss.block_until_ready()
            times.append(time.perf_counter() - t0)
            dispatch.append(t1 - t0)
        return {"times": times, "dispatch": dispatch, "loss": [float(loss)]}

    return serve_commands({"version": torchax.__version__, "jax": jax.__version__, "torch": torch.__version__,
                           "transformers": transformers.__version__, "hlo": hlo_counts(hlo)}, run)


def torchax_env() -> dict[str, str]:
    return {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore",
            "XLA_FLAGS": (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()}


def torch_xla_env() -> dict[str, str]:
    return {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8", "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore",
            "XLA_USE_SPMD": "1"}


# -- main ---------------------------------------------------------------------------------------------


def _ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def _load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


EAGER, COMPILED, XLA, TORCHAX = "ours eager", "ours torch.compile", "PyTorch/XLA", "torchax"
TORCHAX_NO_DONATION = "torchax, no donation"
COMPILED_NO_DONATION = "ours torch.compile, no donation"
COMPILED_OPTIMIZER = "ours torch.compile + compiled AdamW"
EAGER_CAPTURED, COMPILED_CAPTURED = "ours eager, captured", "ours torch.compile, captured"


#: Our sides by name: (compiled, donate, compiled optimizer, captured).
OUR_SIDES = {EAGER: (False, True, False, False), COMPILED: (True, True, False, False),
             COMPILED_NO_DONATION: (True, False, False, False), COMPILED_OPTIMIZER: (True, True, True, False),
             EAGER_CAPTURED: (False, True, False, True), COMPILED_CAPTURED: (True, True, False, True)}
OURS = tuple(OUR_SIDES)


def our_side_names(args: argparse.Namespace) -> list[str]:
    """The sides of ours the flags ask for, in the order they run."""
    if args.captured_only:  # one side of ours in this process (the state of the others slows programs)
        return [COMPILED_CAPTURED]
    names = [EAGER, COMPILED]
    if args.ours_without_donation:
        names.append(COMPILED_NO_DONATION)
    if args.compiled_optimizer:
        names.append(COMPILED_OPTIMIZER)
    if args.captured:
        names += [EAGER_CAPTURED, COMPILED_CAPTURED]
    return names


def build_our_side(name: str, mesh: str, fused: bool, dump: str | None) -> tuple[TorchSide, dict[str, int], int]:
    """One side of ours, the HLO counts of the largest program it compiled and how many it compiled; with ``dump``,
    the compiled step's StableHLO is written there."""
    compiled, donate, compiled_opt, captured = OUR_SIDES[name]
    known = _our_programs()
    side = TorchSide("pjrt", mesh, compiled=compiled, fused=fused, donate=donate, compiled_optimizer=compiled_opt,
                     captured=captured)
    new = [p for k, p in _our_programs().items() if k not in known]
    if dump and compiled and donate and new:
        step = max(new, key=lambda p: len(p.lowered.text))
        with open(os.path.join(dump, f"ours-compiled-{mesh}.mlir"), "w") as f:
            f.write(step.lowered.text)
    return side, hlo_counts(_largest_hlo(new)), len(new)


def our_worker(name: str, mesh_name: str, fused: bool, dump: str | None) -> int:
    side, hlo, compiled = build_our_side(name, mesh_name, fused, dump)
    return serve_commands({"hlo": hlo, "compiled": compiled}, lambda words: side.run(int(words[1])))


def _start_side(name: str, mesh: str, args: argparse.Namespace, first: bool, in_worker: bool
                ) -> tuple[Any, dict[str, int]]:
    """One process's runner of a side (a Worker, or ours in this process) and its step program's HLO counts.
    Only the ``first`` process of a side dumps programs."""
    t0 = time.perf_counter()
    dump = ["--dump-programs", args.dump_programs] if args.dump_programs and first else []
    hlo: dict[str, int] = {}
    if name == XLA:
        runner: Any = Worker(__file__, ["--mesh", mesh], flag="--torch-xla-worker", python=args.torch_xla_python,
                             env=torch_xla_env())
        what = (f"PyTorch/XLA {runner.info['version']} (torch {runner.info['torch']}, transformers "
                f"{runner.info['transformers']})")
    elif name in (TORCHAX, TORCHAX_NO_DONATION):
        extra = ["--no-donation"] if name == TORCHAX_NO_DONATION else dump
        runner = Worker(__file__, ["--mesh", mesh, *extra], flag="--torchax-worker", python=args.torchax_python,
                        env=torchax_env())
        hlo = runner.info["hlo"] if name == TORCHAX else {}
        what = f"{name} {runner.info['version']} (jax {runner.info['jax']}, torch {runner.info['torch']})"
    elif in_worker:
        fused = ["--fused"] if args.fused else []
        runner = Worker(__file__, [name, "--mesh", mesh, *fused, *dump], flag="--ours-worker")
        hlo, compiled = runner.info["hlo"], runner.info["compiled"]
        what = f"{name} ({compiled} programs compiled)"
    else:
        runner, hlo, compiled = build_our_side(name, mesh, args.fused, args.dump_programs if first else None)
        what = f"{name} ({compiled} programs compiled)"
    print(f"{what}, mesh {mesh}: ready in {time.perf_counter() - t0:.1f} s", flush=True)
    return runner, hlo


def _side_ms(per_process: list[dict[str, list]], field: str = "times") -> float:
    """A side's figure: the median over its processes of each one's median (one process: its median)."""
    return statistics.median(_ms(got[field]) for got in per_process)


def compare(args: argparse.Namespace) -> None:
    import torch
    import transformers

    meshes = args.meshes.split(",")
    processes = args.processes
    print(f"transformers {transformers.__version__} LlamaForCausalLM: {LAYERS} layers, hidden {HIDDEN}, {HEADS} heads "
          f"({KV_HEADS} key/value), MLP {MLP}, vocab {VOCAB}; batch {BATCH}x{SEQ}, AdamW; meshes {meshes} over 8 CPU "
          f"devices{'; ours with AdamW(fused=True)' if args.fused else ''}; torch {torch.__version__}; "
          f"{os.cpu_count()} cpus, {processes} process(es) per side, {_load()}", flush=True)
    run_order = [*([XLA] if args.torch_xla_python else []), *([TORCHAX] if args.torchax_python else []),
                 *([TORCHAX_NO_DONATION] if args.torchax_python and args.torchax_without_donation else []),
                 *our_side_names(args)]
    # (side, mesh) -> one runner per process. With several processes every side runs in workers, created round-robin
    # with another side first each time, so that no side has all the first-created processes (which this machine
    # runs slower for their whole life: docs/benchmarks.md, "Processes")
    sides: dict[tuple[str, str], list[Any]] = {}
    workers: list[Worker] = []
    hlo: dict[tuple[str, str], dict[str, int]] = {}
    try:
        for process in range(processes):
            for mesh in meshes:
                start = process % len(run_order)
                order = run_order[start:] + run_order[:start]
                for name in order:
                    runner, counts = _start_side(name, mesh, args, first=process == 0, in_worker=processes > 1)
                    if isinstance(runner, Worker):
                        workers.append(runner)
                    sides.setdefault((name, mesh), []).append(runner)
                    hlo.setdefault((name, mesh), counts)
        runners = [(key, i, runner) for key, per_side in sides.items() for i, runner in enumerate(per_side)]
        results: dict[tuple[str, str], list[dict[str, list]]] = {key: [{} for _ in per_side]
                                                                  for key, per_side in sides.items()}
        for r in range(args.rounds):
            # the side that runs first changes every round: a side's time also depends on what ran just before it
            for key, i, runner in runners[r % len(runners):] + runners[:r % len(runners)]:
                got = runner.request("run", args.steps) if isinstance(runner, Worker) else runner.run(args.steps)
                acc = results[key][i]
                for k, v in got.items():
                    acc.setdefault(k, []).extend(v)
            print(f"  round {r + 1} ({_load()}): " + ", ".join(
                f"{n} {m} {statistics.median(_ms(got['times'][-args.steps:]) for got in per_process):.1f} ms"
                for (n, m), per_process in results.items()), flush=True)
    finally:
        for w in workers:
            w.close()

    for (name, _), per_process in results.items():
        for got in per_process:
            if name in OURS:
                got["python"] = [t - e for t, e in zip(got["times"], got["execute"])]
            elif "dispatch" in got:
                got["after dispatch"] = [t - d for t, d in zip(got["times"], got["dispatch"])]
    print()
    names = [n for n in (*OURS, XLA, TORCHAX, TORCHAX_NO_DONATION) if any(k[0] == n for k in results)]
    table = Table([("mesh", 10, ""), *((f"{n} ms", max(len(n) + 3, 9), ".1f") for n in names)])
    print("median step time" + (f" (the median of the {processes} processes' medians)" if processes > 1 else ""))
    print(table.header())
    for mesh in meshes:
        print(table.row(mesh, *(_side_ms(results[(n, mesh)]) if (n, mesh) in results else float("nan")
                                for n in names)))
    print()
    print("ratios (ours / side, same run)")
    peers = [n for n in (XLA, TORCHAX, TORCHAX_NO_DONATION) if n in names]
    our_names = [n for n in OURS if n in names]
    ratio_table = Table([("mesh", 10, ""), *((f"{o} / {p}", len(o) + len(p) + 3, ".2f")
                                              for o in our_names for p in peers)])
    print(ratio_table.header())
    for mesh in meshes:
        print(ratio_table.row(mesh, *(_side_ms(results[(o, mesh)]) / _side_ms(results[(p, mesh)])
                                      for o in our_names for p in peers)))
    if processes > 1:
        print()
        print("each process's median step time (ms), in the order the processes were created: the spread between "
              "processes of one side is the machine's, not the side's")
        process_table = Table([("side", 47, ""), *((f"p{i + 1}", 7, ".1f") for i in range(processes)),
                               ("max/min", 8, ".2f")])
        print(process_table.header())
        for (name, mesh), per_process in results.items():
            medians = [_ms(got["times"]) for got in per_process]
            print(process_table.row(f"{name}, {mesh}", *medians, max(medians) / min(medians)))
    print()
    print("our step split (medians): python = step - execute; key and after are those of the step's last program; "
          "donated: device buffers given to the step's programs to write their outputs into")
    split_table = Table([("side", 47, ""), ("step ms", 8, ".1f"), ("execute", 8, ".1f"), ("python", 8, ".1f"),
                         ("key", 7, ".2f"), ("after", 7, ".2f"), ("programs", 9, ".0f"), ("ops", 6, ".0f"),
                         ("donated", 8, ".0f")])
    print(split_table.header())
    for (name, mesh), per_process in results.items():
        if name not in OURS:
            continue
        per_step = [statistics.median(v for got in per_process for v in got[k]) for k in ("programs", "ops", "donated")]
        print(split_table.row(f"{name}, {mesh}", *(_side_ms(per_process, k) for k in
                                                   ("times", "execute", "python", "key", "after")), *per_step))
    if any(k[0] == TORCHAX for k in results):
        for mesh in meshes:
            torchax = results[(TORCHAX, mesh)]
            print(f"torchax, {mesh}: step {_side_ms(torchax):.1f} ms, dispatch {_side_ms(torchax, 'dispatch'):.1f} ms, "
                  f"executable {_side_ms(torchax, 'after dispatch'):.1f} ms after dispatch")
    print()
    print("optimized step program (largest one of the side): instruction counts")
    kinds = [*COLLECTIVES, "fusion", "dot", "custom-call"]
    hlo_table = Table([("side", 47, ""), *((k, max(len(k), 5), "d") for k in kinds)])
    print(hlo_table.header())
    for (name, mesh), counts in hlo.items():
        if counts:
            print(hlo_table.row(f"{name}, {mesh}", *(counts.get(k, 0) for k in kinds)))
    print("last losses: " + ", ".join(f"{n} {m} {per_process[0]['loss'][-1]:.5f}"
                                      for (n, m), per_process in results.items()))
    print(f"done ({_load()})")


PHASES = ("step", "python", "forward", "backward", "optimizer", "zero_grad", "sync", "execute", "key", "after", "rest",
          "gc")


def phases(args: argparse.Namespace) -> None:
    """Where the Python of our compiled step goes, phase by phase (medians over ``rounds x steps`` steps): the
    compiled forward and backward, the optimizer, ``zero_grad``, and ``xs.sync()`` split into the executable, the
    program's key, storing its results (``after``, the donated buffers' release included) and the rest (building
    the argument lists, dropping the last references); ``gc`` is the garbage collector's time in the step."""
    import gc

    for mesh in args.meshes.split(","):
        side = TorchSide("pjrt", mesh, compiled=True, fused=args.fused, compiled_optimizer=args.compiled_optimizer)
        xs, clock = side.xs, time.perf_counter
        collecting = {"seconds": 0.0, "start": 0.0}

        def on_gc(phase: str, info: dict) -> None:
            if phase == "start":
                collecting["start"] = clock()
            else:
                collecting["seconds"] += clock() - collecting["start"]

        gc.callbacks.append(on_gc)
        got: dict[str, list[float]] = {k: [] for k in PHASES}
        try:
            for _ in range(args.rounds * args.steps):
                collecting["seconds"] = 0.0
                before = xs.metrics()
                t0 = clock()
                loss = side.forward(input_ids=side.ids, labels=side.labels).loss
                t1 = clock()
                loss.backward()
                t2 = clock()
                side.step()
                t3 = clock()
                side.opt.zero_grad()
                t4 = clock()
                xs.sync()
                t5 = clock()
                execute = xs.metrics().execute_seconds - before.execute_seconds
                split = _last_run_split()
                values = {"step": t5 - t0, "python": t5 - t0 - execute, "forward": t1 - t0, "backward": t2 - t1,
                          "optimizer": t3 - t2, "zero_grad": t4 - t3, "sync": t5 - t4 - execute, "execute": execute,
                          "key": split["key"], "after": split["after"],
                          "rest": t5 - t4 - execute - split["key"] - split["after"], "gc": collecting["seconds"]}
                for k, v in values.items():
                    got[k].append(v)
        finally:
            gc.callbacks.remove(on_gc)
        which = " + compiled AdamW" if args.compiled_optimizer else ""
        print(f"ours torch.compile{which}, mesh {mesh}: medians of {args.rounds * args.steps} steps in ms ({_load()}); "
              "sync = xs.sync() outside the executable = key + after + rest")
        table = Table([("mesh", 9, ""), *((k, max(len(k), 7), ".2f") for k in PHASES)])
        print(table.header())
        print(table.row(mesh, *(_ms(got[k]) for k in PHASES)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps per round and side")
    parser.add_argument("--meshes", default="data,megatron", help="comma-separated: data, megatron")
    parser.add_argument("--torch-xla-python", default=os.environ.get("TORCH_XLA_PYTHON"),
                        help="an interpreter with torch_xla 2.9 and transformers (default: $TORCH_XLA_PYTHON; "
                             "none: skip it)")
    parser.add_argument("--torchax-python", default=os.environ.get("TORCHAX_PYTHON"),
                        help="an interpreter from benchmarks/envs/torchax-venv.sh (default: $TORCHAX_PYTHON; "
                             "none: skip it)")
    parser.add_argument("--fused", action="store_true",
                        help="AdamW(fused=True) for ours (one recorded op per optimizer step); PyTorch/XLA keeps "
                             "torch's foreach AdamW, torchax its AdamW written in jax")
    parser.add_argument("--dump-programs", default=None, metavar="DIR",
                        help="write the StableHLO of our compiled step and of torchax's step per mesh into DIR, "
                             "for xla_cross_compile.py and hf_step_ops.py")
    parser.add_argument("--ours-without-donation", action="store_true",
                        help="add our compiled step with xs.set_donation(False)")
    parser.add_argument("--torchax-without-donation", action="store_true",
                        help="also run torchax's step without donating its state (a new buffer for every output, as "
                             "our engine has)")
    parser.add_argument("--compiled-optimizer", action="store_true",
                        help="add ours with the model and the optimizer step compiled (torch.compile(opt.step, "
                             "backend=\"pjrt\")), as torchax jits its whole step; with --phases: phase that one")
    parser.add_argument("--captured", action="store_true",
                        help="add ours eager and compiled with the whole step under xs.capture_step (recorded once, "
                             "then replayed without its Python) and AdamW(capturable=True)")
    parser.add_argument("--captured-only", action="store_true",
                        help="of ours, run only the compiled step under xs.capture_step (with --meshes data or "
                             "megatron: one side of ours per process, as each peer runs in its own)")
    parser.add_argument("--phases", action="store_true",
                        help="only our compiled step: where its Python goes, phase by phase (forward, backward, "
                             "optimizer, the sync around the executable, the garbage collector)")
    parser.add_argument("--processes", type=int, default=1,
                        help="worker processes per side (ours too, when more than 1), created round-robin; a side's "
                             "step time is the median of its processes' medians (this machine runs some processes "
                             "slower for their whole life: docs/benchmarks.md)")
    parser.add_argument("--mesh", default="data", help=argparse.SUPPRESS)
    parser.add_argument("--ours-worker", default=None, choices=OUR_SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--no-donation", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--torch-xla-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--torchax-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models from configs: nothing to download
    if args.torch_xla_worker:
        return torch_xla_worker(args.mesh)
    if args.torchax_worker:
        return torchax_worker(args.mesh, args.dump_programs, donate=not args.no_donation)
    if args.ours_worker:
        return our_worker(args.ours_worker, args.mesh, args.fused, args.dump_programs)
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    unknown = set(args.meshes.split(",")) - set(MESHES)
    if unknown:
        parser.error(f"unknown meshes {sorted(unknown)}; choose from {sorted(MESHES)}")
    if args.dump_programs:
        os.makedirs(args.dump_programs, exist_ok=True)
        args.dump_programs = os.path.abspath(args.dump_programs)
    if args.phases:
        phases(args)
        return 0
    compare(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
