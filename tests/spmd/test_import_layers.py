"""The SPMD package's layers, checked on its source: each layer imports only the layers below it, no module
imports another in a circle, and no import hides inside a function (the engine's one lazy seam excepted).

docs/architecture.md draws the same layers. A new module goes in the layer that matches what it imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pjrt_plugins.spmd as xs

SPMD_DIR = Path(xs.__file__).parent
PACKAGE = "pjrt_plugins.spmd"

#: Each layer, bottom up, with the layers it may import (besides itself).
LAYERS: dict[str, set[str]] = {
    "sharding": set(),
    "devices": {"sharding"},
    "transport": {"sharding", "devices"},
    "lowering": {"sharding"},
    "execution": {"sharding", "devices", "transport", "lowering"},
    "trace": {"sharding", "devices", "transport", "lowering", "execution"},
    "frontend": {"sharding", "devices", "transport", "lowering", "execution", "trace"},
}
#: The modules of pjrt_plugins outside spmd that each layer may use (the hook layer and the registry only for
#: the virtual device, which creates the client; every layer may raise the package's errors and use the runtime).
OUTSIDE: dict[str, set[str]] = {
    "devices": {"pjrt_plugins._plugin", "pjrt_plugins._registry"},
    "execution": {"pjrt_plugins._cache_files"},  # the disk cache's files, shared with `pjrt-plugins cache`
}
ALWAYS_ALLOWED = {"pjrt_plugins.errors", "pjrt_plugins.runtime"}


def _modules() -> dict[str, ast.Module]:
    modules = {}
    for path in sorted(SPMD_DIR.rglob("*.py")):
        parts = path.relative_to(SPMD_DIR).with_suffix("").parts
        name = ".".join((PACKAGE, *parts[:-1])) if parts[-1] == "__init__" else ".".join((PACKAGE, *parts))
        modules[name] = ast.parse(path.read_text(), str(path))
    return modules


MODULES = _modules()


def _is_package(name: str) -> bool:
    return (SPMD_DIR / Path(*name.split(".")[2:]) / "__init__.py").exists() if name != PACKAGE else True


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if _is_package(module) else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, tree: ast.Module, *, runtime_only: bool = False) -> list[tuple[str, ast.stmt]]:
    """Every module ``module`` imports (a name imported from a package counts as the submodule when it is one);
    ``runtime_only``: without the imports under ``if TYPE_CHECKING:`` (annotations only, never run)."""
    skip = _type_checking_nodes(tree) if runtime_only else set()
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, node) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in MODULES else target, node))
    return found


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    nodes = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            nodes |= {id(n) for n in ast.walk(node)}
    return nodes


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["pjrt_plugins", "spmd"] and parts[2] in LAYERS else None


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _layer(m)))
def test_each_layer_imports_only_the_layers_below_it(module):
    layer = _layer(module)
    assert layer is not None
    allowed = LAYERS[layer] | {layer}
    bad = []
    for target, node in _imports(module, MODULES[module]):
        if target.startswith(PACKAGE + "."):
            other = _layer(target)
            if other not in allowed:
                bad.append(f"line {node.lineno}: {target} (layer {other})")
        elif target.startswith("pjrt_plugins"):
            if not (target in ALWAYS_ALLOWED or target in OUTSIDE.get(layer, set())
                    or any(target.startswith(a + ".") for a in ALWAYS_ALLOWED if a != "pjrt_plugins.runtime")):
                bad.append(f"line {node.lineno}: {target}")
    assert bad == [], f"{module} (layer {layer}) may import only {sorted(allowed)}: {bad}"


def test_the_sharding_layer_never_imports_torch():
    for module, tree in MODULES.items():
        if _layer(module) == "sharding":
            torchy = [t for t, _ in _imports(module, tree) if t.split(".")[0] == "torch"]
            assert torchy == [], (module, torchy)


def test_no_import_hides_inside_a_function():
    hidden = []
    for module, tree in MODULES.items():
        type_only = _type_checking_nodes(tree)
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in type_only:
                    hidden.append(f"{module}.{func.name} line {node.lineno}: {ast.unparse(node)}")
    assert hidden == [], "imports inside functions (move them to the top of the module):\n" + "\n".join(hidden)


def test_the_engine_loads_through_one_seam():
    # importlib is the lazy seam's tool: only frontend._seam may use it, and the package itself, whose public
    # API serves the DTensor bridge (an API module above every layer, importing torch.distributed.tensor) lazily.
    users = [m for m, tree in MODULES.items() if any(t == "importlib" for t, _ in _imports(m, tree))]
    assert users == [PACKAGE, f"{PACKAGE}.frontend._seam"], users


def test_no_module_imports_another_in_a_circle():
    graph = {m: {t for t, _ in _imports(m, tree, runtime_only=True) if t in MODULES and t != m}
             for m, tree in MODULES.items()}
    # Tarjan's strongly connected components.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == [], circles


def test_no_module_is_longer_than_700_lines():
    long = {p.relative_to(SPMD_DIR).as_posix(): n for p in SPMD_DIR.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 700}
    assert long == {}, long
