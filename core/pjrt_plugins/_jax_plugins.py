"""JAX's plugin packages as plugins: found from metadata alone, never imported, their library opened only for a client.

JAX finds its plugins through the entry-point group ``jax_plugins`` and the
namespace package ``jax_plugins.*`` (jax-cuda12-pjrt ships
``jax_plugins/xla_cuda12/xla_cuda_plugin.so``). Their ``__init__`` imports jax, so
they are never imported here: the library comes from the distribution's file list
(RECORD), everything else from the core defaults. ``PJRT_PLUGINS_JAX=0`` turns the
family off.
"""

from __future__ import annotations

import os
import re
import sys
from importlib.metadata import Distribution, EntryPoint
from pathlib import Path
from typing import NamedTuple

from ._marker import hookimpl
from ._plugin import DevicePlugin
from ._torch_xla import normalize_distribution_name

#: JAX's entry-point group, and its namespace package.
JAX_GROUP = "jax_plugins"
JAX_NAMESPACE = "jax_plugins"
#: ``0``/``false``/``no``/``off`` turns discovery of JAX plugin packages off.
JAX_SWITCH_VAR = "PJRT_PLUGINS_JAX"
#: The library suffix JAX plugin wheels use on this platform.
_SUFFIX = {"darwin": ".dylib", "win32": ".dll"}.get(sys.platform, ".so")

# Device families we can look for cheaply on the PCI bus: name prefix -> (vendor id, class prefix, what).
_PCI_FAMILIES = {
    "cuda": (0x10DE, 0x03, "NVIDIA GPU"),
    "rocm": (0x1002, 0x03, "AMD GPU"),
    "oneapi": (0x8086, 0x03, "Intel GPU"),
    "tt": (0x1E52, None, "Tenstorrent device"),
    "libtt": (0x1E52, None, "Tenstorrent device"),
}
_PCI_DEVICES = Path("/sys/bus/pci/devices")


class JaxPackage(NamedTuple):
    """One JAX plugin package: its module, its distribution (when known) and how it was found."""

    module: str  # e.g. jax_plugins.xla_cuda12
    dist: Distribution | None
    origin: str


def enabled(environ: os._Environ[str] | dict[str, str] | None = None) -> bool:
    raw = (os.environ if environ is None else environ).get(JAX_SWITCH_VAR, "").strip().lower()
    return raw not in {"0", "false", "no", "off"}


def plugin_name(module: str) -> str:
    """The naming rule: the package's last component with JAX's ``xla_`` prefix dropped.

    ``jax_plugins.xla_cuda12`` -> ``cuda12``, ``jax_plugins.xla_rocm7`` -> ``rocm7``,
    ``jax_plugins.libtt`` -> ``libtt``. (The canonical form is applied by the caller.)
    """
    last = module.rpartition(".")[2]
    return last.removeprefix("xla_") or last


def jax_packages(entry_points: list[EntryPoint]) -> list[JaxPackage]:
    """Every JAX plugin package: the entry points of ``jax_plugins``, then namespace modules not named by one."""
    found: dict[str, JaxPackage] = {}
    for ep in entry_points:
        module = ep.value.partition(":")[0].strip()
        if module and module not in found:
            found[module] = JaxPackage(module, getattr(ep, "dist", None), f"entry point {JAX_GROUP}: {ep.name} = {ep.value}")
    for module in _namespace_modules():
        if module not in found:
            found[module] = JaxPackage(module, None, f"namespace package {module}")
    return list(found.values())


