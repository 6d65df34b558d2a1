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
import warnings
from importlib.metadata import Distribution, EntryPoint
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from ._marker import hookimpl
from ._plugin import DevicePlugin
from ._torch_xla import distribution_name, normalize_distribution_name
from .errors import PluginUnavailableError, PluginWarning

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
    """One JAX plugin package: its module, its distribution (when known) and how it was found.

    ``conflict`` says why none of its libraries may be opened (several distributions claim the module).
    """

    module: str  # e.g. jax_plugins.xla_cuda12
    dist: Distribution | None
    origin: str
    conflict: str | None = None


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
    """Every JAX plugin package: the entry points of ``jax_plugins``, then namespace modules not named by one.

    When the entry points of several distributions name one module, the one whose file
    list (RECORD) installs it keeps it, and the others are warned about; when that does not
    single one out, the package is kept with a ``conflict`` and none of their libraries is opened.
    """
    claims: dict[str, list[EntryPoint]] = {}
    for ep in entry_points:
        module = ep.value.partition(":")[0].strip()
        if module:
            claims.setdefault(module, []).append(ep)
    found = {module: _claimed(module, eps) for module, eps in claims.items()}
    for module in _namespace_modules():
        if module not in found:
            found[module] = JaxPackage(module, None, f"namespace package {module}")
    return list(found.values())


def _origin(ep: EntryPoint) -> str:
    return f"entry point {JAX_GROUP}: {ep.name} = {ep.value}"


def _claimed(module: str, eps: list[EntryPoint]) -> JaxPackage:
    """The package ``module`` as the entry points ``eps`` claim it (see :func:`jax_packages`)."""
    by_distribution: dict[str, EntryPoint] = {}
    for ep in eps:
        by_distribution.setdefault(distribution_name(getattr(ep, "dist", None)) or ep.value, ep)
    first = eps[0]
    if len(by_distribution) == 1:
        return JaxPackage(module, getattr(first, "dist", None), _origin(first))
    names = sorted(by_distribution)
    owners = [name for name in names if _installs(getattr(by_distribution[name], "dist", None), module)]
    claimants = " and ".join(names)
    if len(owners) == 1:
        owner = by_distribution[owners[0]]
        others = ", ".join(name for name in names if name != owners[0])
        warnings.warn(
            f"pjrt_plugins: the JAX plugin module {module} is named by the {JAX_GROUP} entry points of {claimants}; "
            f"only {owners[0]} installs it, so the claim of {others} is ignored. Uninstall {others} if you did "
            "not mean to install it",
            PluginWarning,
            stacklevel=5,
        )
        return JaxPackage(module, owner.dist, _origin(owner))
    which = "each of them installs it" if owners else "none of them installs it"
    conflict = (
        f"the JAX plugin module {module} is claimed by the {JAX_GROUP} entry points of {claimants} and {which} "
        "(by its RECORD), so no library of theirs is opened; uninstall all but one"
    )
    warnings.warn(f"pjrt_plugins: {conflict}", PluginWarning, stacklevel=5)
    return JaxPackage(module, None, f"entry points {JAX_GROUP} of {claimants}", conflict)


def _record(dist: Distribution) -> list[str]:
    """The paths the distribution's file list (RECORD) names; ``ValueError`` naming the file when it is damaged."""
    try:
        return [str(f) for f in dist.files or []]
    except (ValueError, OSError, UnicodeDecodeError) as exc:  # e.g. NUL bytes: csv or int() refuse the line
        raise ValueError(f"its file list (RECORD) cannot be read: {type(exc).__name__}: {exc}") from None


def _installs(dist: Distribution | None, module: str) -> bool:
    """Whether ``dist``'s RECORD lists ``module`` itself (its ``__init__.py``, or ``module.py``)."""
    if dist is None:
        return False
    base = module.replace(".", "/")
    try:
        files = set(_record(dist))
    except ValueError:
        return False
    return f"{base}/__init__.py" in files or f"{base}.py" in files


def _namespace_modules() -> list[str]:
    """The ``jax_plugins.*`` modules on sys.path, found without importing anything."""
    modules = []
    for location in _namespace_locations():
        try:
            entries = sorted(os.scandir(location), key=lambda e: e.name)
        except OSError as exc:
            _skip(location, exc)
            continue
        for entry in entries:
            name = entry.name
            if not name.isidentifier():
                continue
            try:  # follows links: a symlink loop or a dead mount is skipped with a warning, never fatal
                is_package = entry.is_dir() and os.path.isfile(os.path.join(entry.path, "__init__.py"))
            except OSError as exc:
                _skip(entry.path, exc)
                continue
            if is_package:
                modules.append(f"{JAX_NAMESPACE}.{name}")
    return modules


