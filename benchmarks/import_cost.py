"""What `import pjrt_plugins` costs over the floor of reading the entry points, in fresh processes.

The floor is `importlib.metadata.entry_points(group="torch_xla.plugins")` alone: any
discovery must pay it. Goal: `import pjrt_plugins`, with the four reference backends
installed, at most 1.2x the floor. Run: python benchmarks/import_cost.py [--runs N]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import statistics
import subprocess
import sys
import tempfile

from _measure import Table

PYCACHE = os.path.join(tempfile.gettempdir(), "pjrt-plugins-import-cost-pycache")
REFERENCE_BACKENDS = ("pjrt-plugin-cpu", "pjrt-plugin-gpu", "pjrt-plugin-tpu", "pjrt-plugin-stub-neuron")
GOAL = 1.2  # import pjrt_plugins / the floor (see the module docstring)

CASES = {
    "floor: entry_points(group=...)": (
        "import importlib.metadata; importlib.metadata.entry_points(group='torch_xla.plugins')",
        {},
    ),
    "import pjrt_plugins": ("import pjrt_plugins", {}),
    "import pjrt_plugins (autoload off)": ("import pjrt_plugins", {"PJRT_PLUGINS_AUTOLOAD": "0"}),
}
FLOOR = "floor: entry_points(group=...)"


def time_once(statement: str, extra_env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds the statement takes inside a brand-new interpreter (start-up excluded).

    CPU time (process_time) is the steadier number on a shared machine; wall time is what users feel.
    """
    code = (
        "import time\nw0, c0 = time.perf_counter(), time.process_time()\n"
        f"{statement}\nprint(time.perf_counter() - w0, time.process_time() - c0)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PJRT_") and k != "PYTHONDONTWRITEBYTECODE"}
    # Installed wheels come with bytecode; so must the source trees measured here (kept out of them).
    env["PYTHONPYCACHEPREFIX"] = PYCACHE
    env.update(extra_env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    wall, cpu = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def installed_backends() -> list[str]:
    found = []
    for name in REFERENCE_BACKENDS:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=41, help="fresh processes per case (default 41)")
    args = parser.parse_args()

    backends = installed_backends()
    plugins = [f"{ep.name}={ep.value}" for ep in importlib.metadata.entry_points(group="torch_xla.plugins")]
    print(f"python {sys.version.split()[0]} at {sys.executable}")
    print(f"reference backends installed: {', '.join(backends) or 'none'}")
    print(f"entry points in torch_xla.plugins: {', '.join(plugins) or 'none'}")
    if len(backends) < len(REFERENCE_BACKENDS):
        print("warning: not all four reference backends are installed; the measurement understates the cost")

    for statement, env in CASES.values():  # warm-up: writes the bytecode cache, fills the page cache
        time_once(statement, env)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in CASES}
    for i in range(args.runs):  # interleaved, so drift in machine load hits every case alike
        for name, (statement, env) in CASES.items():
            samples[name].append(time_once(statement, env))
        if (i + 1) % 10 == 0:
            print(f"  {i + 1}/{args.runs} runs", file=sys.stderr)

    def median(name: str, which: int) -> float:
        return statistics.median(s[which] for s in samples[name])

    width = max(map(len, CASES))
    print(f"\nmedians of {args.runs} fresh processes each")
    table = Table([("case", width, ""), ("wall ms", 8, ".2f"), ("x floor", 7, ".2f"), ("CPU ms", 8, ".2f"),
                   ("x floor", 7, ".2f")], sep="  ")
    print(table.header())
    for name in CASES:
        wall, cpu = median(name, 0), median(name, 1)
        print(table.row(name, wall * 1e3, wall / median(FLOOR, 0), cpu * 1e3, cpu / median(FLOOR, 1)))
    wall_ratio = median("import pjrt_plugins", 0) / median(FLOOR, 0)
    cpu_ratio = median("import pjrt_plugins", 1) / median(FLOOR, 1)
    verdict = "met" if max(wall_ratio, cpu_ratio) <= GOAL else "NOT met"
    print(f"\nimport pjrt_plugins = {wall_ratio:.2f}x the floor (wall), {cpu_ratio:.2f}x (CPU); goal <= {GOAL}x: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
