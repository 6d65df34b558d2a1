"""What the benchmark scripts share: the CPU plugin's library, interleaved timing rounds, fixed-width tables.

Imported by the scripts next to it (``python benchmarks/<name>.py`` puts this folder on
``sys.path``). Measures and formats only: never asserts a timing.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def cpu_plugin_library() -> str:
    """The PJRT CPU plugin of the installed xla-cpu-pjrt wheel (exits with a hint when it is missing)."""
    spec = importlib.util.find_spec("xla_plugins.xla_cpu_pjrt")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the xla-cpu-pjrt wheel is not installed; pass --library")
    return str(Path(next(iter(spec.submodule_search_locations))) / "xla_cpu_pjrt.so")


def interleaved_samples(
    cases: dict[str, Callable[[], object]], rounds: int, iterations: int, *, warmup: int = 1
) -> dict[str, list[float]]:
    """Seconds per call of every case: ``warmup`` untimed calls each, then ``rounds`` rounds of
    ``iterations`` timed calls per case, the cases interleaved so machine noise hits all alike."""
    for fn in cases.values():
        for _ in range(warmup):
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


class Table:
    """A fixed-width text table: a left-aligned name column, then right-aligned number columns.

    ``columns`` are ``(title, width, number format)``; the first one's format is unused::

        table = Table([("case", 34, ""), ("median us", 10, ".1f")])
        print(table.header()); print(table.row("ours", 12.34))
    """

    def __init__(self, columns: Sequence[tuple[str, int, str]], sep: str = " ") -> None:
        self.columns = list(columns)
        self.sep = sep

    def header(self) -> str:
        (first, width, _), *rest = self.columns
        return self.sep.join([f"{first:<{width}}", *(f"{title:>{w}}" for title, w, _ in rest)])

    def row(self, name: str, *values: float) -> str:
        (_, width, _), *rest = self.columns
        if len(values) != len(rest):
            raise ValueError(f"{len(values)} values for {len(rest)} number columns")
        return self.sep.join([f"{name:<{width}}", *(f"{v:>{w}{fmt}}" for v, (_, w, fmt) in zip(values, rest))])
