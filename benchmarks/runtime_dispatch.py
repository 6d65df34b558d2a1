"""Dispatch overhead: run an already compiled 4-element add on one device and copy the result back.

Compares pjrt_plugins.runtime on the CPU PJRT plugin with jax's jitted function on its own CPU
backend, measured in the same run with the rounds interleaved (goal: within 1.2x of jax; the earlier
goal was 2x). A child process runs the same work on the runtime's Python path
(PJRT_PLUGINS_FASTPATH=0, as without the fast-path library), to show what the compiled one saves;
a second client in this process would slow the first (the plugin's threads), so it has its own.
Optionally also a ctypes client (pypjrt) run by another interpreter: --pypjrt-python PATH.

    python benchmarks/runtime_dispatch.py [--rounds 30] [--iterations 400]
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

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # jax must not try the CUDA plugin here

import numpy as np
from _measure import Table, cpu_plugin_library, interleaved_samples

from pjrt_plugins.conform._programs import ADD_F32 as ADD

GOAL = 1.2  # ours / jax (see the module docstring)


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


def python_path_median(library: str, rounds: int, iterations: int) -> float | None:
    """Median seconds of ``execute+to_numpy`` with PJRT_PLUGINS_FASTPATH=0, in a child process."""
    code = textwrap.dedent(
        f"""
        import json, statistics, time
        import numpy as np
        from pjrt_plugins.runtime import Client, _fastpath
        from pjrt_plugins.conform._programs import ADD_F32
        assert _fastpath.library is None
        client = Client({library!r})
        exe = client.compile(ADD_F32)
        a = client.buffer_from_host(np.ones(4, np.float32))
        b = client.buffer_from_host(np.arange(4, dtype=np.float32))
        def run():
            [[out]] = exe.execute([[a, b]])
            return out.to_numpy()
        assert run().tolist() == [1.0, 2.0, 3.0, 4.0]
        for _ in range(200):
            run()
        rounds = []
        for _ in range({rounds}):
            t = time.perf_counter()
            for _ in range({iterations}):
                run()
            rounds.append((time.perf_counter() - t) / {iterations})
        print(json.dumps(statistics.median(rounds)))
        """
    )
    env = dict(os.environ, PJRT_PLUGINS_FASTPATH="0")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    if result.returncode != 0:
        print(f"Python-path run failed:\n{result.stderr[-1500:]}", file=sys.stderr)
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

    from pjrt_plugins.runtime import Client, _fastpath

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
    samples = interleaved_samples(cases, args.rounds, args.iterations, warmup=200)
    medians = {name: statistics.median(times) for name, times in samples.items()}
    value = python_path_median(library, args.rounds, args.iterations)
    if value is not None:
        medians["  same, Python path (own process)"] = value
    if args.pypjrt_python:
        value = pypjrt_median(args.pypjrt_python, library, args.rounds, args.iterations)
        if value is not None:
            medians["pypjrt 0.1.1 (ctypes)"] = value

    base = medians["jax.jit (CPU backend)"]
    print(f"dispatch: 4-element f32 add on one device + copy back  (python {platform.python_version()}, "
          f"jax {jax.__version__}, plugin API {'.'.join(map(str, client.library.api_version))}, "
          f"{os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f})")
    table = Table([("case", 34, ""), ("median us", 10, ".1f"), ("p90 us", 8, ".1f"), ("x jax", 7, ".2f")])
    print(table.header())
    for name, median in medians.items():
        p90 = statistics.quantiles(samples[name], n=10)[-1] * 1e6 if name in samples else float("nan")
        print(table.row(name, median * 1e6, p90, median / base))
    ratio = medians["pjrt_plugins execute+to_numpy"] / base
    fast = "compiled fast path" if _fastpath.library is not None else f"NO fast path: {_fastpath.unavailable_reason}"
    print(f"goal: within {GOAL}x of jax -> {'met' if ratio <= GOAL else 'NOT met'} ({ratio:.2f}x, {fast})")
    client.close()


if __name__ == "__main__":
    main()
