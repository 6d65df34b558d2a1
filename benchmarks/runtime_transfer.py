"""Transfer bandwidth: host -> device -> host for 64 MiB of float32 on the CPU PJRT plugin.

Reported as a fraction of a plain numpy copy of the same bytes measured in the same run,
rounds interleaved (goal: at least 0.8). The source array is 64-byte aligned, which the CPU
plugin needs before it aliases host memory instead of copying it.

    python benchmarks/runtime_transfer.py [--mib 64] [--rounds 8] [--iterations 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable

import numpy as np
from _measure import Table, cpu_plugin_library, interleaved_samples


def aligned_empty(count: int, dtype: np.dtype, alignment: int = 64) -> np.ndarray:
    raw = np.empty(count * dtype.itemsize + alignment, np.uint8)
    offset = (-raw.ctypes.data) % alignment
    return raw[offset : offset + count * dtype.itemsize].view(dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", default=None)
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()

    from pjrt_plugins.runtime import Client

    client = Client(args.library or cpu_plugin_library())
    dtype = np.dtype(np.float32)
    count = args.mib * 2**20 // dtype.itemsize
    src = aligned_empty(count, dtype)
    src[:] = np.random.default_rng(0).standard_normal(count, dtype=np.float32)
    dst = np.empty_like(src)

    def numpy_copy() -> np.ndarray:
        return src.copy()

    def numpy_copy_into() -> np.ndarray:
        np.copyto(dst, src)
        return dst

    def round_trip(copy: bool | None, into: bool) -> Callable[[], np.ndarray]:
        def run() -> np.ndarray:
            with client.buffer_from_host(src, copy=copy) as buf:
                return buf.to_numpy(out=dst) if into else buf.to_numpy()

        return run

    cases = {
        "numpy copy (new array)": numpy_copy,
        "numpy copyto (existing array)": numpy_copy_into,
        "h2d zero-copy + d2h (new array)": round_trip(False, False),
        "h2d zero-copy + d2h (into array)": round_trip(False, True),
        "h2d copy + d2h (new array)": round_trip(None, False),
        "h2d copy + d2h (into array)": round_trip(None, True),
    }
    for name, fn in cases.items():
        if not np.array_equal(fn(), src):
            sys.exit(f"{name} returned wrong data")
    samples = interleaved_samples(cases, args.rounds, args.iterations)
    medians = {name: statistics.median(times) for name, times in samples.items()}

    nbytes = src.nbytes
    print(f"transfer: host -> device -> host, {args.mib} MiB float32  (plugin API "
          f"{'.'.join(map(str, client.library.api_version))}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.2f})")
    table = Table([("case", 34, ""), ("median ms", 10, ".2f"), ("GB/s", 7, ".2f"), ("fraction of numpy", 18, ".2f")])
    print(table.header())
    for name, median in medians.items():
        into = "into" in name or "copyto" in name
        baseline = medians["numpy copyto (existing array)" if into else "numpy copy (new array)"]
        print(table.row(name, median * 1e3, nbytes / median / 1e9, baseline / median))
    best = medians["numpy copy (new array)"] / medians["h2d zero-copy + d2h (new array)"]
    print(f"goal: >= 0.8 of a numpy copy -> {'met' if best >= 0.8 else 'NOT met'} ({best:.2f}, zero-copy, new array)")
    client.close()


if __name__ == "__main__":
    main()
