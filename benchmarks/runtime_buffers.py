"""Per-buffer cost of an execute's outputs: wrapping each new one, freeing each old one.

A compiled training step makes about 120 outputs on each of 8 devices and frees as many old
values (issue 29): this measures what one output buffer costs on the CPU PJRT plugin with 8
devices, split into the parts the runtime can change and the plugin's own, each against a
baseline measured in the same run:

- execute: a program of N outputs against the same program of 1 output (the extra time per extra
  output buffer: the plugin's allocation and work plus our wrapping);
- wrap: making the ``Buffer`` objects over live handles (what ``execute`` does per output);
- free: dropping the outputs (``Buffer.__del__``: registry, destroy) and deleting them in one batch
  (``client.delete_buffers``: one call of the compiled fast path for all, what the SPMD engine does with the
  buffers a step donated), against the plugin's bare ``PJRT_Buffer_Destroy`` calls in a loop;
- a steady loop, each execute's outputs replacing the last one's (what a replayed training step does with its
  state): the old outputs freed in one batch after the execute, against ``execute(recycle=old outputs)``, which
  makes the old Buffer objects the new outputs' wrappers and destroys the old handles in one C call;
- jax: the same N-output program under ``jax.jit`` on 8 CPU devices, in a child process (its own
  XLA flags), as the reference for execute and free per output buffer.

    python benchmarks/runtime_buffers.py [--outputs 120] [--rounds 100]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from typing import Any

import numpy as np
from _measure import Table, cpu_plugin_library

DEVICES = 8


def program(outputs: int) -> str:
    """StableHLO: ``a + i`` for i in range(outputs), each a separate f32[4] output."""
    types = ", ".join(["tensor<4xf32>"] * outputs)
    body = "\n".join(
        f"    %c{i} = stablehlo.constant dense<{i}.0> : tensor<4xf32>\n"
        f"    %r{i} = stablehlo.add %a, %c{i} : tensor<4xf32>"
        for i in range(outputs)
    )
    results = ", ".join(f"%r{i}" for i in range(outputs))
    return f"module {{\n  func.func @main(%a: tensor<4xf32>) -> ({types}) {{\n{body}\n    return {results} : {types}\n  }}\n}}"


def median_of(fn: Any, rounds: int) -> float:
    """Median seconds of ``fn()`` (which returns its own measured seconds) over ``rounds``."""
    return statistics.median(fn() for _ in range(rounds))


def jax_costs(outputs: int, rounds: int) -> dict[str, float] | None:
    """Seconds per execute of jax.jit with 1 and ``outputs`` outputs, and per free, in a child."""
    code = textwrap.dedent(
        f"""
        import json, statistics, time
        import jax, jax.numpy as jnp
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        mesh = Mesh(jax.devices(), ("x",))
        a = jax.device_put(jnp.ones({DEVICES} * 4, jnp.float32), NamedSharding(mesh, P("x")))
        many = jax.jit(lambda a: tuple(a + i for i in range({outputs})))
        one = jax.jit(lambda a: a + a)
        def run(f):
            t = time.perf_counter(); out = f(a); jax.block_until_ready(out); t1 = time.perf_counter()
            del out; return t1 - t, time.perf_counter() - t1
        for _ in range(20): run(one); run(many)
        ones, manys, frees = [], [], []
        for _ in range({rounds}):
            ones.append(run(one)[0]); e, f = run(many); manys.append(e); frees.append(f)
        print(json.dumps([statistics.median(ones), statistics.median(manys), statistics.median(frees)]))
        """
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={DEVICES}")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    if result.returncode != 0:
        print(f"jax run failed:\n{result.stderr[-1500:]}", file=sys.stderr)
        return None
    one, many, free = json.loads(result.stdout.strip().splitlines()[-1])
    return {"one": one, "many": many, "free": free}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", default=None, help="PJRT CPU plugin .so (default: the xla-cpu-pjrt wheel)")
    parser.add_argument("--outputs", type=int, default=120, help="outputs per device (default 120)")
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    n = args.outputs
    buffers = n * DEVICES

    from pjrt_plugins.runtime import Buffer, Client, CompileOptions, _fastpath
    from pjrt_plugins.runtime._args import new_args

    client = Client(args.library or cpu_plugin_library(), {"cpu_device_count": DEVICES})
    options = CompileOptions(num_replicas=DEVICES)
    many = client.compile(program(n), options)
    one = client.compile(program(1), options)
    inputs = [[client.buffer_from_host(np.ones(4, np.float32), d)] for d in range(DEVICES)]
    check = many.execute(inputs)
    assert len(check) == DEVICES and len(check[0]) == n and check[0][-1].to_numpy().tolist() == [n] * 4
    dtype = check[0][0].dtype
    del check

    def execute(exe: Any) -> float:
        t = time.perf_counter()
        out = exe.execute(inputs)
        seconds = time.perf_counter() - t
        del out
        return seconds

    def take_handles() -> list[Any]:
        """Live output handles, no longer owned by any Buffer (the caller frees them)."""
        handles = []
        for row in many.execute(inputs):
            for buf in row:
                handles.append(buf._ptr)
                client._live_buffers.pop(id(buf))  # ownership moves to the caller
                buf._ptr = None
        return handles

    def wrap() -> float:
        handles = take_handles()
        t = time.perf_counter()
        wrapped = [Buffer(client, ptr, (4,), dtype, None, True) for ptr in handles]
        seconds = time.perf_counter() - t
        del wrapped  # frees the handles
        return seconds

    def free() -> float:
        out = many.execute(inputs)
        t = time.perf_counter()
        del out
        return time.perf_counter() - t

    def free_batch() -> float:
        out = many.execute(inputs)
        t = time.perf_counter()
        client.delete_buffers([buf for row in out for buf in row])
        seconds = time.perf_counter() - t
        del out
        return seconds

    destroy_fn = client._destroy_buffer_fn
    destroy_args = new_args("PJRT_Buffer_Destroy_Args")

    def raw_destroy() -> float:
        handles = take_handles()
        t = time.perf_counter()
        for ptr in handles:
            destroy_args.buffer = ptr
            if destroy_fn(destroy_args):
                raise RuntimeError("PJRT_Buffer_Destroy failed")
        return time.perf_counter() - t

    kept = {"plain": many.execute(inputs), "recycled": many.execute(inputs)}  # each loop's last outputs

    def loop_plain() -> float:
        t = time.perf_counter()
        out = many.execute(inputs)
        client.delete_buffers([buf for row in kept["plain"] for buf in row])
        kept["plain"] = out  # the deleted Buffer objects go
        return time.perf_counter() - t

    def loop_recycled() -> float:
        t = time.perf_counter()
        kept["recycled"] = many.execute(inputs, recycle=kept["recycled"])
        return time.perf_counter() - t

    cases = {"one": lambda: execute(one), "many": lambda: execute(many), "wrap": wrap, "free": free,
             "batch": free_batch, "raw": raw_destroy, "loop": loop_plain, "recycled": loop_recycled}
    for _ in range(20):  # warm up
        for case in cases.values():
            case()
    rows: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.rounds):  # interleaved: load changes hit every case alike
        for name, case in cases.items():
            rows[name].append(case())
    med = {k: statistics.median(v) for k, v in rows.items()}
    kept.clear()
    client.close()
    jax = jax_costs(n, args.rounds)

    per_extra = (med["many"] - med["one"]) / ((n - 1) * DEVICES) * 1e6
    fast = "compiled fast path" if _fastpath.library is not None else "Python path"
    print(f"per-buffer cost: {n} f32[4] outputs on each of {DEVICES} CPU devices ({buffers} buffers), {fast} "
          f"(python {platform.python_version()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f})")
    table = Table([("case", 46, ""), ("median us", 10, ".1f"), ("us/buffer", 10, ".3f")])
    print(table.header())
    print(table.row("execute, 1 output per device", med["one"] * 1e6, float("nan")))
    print(table.row(f"execute, {n} outputs per device", med["many"] * 1e6, med["many"] / buffers * 1e6))
    print(table.row("  per extra output buffer", float("nan"), per_extra))
    print(table.row("  of it: wrapping (Buffer objects)", med["wrap"] * 1e6, med["wrap"] / buffers * 1e6))
    print(table.row("free (drop the outputs)", med["free"] * 1e6, med["free"] / buffers * 1e6))
    print(table.row("free in one batch (client.delete_buffers)", med["batch"] * 1e6, med["batch"] / buffers * 1e6))
    print(table.row("  baseline: bare PJRT_Buffer_Destroy loop", med["raw"] * 1e6, med["raw"] / buffers * 1e6))
    print(table.row("loop: execute, then free the last outputs", med["loop"] * 1e6, med["loop"] / buffers * 1e6))
    print(table.row("loop: execute(recycle=the last outputs)", med["recycled"] * 1e6,
                    med["recycled"] / buffers * 1e6))
    if jax is not None:
        print(table.row("jax.jit execute, 1 output", jax["one"] * 1e6, float("nan")))
        print(table.row(f"jax.jit execute, {n} outputs", jax["many"] * 1e6, jax["many"] / buffers * 1e6))
        print(table.row("  per extra output buffer", float("nan"),
                        (jax["many"] - jax["one"]) / ((n - 1) * DEVICES) * 1e6))
        print(table.row("jax free (drop the outputs)", jax["free"] * 1e6, jax["free"] / buffers * 1e6))
    print(f"loop, recycled / freed: {med['recycled'] / med['loop']:.2f}")


if __name__ == "__main__":
    main()