def _namespace_locations() -> list[str]:
    """The ``jax_plugins`` folders on sys.path (none when the path cannot be searched)."""
    from importlib.machinery import PathFinder

    try:
        spec = PathFinder.find_spec(JAX_NAMESPACE)
    except (OSError, ImportError, ValueError) as exc:
        _skip(JAX_NAMESPACE, exc)
        return []
    return list(spec.submodule_search_locations or []) if spec is not None else []


def _skip(where: str, exc: BaseException) -> None:
    _warn(f"skipping {where} while looking for JAX plugin packages: {type(exc).__name__}: {exc}")


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

    def library_path(self) -> str:
        """The library, or PluginUnavailableError saying why this package has none (not just "not found")."""
        why = self._find_library()[1]
        if why is not None and self.hook.pjrt_library_path() is None:  # a site override may still name one
            raise PluginUnavailableError(f"plugin {self._label}: {why}")
        return super().library_path()

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
    """(path, None) for the package's library, or (None, why there is none).

    A distribution's library must be one of its own files (its RECORD), inside the
    package's folder, in a distribution that installs the package: a RECORD entry that
    climbs out (``../``), a link that leads outside the folder, or a package claimed by an
    entry point of a distribution that does not install it is refused, never opened.
    """
    if package.conflict is not None:
        return None, package.conflict
    folder = package.module.replace(".", "/") + "/"
    if package.dist is not None:
        distribution = distribution_name(package.dist) or "its distribution"
        try:
            files = _record(package.dist)
        except ValueError as exc:
            _warn(f"JAX plugin package {package.module} ({distribution}): {exc}")
            return None, f"{exc}; reinstall {distribution}"
        if files and not _installs(package.dist, package.module):
            return None, (
                f"{distribution} names {package.module} in its {JAX_GROUP} entry point but does not install it "
                f"(its RECORD lists no {folder}__init__.py); no library is opened for it"
            )
        inside = [f for f in files if f.startswith(folder)]
        escaping = [f for f in inside if _climbs_out(f)]
        if escaping:
            _warn(f"JAX plugin package {package.module} ({distribution}): its RECORD names {escaping[0]!r}, outside the package")
            return None, f"its RECORD names {escaping[0]!r}, which leaves the package folder {folder}; reinstall {distribution}"
        candidates = sorted(f for f in inside if f.endswith(_SUFFIX))
        if not candidates:
            others = sorted(PurePosixPath(f).name for f in inside if PurePosixPath(f).suffix in (".so", ".dylib", ".dll"))
            found = f" (it has {', '.join(others)}, for another platform)" if others else ""
            return None, f"its package ships no PJRT library for this platform (*{_SUFFIX}) in {folder}{found}"
        chosen = _preferred(candidates)
        path = Path(str(package.dist.locate_file(chosen))).absolute()
        home = Path(str(package.dist.locate_file(folder.rstrip("/"))))
        if not _within(path, home):
            return None, f"its library {path} leads outside its package folder {home} (a link?); reinstall {distribution}"
    else:  # a namespace package no distribution names: look in its folder
        name = package.module.rpartition(".")[2]
        candidates = []
        for location in _namespace_locations():
            try:
                candidates += sorted(str(p) for p in Path(location, name).glob(f"*{_SUFFIX}"))
            except OSError as exc:
                _warn(f"cannot search {Path(location, name)}: {type(exc).__name__}: {exc}")
        if not candidates:
            return None, f"its package folder {folder} holds no PJRT library (*{_SUFFIX})"
        path = Path(_preferred(candidates))
    if not path.is_file():
        return None, f"its library {path} is listed by its distribution but missing; reinstall the package"
    return str(path), None


def _climbs_out(relative: str) -> bool:
    """A RECORD path that is absolute or has a ``..`` component (so may point anywhere)."""
    return relative.startswith("/") or ".." in PurePosixPath(relative).parts


def _within(path: Path, folder: Path) -> bool:
    """Whether ``path``, links resolved, lies inside ``folder`` (links resolved too)."""
    try:
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))
    except (OSError, ValueError):
        return False


def _warn(message: str) -> None:
    warnings.warn(f"pjrt_plugins: {message}", PluginWarning, stacklevel=4)


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
