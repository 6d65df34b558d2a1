"""Soak: many consecutive sharded training steps on the CPU plugin's 8 devices, in steps per second.

Why: the MLP of spmd_mlp.py once deadlocked in an all-reduce within about 20 steps on 2 cores and
XLA aborted the process (the Backends page of the docs, "The all-reduce deadlock"). Each job here is a child process that trains --steps steps (default 1000)
with a ``loss.item()`` every 5 steps, after untimed warm-up steps (until one compiles nothing),
bounded by --timeout, so a hang or an abort is reported as such, with the last step reached.
The table gives each model's steps per second (mean over its jobs), the slowest timed step, and
the programs compiled during the timed steps (0 expected). --jobs N runs N identical jobs at once
on the same cores. --captured runs our step under ``xs.capture_step`` (AdamW with ``capturable=True``):
recorded once, then replayed; the table then also gives the peak memory after the warm-up and at the end
(a replay that kept buffers alive would grow it).
Baseline, measured in the same run with as many jobs: the same model and optimizer in plain
PyTorch on the CPU (one device, no sharding) for --baseline-steps steps.

Models: ``mlp``  spmd_mlp.py's 256 x 1024-4096-1024, MSE, SGD (the issue's model);
        ``demo`` examples/demo.py's 32 x 64-256-16, cross entropy, SGD;
        ``gpt``  a 2-layer GPT (d_model 64, 4 heads, context 32, vocabulary 256), AdamW.
Run: python benchmarks/soak.py [--model mlp|demo|gpt|all] [--steps 1000] [--jobs 1] [--captured]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from _measure import Table

ITEM_EVERY = 5
PROGRESS_EVERY = 100
#: At most this many untimed warm-up steps (until one compiles nothing).
WARMUP_MAX = 4


# -- the models ------------------------------------------------------------------------------------


def build(name: str, device: str, capturable: bool = False):
    """``(model, optimizer, loss_fn)`` on ``device``; on ``"pjrt"`` the weights and batch are sharded."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    if name == "mlp":
        batch, width, hidden = 256, 1024, 4096
        model = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, width))
        x, y = torch.randn(batch, width), torch.randn(batch, width)
        column, row = [model[0]], [model[2]]
        loss_fn = F.mse_loss
        optimizer = lambda params: torch.optim.SGD(params, lr=0.01)  # noqa: E731
    elif name == "demo":
        batch, width, hidden, classes = 32, 64, 256, 16
        model = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        x, y = torch.randn(batch, width), torch.randint(0, classes, (batch,))
        column, row = [model[0]], [model[2]]
        loss_fn = F.cross_entropy
        optimizer = lambda params: torch.optim.SGD(params, lr=0.1)  # noqa: E731
    elif name == "gpt":
        GPT = gpt_class()
        model = GPT()
        x = torch.randint(0, GPT.VOCAB, (8, GPT.CONTEXT))
        y = torch.randint(0, GPT.VOCAB, (8, GPT.CONTEXT))
        column = [layer for block in model.blocks for layer in (block.q, block.k, block.v, block.fc)]
        row = [layer for block in model.blocks for layer in (block.proj, block.out)]

        def loss_fn(logits, targets):
            return F.cross_entropy(logits.reshape(-1, GPT.VOCAB), targets.reshape(-1))

        optimizer = lambda params: torch.optim.AdamW(params, lr=3e-4, weight_decay=0.1,  # noqa: E731
                                                     capturable=capturable)
    else:
        raise SystemExit(f"unknown model {name!r}")
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    if device == "pjrt":
        import pjrt_plugins.spmd as xs

        mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
        for layer in column:  # Megatron-style: split the first layer's outputs, the second's inputs
            xs.mark_sharding(layer.weight, mesh, ("model", None))
            xs.mark_sharding(layer.bias, mesh, ("model",))
        for layer in row:
            xs.mark_sharding(layer.weight, mesh, (None, "model"))
        x = xs.mark_sharding(x, mesh, ("data",) + (None,) * (x.dim() - 1))
        y = xs.mark_sharding(y, mesh, ("data",) + (None,) * (y.dim() - 1))
    return model, optimizer(model.parameters()), lambda: loss_fn(model(x), y)


