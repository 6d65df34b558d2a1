"""The core's import layers, as a contract CI enforces: read from the sources with ``ast``, nothing imported.

- Every module of the core sits in one row of :data:`LAYERS` (bottom first) and imports only
  modules of its own row or the rows below, wherever the import statement is.
- Executed imports form no circle, not even inside one row.
- An import inside a function is either a documented lazy seam (:data:`LAZY_SEAMS`, where
  start-up cost demands it), an optional dependency (:data:`OPTIONAL_IMPORTS`) or the standard
  library. Anything else is an import moved into a function to hide a circle.
- Imports under ``if TYPE_CHECKING:`` never run; they may name a module above only inside the
  runtime, whose objects name each other in annotations (a Buffer's ``client`` is a Client).

The SPMD package keeps its own layers (sharding/ < devices/ < transport/ < lowering/ < execution/ <
trace/ < frontend/), enforced by tests/spmd/test_import_layers.py; here it is :data:`NOT_LAYERED_YET`.
"""

from __future__ import annotations

import ast
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[2] / "core"
PACKAGE = "pjrt_plugins"

#: The layers, bottom first: (name, module patterns). A module matches the first pattern that names it
#: exactly, else the first wildcard pattern.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Pure vocabulary every layer uses: exceptions, option types, the hookimpl marker, time limits.
    ("foundation", ("pjrt_plugins.errors", "pjrt_plugins.options", "pjrt_plugins._marker", "pjrt_plugins._timeouts", "pjrt_plugins._env",
                    "pjrt_plugins._native_logs")),
    # The runtime: a cffi binding that never sees a plugin object (its rows bottom first).
    ("runtime: ABI facts", (
        "pjrt_plugins.runtime._cdef", "pjrt_plugins.runtime._elf", "pjrt_plugins.runtime._code_map",
        "pjrt_plugins.runtime._bounded", "pjrt_plugins.runtime._proto", "pjrt_plugins.runtime._dtypes",
        "pjrt_plugins.runtime._compile_options", "pjrt_plugins.runtime._file_checksum",
        "pjrt_plugins.runtime._build_fastpath", "pjrt_plugins.runtime._xspace",
    )),
    ("runtime: args and fast path", (
        "pjrt_plugins.runtime._args", "pjrt_plugins.runtime._named_values", "pjrt_plugins.runtime._fastpath",
    )),
    ("runtime: events", ("pjrt_plugins.runtime._events",)),
    ("runtime: library", ("pjrt_plugins.runtime._library",)),
    ("runtime: handles", (
        "pjrt_plugins.runtime._inflight", "pjrt_plugins.runtime._kv", "pjrt_plugins.runtime._host_arrays",
        "pjrt_plugins.runtime._pinning", "pjrt_plugins.runtime._read_plan", "pjrt_plugins.runtime._memory",
        "pjrt_plugins.runtime._devices", "pjrt_plugins.runtime._client_create", "pjrt_plugins.runtime._profiler",
    )),
    ("runtime: buffers", ("pjrt_plugins.runtime._buffer",)),
    ("runtime: executables", ("pjrt_plugins.runtime._executable",)),
    ("runtime: client", ("pjrt_plugins.runtime._client", "pjrt_plugins.runtime._partitioner")),
    ("runtime", ("pjrt_plugins.runtime",)),
    # The DevicePlugin contract, its defaults, and creating a client from a plugin's hooks.
    ("hook contract", (
        "pjrt_plugins.hookspecs", "pjrt_plugins._defaults", "pjrt_plugins._plugin",
        "pjrt_plugins._client_setup", "pjrt_plugins._plugin_client",
    )),
    ("discovery and registry", (
        "pjrt_plugins._torch_xla", "pjrt_plugins._library_lookup", "pjrt_plugins._registry",
        "pjrt_plugins._library_plugin", "pjrt_plugins._jax_plugins", "pjrt_plugins._discovery",
    )),
    # `import pjrt_plugins`: the public names, and discovery at import.
    ("package", ("pjrt_plugins",)),
    ("integrations", ("pjrt_plugins.distributed", "pjrt_plugins.jax_plugin", "pjrt_plugins.profiler")),
    # The compile cache directory as files (no torch): below the SPMD cache and `pjrt-plugins cache`, which share it.
    ("cache files", ("pjrt_plugins._cache_files",)),
    # (the SPMD rows go here)
    ("tools", (
        "pjrt_plugins._child_process", "pjrt_plugins._cli_common", "pjrt_plugins._listing", "pjrt_plugins._doctor",
        "pjrt_plugins._cache_command",
        "pjrt_plugins.conform", "pjrt_plugins.conform.*", "pjrt_plugins.cli", "pjrt_plugins.__main__",
    )),
)