def _namespace_modules() -> list[str]:
    """The ``jax_plugins.*`` modules on sys.path, found without importing anything."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec(JAX_NAMESPACE)
    if spec is None or not spec.submodule_search_locations:
        return []
    modules = []
    for location in spec.submodule_search_locations:
        try:
            entries = sorted(os.scandir(location), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if entry.is_dir() and name.isidentifier() and os.path.isfile(os.path.join(entry.path, "__init__.py")):
                modules.append(f"{JAX_NAMESPACE}.{name}")
    return modules


class JaxPackagePlugin(DevicePlugin):
    """A JAX plugin package, with the core defaults: its library is the one its distribution's RECORD lists.

    Priority -10: a backend of ours is chosen first; among JAX packages the name decides.
    It is unavailable when its distribution ships no library for this platform, or, for
    the families known here (CUDA, ROCm, oneAPI, Tenstorrent), when no such device is on
    the PCI bus.
    """

    def __init__(self, package: JaxPackage) -> None:
        super().__init__()
        self.package = package
        self._library: tuple[str | None, str | None] | None = None  # (path, why none)

    def _find_library(self) -> tuple[str | None, str | None]:
        if self._library is None:
            self._library = _library_of(self.package)
        return self._library

    @hookimpl
    def pjrt_library_path(self) -> str | None:
        return self._find_library()[0]

    @hookimpl
    def pjrt_priority(self) -> int:
        return -10

    @hookimpl
    def pjrt_library_missing_hint(self) -> str | None:
        return self._find_library()[1]  # why the package has none (the core says that it has none)

    @hookimpl
    def pjrt_unavailable_reason(self) -> str | None:
        return _missing_hardware(plugin_name(self.package.module))

    def __repr__(self) -> str:
        return f"<JaxPackagePlugin name={self.name!r} module={self.package.module!r}>"


def _library_of(package: JaxPackage) -> tuple[str | None, str | None]:
    """(path, None) for the package's library, or (None, why there is none)."""
    folder = package.module.replace(".", "/") + "/"
    if package.dist is not None:
        files = package.dist.files or []
        inside = [f for f in files if str(f).startswith(folder)]
        candidates = sorted(str(f) for f in inside if str(f).endswith(_SUFFIX))
        if not candidates:
            others = sorted(f.name for f in inside if f.suffix in (".so", ".dylib", ".dll"))
            found = f" (it has {', '.join(others)}, for another platform)" if others else ""
            return None, f"its package ships no PJRT library for this platform (*{_SUFFIX}) in {folder}{found}"
        path = Path(str(package.dist.locate_file(_preferred(candidates)))).absolute()
    else:  # a namespace package no distribution names: look in its folder
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(JAX_NAMESPACE)
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        candidates = sorted(
            str(p) for loc in locations for p in Path(loc, package.module.rpartition(".")[2]).glob(f"*{_SUFFIX}")
        )
        if not candidates:
            return None, f"its package folder {folder} holds no PJRT library (*{_SUFFIX})"
        path = Path(_preferred(candidates))
    if not path.is_file():
        return None, f"its library {path} is listed by its distribution but missing; reinstall the package"
    return str(path), None


def _preferred(candidates: list[str]) -> str:
    """The one that looks like the PJRT plugin when a package ships several libraries."""
    for word in ("pjrt", "plugin"):
        named = [c for c in candidates if word in Path(c).name]
        if named:
            return named[0]
    return candidates[0]


def _missing_hardware(name: str) -> str | None:
    """For a known family, why its device is absent here (cheap: reads sysfs), else ``None``."""
    family = next((f for f in sorted(_PCI_FAMILIES, key=len, reverse=True) if name.startswith(f)), None)
    if family is None:
        return None
    vendor, device_class, what = _PCI_FAMILIES[family]
    try:
        devices = list(_PCI_DEVICES.iterdir())
    except OSError:
        return None  # no sysfs: cannot tell, let client creation say
    for device in devices:
        try:
            if int((device / "vendor").read_text(), 16) != vendor:
                continue
            if device_class is None or int((device / "class").read_text(), 16) >> 16 == device_class:
                return None
        except (OSError, ValueError):
            continue
    return f"no {what} found on this host (no PCI device of vendor id {vendor:#06x} under {_PCI_DEVICES})"


def required_distributions(dist: Distribution) -> set[str]:
    """The normalized names ``dist`` requires (Requires-Dist, extras included), read cheaply from METADATA."""
    try:
        text = dist.read_text("METADATA") or ""
    except Exception:  # noqa: BLE001 - unreadable metadata: it requires nothing we can see
        return set()
    names = set()
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line[len("Requires-Dist:") :])
            if match:
                names.add(normalize_distribution_name(match.group(1)))
        elif not line.strip():
            break  # the headers end at the first blank line; the long description follows
    return names