def gpt_class():
    """The GPT module class (defined here so that importing this script does not import torch)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, dim: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
            self.proj = nn.Linear(dim, dim)
            self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

        def forward(self, x):
            b, t, d = x.shape
            h = self.norm1(x)
            q, k, v = (layer(h).reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                       for layer in (self.q, self.k, self.v))
            scores = q @ k.transpose(-2, -1) / (d // self.heads) ** 0.5
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1).to(x.device)
            attention = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
            x = x + self.proj(attention.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.norm2(x))))

    class GPT(nn.Module):
        VOCAB, CONTEXT, DIM, HEADS, LAYERS = 256, 32, 64, 4, 2

        def __init__(self) -> None:
            super().__init__()
            self.tokens = nn.Embedding(self.VOCAB, self.DIM)
            self.positions = nn.Embedding(self.CONTEXT, self.DIM)
            self.blocks = nn.ModuleList(Block(self.DIM, self.HEADS) for _ in range(self.LAYERS))
            self.norm = nn.LayerNorm(self.DIM)
            self.head = nn.Linear(self.DIM, self.VOCAB)

        def forward(self, idx):
            positions = torch.arange(idx.shape[1]).to(idx.device)
            x = self.tokens(idx) + self.positions(positions)
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x))

    return GPT


# -- one job ---------------------------------------------------------------------------------------


def worker(model_name: str, device: str, steps: int, captured: bool = False) -> int:
    """Train ``steps`` steps; print a JSON line every PROGRESS_EVERY steps and a final one."""
    compiles = lambda: 0  # noqa: E731
    if device == "pjrt":
        import pjrt_plugins.spmd as xs

        xs.set_plugin("cpu", options={"cpu_device_count": 8})
        sync = xs.sync
        compiles = lambda: xs.metrics().compiles  # noqa: E731
    else:
        sync = lambda: None  # noqa: E731
    model, opt, compute_loss = build(model_name, device, capturable=captured)
    losses: list[float] = []

    def train_step():
        loss = compute_loss()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    run = xs.capture_step(train_step) if captured else train_step

    def step(n: int) -> None:
        loss = run()
        sync()
        if n % ITEM_EVERY == 0:
            losses.append(loss.item())

    # Warm-up, not counted: steps until one compiles nothing. AdamW creates its state in the first
    # step, so the second step is another program (compiled in ~20 s on a loaded machine).
    t0 = time.perf_counter()
    for warmup in range(1, WARMUP_MAX + 1):
        compiled = compiles()
        step(ITEM_EVERY)
        if warmup > 1 and compiles() == compiled:
            break
    if captured:  # a step is recorded once two calls agree: two more untimed steps
        step(ITEM_EVERY)
        step(ITEM_EVERY)
    ready = time.perf_counter() - t0
    rss_ready = _peak_rss_mb()
    compiled = compiles()
    start = last = time.perf_counter()
    slowest = 0.0
    for n in range(1, steps + 1):
        step(n)
        now = time.perf_counter()
        slowest, last = max(slowest, now - last), now
        if n % PROGRESS_EVERY == 0:
            print(json.dumps({"step": n}), flush=True)
    seconds = time.perf_counter() - start
    print(json.dumps({"step": steps, "done": True, "seconds": seconds, "slowest_step_s": slowest,
                      "warmup_steps": warmup, "warmup_s": ready, "compiles": compiles() - compiled,
                      "loss_first": losses[0], "loss_last": losses[-1], "rss_ready_mb": rss_ready,
                      "rss_end_mb": _peak_rss_mb(), "replays": getattr(run, "replays", 0)}), flush=True)
    return 0


def _peak_rss_mb() -> float:
    """The process's peak resident memory so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# -- the parent --------------------------------------------------------------------------------------


