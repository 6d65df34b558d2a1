"""Dispatch overhead: run an already compiled 4-element add on one device and copy the result back.

Compares pjrt_plugins.runtime on the CPU PJRT plugin with jax's jitted function on its own CPU
backend, measured in the same run with the rounds interleaved (goal: within 2x of jax).
Optionally also a ctypes client (pypjrt) run by another interpreter: --pypjrt-python PATH.

    python benchmarks/runtime_dispatch.py [--rounds 30] [--iterations 400]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # jax must not try the CUDA plugin here

import numpy as np

ADD = """
module @add {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}
"""


def cpu_plugin_library() -> str:
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the xla-cpu-pjrt wheel is not installed; pass --library")
    return str(Path(next(iter(spec.submodule_search_locations))) / "xla_cpu_pjrt.so")


def measure(cases: dict[str, Callable[[], object]], rounds: int, iterations: int) -> dict[str, list[float]]:
    """Per-call seconds of every case, rounds interleaved so machine noise hits all alike."""
    for fn in cases.values():  # warm up
        for _ in range(200):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    clock = time.perf_counter
    for _ in range(rounds):
        for name, fn in cases.items():
            times = samples[name]
            for _ in range(iterations):
                start = clock()
                fn()
                times.append(clock() - start)
    return samples


def pypjrt_median(python: str, library: str, rounds: int, iterations: int) -> float | None:
    """Median seconds of the same work with pypjrt, in its own interpreter (it uses ctypes)."""
    code = textwrap.dedent(
        f"""
        import json, statistics, time
        import numpy as np
        import pypjrt
        from pypjrt.typing import F32
        client = pypjrt.Client(pypjrt.Plugin({library!r}))
        exe = client.compile({ADD!r})
        with client.devices() as devices:
            a = client.typed_buffer(F32, np.ones(4, np.float32), [4], devices[0])
            b = client.typed_buffer(F32, np.arange(4, dtype=np.float32), [4], devices[0])
        def run():
            [out] = exe(a, b)
            result = np.frombuffer(out.to_host(), np.float32)
            out.close()
            return result
        assert run().tolist() == [1.0, 2.0, 3.0, 4.0]
        for _ in range(200):
            run()
        times = []
        for _ in range({rounds} * {iterations}):
            t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
        print(json.dumps(statistics.median(times)))
        """
    )
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        print(f"pypjrt run failed:\n{result.stderr[-1500:]}", file=sys.stderr)
        return None
    return float(json.loads(result.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", default=None, help="PJRT CPU plugin .so (default: the xla-cpu-pjrt wheel)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--pypjrt-python", default=None, help="an interpreter with pypjrt installed")
    args = parser.parse_args()
    library = args.library or cpu_plugin_library()

    from pjrt_plugins.runtime import Client

    client = Client(library)
    exe = client.compile(ADD)
    a = client.buffer_from_host(np.ones(4, np.float32))
    b = client.buffer_from_host(np.arange(4, dtype=np.float32))
    expected = np.arange(4, dtype=np.float32) + 1

    def ours() -> np.ndarray:
        [[out]] = exe.execute([[a, b]])
        return out.to_numpy()

    def ours_no_wait() -> np.ndarray:
        [[out]] = exe.execute([[a, b]], wait=False)
        return out.to_numpy()

    import jax
    import jax.numpy as jnp

    add = jax.jit(lambda x, y: x + y)
    ja, jb = jnp.ones(4, jnp.float32), jnp.arange(4, dtype=jnp.float32)

    def jax_cpu() -> np.ndarray:
        return np.asarray(add(ja, jb))

    for fn in (ours, ours_no_wait, jax_cpu):
        np.testing.assert_array_equal(fn(), expected)

    cases = {
        "jax.jit (CPU backend)": jax_cpu,
        "pjrt_plugins execute+to_numpy": ours,
        "  same, execute(wait=False)": ours_no_wait,
    }
    samples = measure(cases, args.rounds, args.iterations)
    medians = {name: statistics.median(times) for name, times in samples.items()}
    if args.pypjrt_python:
        value = pypjrt_median(args.pypjrt_python, library, args.rounds, args.iterations)
        if value is not None:
            medians["pypjrt 0.1.1 (ctypes)"] = value

    base = medians["jax.jit (CPU backend)"]
    print(f"dispatch: 4-element f32 add on one device + copy back  (python {platform.python_version()}, "
          f"jax {jax.__version__}, plugin API {'.'.join(map(str, client.library.api_version))}, "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f})")
    print(f"{'case':34s} {'median us':>10s} {'p90 us':>8s} {'x jax':>7s}")
    for name, median in medians.items():
        p90 = statistics.quantiles(samples[name], n=10)[-1] * 1e6 if name in samples else float("nan")
        print(f"{name:34s} {median * 1e6:10.1f} {p90:8.1f} {median / base:7.2f}")
    ratio = medians["pjrt_plugins execute+to_numpy"] / base
    print(f"goal: within 2x of jax -> {'met' if ratio <= 2 else 'NOT met'} ({ratio:.2f}x)")
    client.close()


if __name__ == "__main__":
    main()