#: Packages whose modules have no rows yet: neither checked nor checked against.
NOT_LAYERED_YET = ("pjrt_plugins.spmd",)

#: Imports of our own modules inside functions, each a seam where start-up cost demands it.
LAZY_SEAMS: dict[tuple[str, str], str] = {
    ("pjrt_plugins", "pjrt_plugins._plugin_client"): "pjrt_plugins.create_client_for_plugin: the runtime (cffi, numpy) loads on first use",
    ("pjrt_plugins", "pjrt_plugins.options"): "pjrt_plugins.OptionType: options imports dataclasses and difflib",
    ("pjrt_plugins", "pjrt_plugins.hookspecs"): "pjrt_plugins.hookspec: hookspecs imports pluggy",
    ("pjrt_plugins._plugin", "pjrt_plugins.hookspecs"): "a backend's hook manager (pluggy) is built on first use, not at discovery",
    ("pjrt_plugins._plugin", "pjrt_plugins.options"): "option_schema() on first use: discovery constructs every backend",
    ("pjrt_plugins._plugin", "pjrt_plugins._plugin_client"): "create_client() loads the runtime: `import pjrt_plugins` must not",
    ("pjrt_plugins.cli", "pjrt_plugins.runtime"): "only the commands that open a library load the runtime",
    ("pjrt_plugins._doctor", "pjrt_plugins.runtime"): "only the doctor's child process opens the library",
    ("pjrt_plugins.conform._runner", "pjrt_plugins.conform._catalog"): "the checks import the runtime: loaded to plan or run them",
}

#: Packages imported inside functions because they are optional (or, for pluggy, a start-up cost), and
#: where. A pattern of modules (fnmatch) that may import each.
OPTIONAL_IMPORTS: dict[str, tuple[str, str]] = {
    "torch": ("pjrt_plugins.*", "the [spmd] extra: torch tensors and torch.distributed, only where given or asked for"),
    "jax": ("pjrt_plugins.*", "JAX imports our jax_plugin module itself; the conformance probe runs under it"),
    "jaxlib": ("pjrt_plugins.*", "the [spmd] extra: printing HLO, the XLA client probe"),
    "torch_xla": ("pjrt_plugins.conform._framework_probe", "the torch_xla probe runs in torch_xla's own interpreter"),
    "numpy": ("pjrt_plugins.conform._framework_probe", "the probe runs in the framework's interpreter, imported late"),
    "pluggy": ("pjrt_plugins._plugin", "a dependency, imported when the first hook manager is built: discovery stays cheap"),
}


