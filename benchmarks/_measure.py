"""What the benchmark scripts share: the CPU plugin's library, interleaved timing rounds, fixed-width
tables, and worker processes (jax, another torch).

Imported by the scripts next to it (``python benchmarks/<name>.py`` puts this folder on
``sys.path``). Measures and formats only: never asserts a timing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


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


class Worker:
    """The calling benchmark script re-run as a worker process with ``flag`` (by ``python``, default ours).

    A peer that cannot share our process (another XLA runtime, another torch) runs there and speaks
    one JSON line per command (see :func:`serve_commands`). ``info`` is its first line, sent once it
    is ready::

        with Worker(__file__, ["--steps", "5"], flag="--torch-xla-worker", python=other) as worker:
            worker.info["version"]; result = worker.request("run", 5)
    """

    def __init__(self, script: str, arguments: Sequence[str], *, flag: str, python: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [python or sys.executable, script, flag, *arguments],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, **(env or {})},
        )
        self.flag = flag
        self.info = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker exited; run the script with {self.flag} to see why")
        return json.loads(line)

    def request(self, *words: object) -> dict[str, Any]:
        """Send one command line and return the worker's JSON answer."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join(map(str, words)) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        self.proc.wait(timeout=60)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class JaxWorker(Worker):
    """A :class:`Worker` running jax (``--jax-worker``) on ``devices`` host devices.

    Two XLA runtimes do not share a process, so jax runs in its own (``JAX_PLATFORMS=cpu``,
    ``--xla_force_host_platform_device_count``, then ``xla_flags``)::

        with JaxWorker(__file__, ["--size-mib", "256"], devices=8) as worker:
            worker.info["version"]; result = worker.request("run", "cols")
    """

    def __init__(self, script: str, arguments: Sequence[str], devices: int, xla_flags: Sequence[str] = ()) -> None:
        flags = " ".join([os.environ.get("XLA_FLAGS", ""), f"--xla_force_host_platform_device_count={devices}",
                          *xla_flags]).strip()
        env = {"XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu",
               "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")}
        super().__init__(script, arguments, flag="--jax-worker", env=env)


def serve_commands(ready: dict[str, Any], handle: Callable[[list[str]], dict[str, Any]]) -> int:
    """The worker's side of :class:`Worker`: print ``ready``, then answer each command line on stdin
    with ``handle(words)`` as one JSON line, until ``quit`` or the end of input."""
    print(json.dumps(ready), flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        print(json.dumps(handle(words)), flush=True)
    return 0