def run_jobs(model: str, device: str, steps: int, jobs: int, timeout: float, captured: bool = False) -> list[dict]:
    """Start ``jobs`` workers at once; each result has ``done`` or an ``outcome`` saying how it ended.

    The workers write to files (a pipe left unread while the parent waits on another job could fill
    up and block that job, which would look like a hang); their progress is printed as it comes.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    outputs = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(jobs)]
    children = [
        subprocess.Popen([sys.executable, __file__, "--worker", model, device, str(steps), str(int(captured))],
                         stdout=out, stderr=err, text=True, env=env)
        for out, err in outputs
    ]
    started = time.monotonic()
    reported: list[int] = []
    while any(child.poll() is None for child in children) and time.monotonic() - started < timeout:
        time.sleep(1.0)
        reached = [last_line(out)["step"] for out, _ in outputs]
        if reached != reported and any(reached):
            print(f"    {model} {device}: step {', '.join(map(str, reached))} after {time.monotonic() - started:.0f} s;"
                  f" load {os.getloadavg()[0]:.1f}", flush=True)
            reported = reached
    results = []
    for child, (out, err) in zip(children, outputs):
        hung = child.poll() is None
        if hung:
            child.kill()
            child.wait()
        last = last_line(out)
        err.seek(0)
        error = err.read().strip()
        if last.get("done") and child.returncode == 0:
            results.append(last)
        else:
            how = f"hung (killed after {timeout:g} s)" if hung else f"died with status {child.returncode}"
            tail = error.splitlines()[-1][:160] if error else ""
            results.append({"outcome": f"{how} after step {last['step']}", "stderr": tail})
        out.close()
        err.close()
    return results


def last_line(output) -> dict:
    """The last JSON line a worker wrote to ``output`` so far (``{"step": 0}`` before any)."""
    output.seek(0)
    lines = [line for line in output.read().splitlines() if line.startswith("{") and line.endswith("}")]
    return json.loads(lines[-1]) if lines else {"step": 0}


def rate(results: list[dict]) -> float | None:
    done = [r["step"] / r["seconds"] for r in results if r.get("done")]
    return statistics.mean(done) if len(done) == len(results) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=["mlp", "demo", "gpt", "all"])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--baseline-steps", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=1, help="identical jobs at once on the same cores")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a job may take")
    parser.add_argument("--captured", action="store_true",
                        help="run our step under xs.capture_step (recorded once, then replayed without its Python)")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        model, device, steps, captured = args.worker
        return worker(model, device, int(steps), captured == "1")

    models = ["mlp", "demo", "gpt"] if args.model == "all" else [args.model]
    print(f"soak: {args.steps} steps per job, {args.jobs} job(s) at once, loss.item() every {ITEM_EVERY} steps; "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f}", flush=True)
    table = Table([("model", 6, ""), ("jobs", 5, "d"), ("steps", 6, "d"), ("pjrt steps/s", 13, ".2f"),
                   ("slowest step s", 15, ".2f"), ("compiles", 9, "d"), ("torch CPU steps/s", 18, ".2f"),
                   ("pjrt/torch", 11, ".2f")])
    rows, failures = [], []
    for model in models:
        ours = run_jobs(model, "pjrt", args.steps, args.jobs, args.timeout, args.captured)
        base = run_jobs(model, "cpu", args.baseline_steps, args.jobs, args.timeout)
        for label, results in (("pjrt", ours), ("torch CPU", base)):
            failures += [f"{model} {label}: {r['outcome']} {r['stderr']}" for r in results if not r.get("done")]
        ours_rate, base_rate = rate(ours), rate(base)
        losses = ", ".join(f"{r['loss_first']:.4f} -> {r['loss_last']:.4f}" for r in ours if r.get("done"))
        memory = ", ".join(f"{r['rss_ready_mb']:.0f} -> {r['rss_end_mb']:.0f} MiB" for r in ours if r.get("done"))
        replays = ", ".join(str(r["replays"]) for r in ours if r.get("done"))
        print(f"  {model}: pjrt loss {losses}; peak memory after warm-up -> at the end {memory}"
              f"{f'; replays {replays}' if args.captured else ''}; load {os.getloadavg()[0]:.2f}", flush=True)
        nan = float("nan")  # a failed job leaves no rate
        slowest = max((r["slowest_step_s"] for r in ours if r.get("done")), default=nan)
        compiled = sum(r["compiles"] for r in ours if r.get("done"))
        rows.append((model, args.jobs, args.steps, ours_rate or nan, slowest, compiled, base_rate or nan,
                     ours_rate / base_rate if ours_rate and base_rate else nan))
    print()
    print(table.header())
    for row in rows:
        print(table.row(*row))
    for failure in failures:
        print("FAILED:", failure)
    print(f"\n{'all jobs completed' if not failures else f'{len(failures)} job(s) did not complete'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