@dataclass(frozen=True)
class Import:
    """One import statement's target, as seen in the source."""

    importer: str
    target: str
    path: str  # as shown in messages
    line: int
    where: str  # "module", "function" or "type-checking"

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} imports {self.target} ({self.where})"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def core_modules(root: Path) -> dict[str, Path]:
    return {module_name(path, root): path for path in sorted((root / PACKAGE).rglob("*.py"))}


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _placement(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str:
    where = "module"
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return "type-checking"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            where = "function"
    return where


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[Import]:
    """Every import in ``path``, each target resolved to the module it names (a submodule where one exists)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    parents = _parents(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module for alias in node.names]
        else:
            continue
        shown = str(path.relative_to(path.parents[len(name.split(".")) - (path.name != "__init__.py")]))
        for target in dict.fromkeys(targets):
            yield Import(name, target, shown, node.lineno, _placement(node, parents))


def layer_of(module: str) -> int | None:
    """The row index of ``module`` (exact names first, then wildcards), or None."""
    for index, (_name, patterns) in enumerate(LAYERS):
        if module in patterns:
            return index
    for index, (_name, patterns) in enumerate(LAYERS):
        if any("*" in pattern and fnmatchcase(module, pattern) for pattern in patterns):
            return index
    return None


def _not_layered(module: str) -> bool:
    return any(module == package or module.startswith(package + ".") for package in NOT_LAYERED_YET)


def _internal_target(target: str, known: set[str]) -> str | None:
    """The core module ``target`` names (``a.b.c`` imports ``a.b`` when ``c`` is an attribute), or None."""
    while target:
        if target in known:
            return target
        target = target.rpartition(".")[0]
    return None


def _seam(importer: str, target: str) -> tuple[str, str] | None:
    """The :data:`LAZY_SEAMS` entry an import inside a function of ``importer`` falls under (a seam to a
    package covers its modules), or None."""
    for seam_importer, seam_target in LAZY_SEAMS:
        if importer == seam_importer and (target == seam_target or target.startswith(seam_target + ".")):
            return seam_importer, seam_target
    return None


def violations(root: Path) -> list[str]:
    """Every breach of the contract under ``root`` (a directory holding the ``pjrt_plugins`` package)."""
    modules = core_modules(root)
    known = set(modules)
    problems: list[str] = []
    executed: dict[str, set[str]] = {}
    for module, path in modules.items():
        if _not_layered(module):
            continue
        here = layer_of(module)
        if here is None:
            problems.append(f"{module} is in no layer: add it to a row of LAYERS in {Path(__file__).name}")
            continue
        for item in imports_of(module, path, known):
            target = _internal_target(item.target, known)
            if target is None:
                top = item.target.partition(".")[0]
                if item.where == "function" and top not in sys.stdlib_module_names:
                    allowed = OPTIONAL_IMPORTS.get(top)
                    if allowed is None or not fnmatchcase(module, allowed[0]):
                        problems.append(f"{item}: an import inside a function that is neither the standard library "
                                        "nor listed in OPTIONAL_IMPORTS")
                continue
            if target == module or _not_layered(target):
                continue
            there = layer_of(target)
            if there is None:
                continue  # reported for the target itself
            if item.where == "function" and _seam(module, target) is None:
                problems.append(f"{item}: an import of our own module inside a function; import it at the top "
                                "(or, if start-up cost demands it, document it in LAZY_SEAMS)")
            if there > here:
                type_only_within_runtime = item.where == "type-checking" and module.startswith(f"{PACKAGE}.runtime") \
                    and target.startswith(f"{PACKAGE}.runtime")
                if not type_only_within_runtime:
                    problems.append(f"{item}: layer {LAYERS[here][0]!r} imports layer {LAYERS[there][0]!r} above it")
            if item.where != "type-checking":
                executed.setdefault(module, set()).add(target)
    problems += [f"import circle: {' -> '.join(cycle)}" for cycle in _cycles(executed)]
    return problems


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a closed path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component) + [min(component)])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_core_keeps_its_import_layers():
    problems = violations(CORE)
    assert not problems, "the import layers are broken:\n" + "\n".join(problems)


def test_every_lazy_seam_is_still_there():
    """A seam that is gone must leave the list, so the list stays the documentation of what is lazy."""
    modules = core_modules(CORE)
    known = set(modules)
    seen = {
        _seam(item.importer, _internal_target(item.target, known) or item.target)
        for module, path in modules.items()
        for item in imports_of(module, path, known)
        if item.where == "function"
    }
    assert set(LAZY_SEAMS) <= seen, f"listed but gone: {sorted(set(LAZY_SEAMS) - seen)}"


@pytest.mark.parametrize(
    "module, source, expected",
    [
        ("pjrt_plugins.runtime._buffer", "from .._plugin import DevicePlugin\n",
         "layer 'runtime: buffers' imports layer 'hook contract' above it"),
        ("pjrt_plugins.runtime._library", "def f():\n    from . import _client\n",
         "an import of our own module inside a function"),
        ("pjrt_plugins._registry", "def f():\n    import requests\n", "neither the standard library nor listed"),
        ("pjrt_plugins.runtime._kv", "import typing\nif typing.TYPE_CHECKING:\n    from pjrt_plugins._plugin import DevicePlugin\n",
         "imports layer 'hook contract' above it"),
        ("pjrt_plugins._registry", "from . import _discovery\n", "import circle: pjrt_plugins._discovery -> "),
        ("pjrt_plugins._new_module", "", "pjrt_plugins._new_module is in no layer"),
    ],
)
def test_the_contract_names_each_kind_of_breach(tmp_path, module, source, expected):
    """The checker itself, on a copy of the core with one breach added: it must name it."""
    root = tmp_path / "core"
    shutil.copytree(CORE / PACKAGE, root / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    target = root.joinpath(*module.split(".")).with_suffix(".py")
    original = target.read_text(encoding="utf-8") if target.exists() else ""
    target.write_text(original + "\n" + source, encoding="utf-8")
    problems = violations(root)
    assert any(expected in problem for problem in problems), problems
    assert all(module in problem or "circle" in problem for problem in problems), problems
