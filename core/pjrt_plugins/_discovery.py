"""Discovery: find installed plugins and environment-named libraries, load each in isolation, register.

Read top to bottom: candidates -> one winner per name -> load (or defer) -> register.
A failing plugin becomes a warning and a "failed" record; it never stops the others.
Nothing here opens a PJRT library or imports torch.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import sys
import threading
import warnings
from collections.abc import Mapping
from importlib.metadata import Distribution, EntryPoint
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import _jax_plugins, _registry
from ._jax_plugins import JaxPackage
from ._library_plugin import LibrarySpec, library_specs_from_environment, make_library_plugin
from ._plugin import DevicePlugin
from ._registry import PluginRecord, canonical_name
from ._torch_xla import TORCH_XLA_DISTRIBUTION, distribution_name, normalize_distribution_name
from .errors import PluginLoadError, PluginWarning

if TYPE_CHECKING:  # pragma: no cover
    import logging


def _logger() -> logging.Logger:
    import logging  # on the first log record: `import pjrt_plugins` does not pay for logging

    return logging.getLogger(__name__)


#: The entry-point group backends register in (shared with PyTorch/XLA).
PLUGINS_GROUP = "torch_xla.plugins"
#: Site overrides: entry name = the plugin to layer over (``*`` for all), target = an object with hookimpls.
OVERRIDES_GROUP = "pjrt_plugins.overrides"
#: ``0``/``false``/``no``/``off`` turns discovery at ``import pjrt_plugins`` off.
AUTOLOAD_VAR = "PJRT_PLUGINS_AUTOLOAD"
#: ``name=distribution,...``: which distribution wins a name offered by several.
PREFER_VAR = "PJRT_PLUGINS_PREFER"

_OFF = {"0", "false", "no", "off"}
_ON = {"", "1", "true", "yes", "on"}
_discovery_lock = threading.RLock()
_seen: set[tuple[str, ...]] = set()  # candidates already handled by an earlier discover_plugins()
_site_overrides: dict[str, list[tuple[EntryPoint, str | None]]] = {}
_discovering = False


def autoload_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``import pjrt_plugins`` discovers plugins (``PJRT_PLUGINS_AUTOLOAD``, default on)."""
    raw = (os.environ if environ is None else environ).get(AUTOLOAD_VAR, "").strip().lower()
    if raw in _OFF:
        return False
    if raw not in _ON:
        warnings.warn(f"{AUTOLOAD_VAR}={raw!r} is not one of 0/1/true/false; keeping autoload on", PluginWarning, stacklevel=2)
    return True


class _Candidate:
    """One offer of a plugin name: an entry point or an environment-named library."""

    def __init__(
        self,
        name: str,
        origin: str,
        *,
        entry_point: EntryPoint | None = None,
        dist: Distribution | None = None,
        distribution: str | None = None,  # normalized name
        library: LibrarySpec | None = None,
        deferred_reason: str | None = None,
        jax: JaxPackage | None = None,
    ) -> None:
        self.name = name
        self.origin = origin
        self.entry_point = entry_point
        self.dist = dist
        self.distribution = distribution
        self.library = library
        self.deferred_reason = deferred_reason
        self.jax = jax

    @property
    def key(self) -> tuple[str, ...]:
        return (self.name, self.origin, self.distribution or "")

    def label(self) -> str:
        if self.distribution is None:
            return self.origin
        version = _version(self.dist)
        return f"{self.distribution} {version}" if version else self.distribution


def _version(dist: Distribution | None) -> str | None:
    try:
        return dist.version if dist is not None else None
    except Exception:
        return None


def _entry_points(*groups: str) -> list[list[EntryPoint]]:
    """The entry points of each group, from one scan of the installed distributions.

    The same scan as ``importlib.metadata.entry_points()`` (the first distribution of a
    name on the path wins), bucketed by group in one pass: ``entry_points()`` would also
    sort every entry point by group and ``select()`` filter them all once per group.
    """
    wanted: dict[str, list[EntryPoint]] = {group: [] for group in groups}
    seen: set[str] = set()
    for dist in importlib.metadata.distributions():
        try:
            name = getattr(dist, "_normalized_name", None) or distribution_name(dist) or ""
            if name in seen:
                continue
            seen.add(name)
            entry_points = list(dist.entry_points)
        except (OSError, ValueError, UnicodeDecodeError) as exc:  # a symlink loop, a damaged file: skip that one
            where = getattr(dist, "_path", None) or "an installed distribution"
            warnings.warn(
                f"pjrt_plugins: skipping {where}: its metadata cannot be read ({type(exc).__name__}: {exc}); "
                "reinstall or remove it",
                PluginWarning,
                stacklevel=4,
            )
            continue
        for ep in entry_points:
            bucket = wanted.get(ep.group)
            if bucket is not None:
                bucket.append(ep)
    return [wanted[group] for group in groups]


def _deferred_reason(ep: EntryPoint, distribution: str | None) -> str | None:
    """PyTorch/XLA's own entries import torch_xla (and torch): load them only when asked for."""
    module = ep.value.partition(":")[0].strip()
    if distribution == TORCH_XLA_DISTRIBUTION or module == "torch_xla" or module.startswith("torch_xla."):
        return "provided by PyTorch/XLA; loading it imports torch_xla, so it loads on first use"
    return None


def _entry_point_candidates(entry_points: list[EntryPoint]) -> list[_Candidate]:
    candidates = []
    for ep in entry_points:
        dist = getattr(ep, "dist", None)
        origin = f"entry point {PLUGINS_GROUP}: {ep.name} = {ep.value}"
        try:
            name = canonical_name(ep.name)
        except ValueError as exc:
            warnings.warn(f"pjrt_plugins: skipping {origin}: {exc}", PluginWarning, stacklevel=3)
            continue
        distribution = distribution_name(dist)
        candidates.append(
            _Candidate(
                name,
                origin,
                entry_point=ep,
                dist=dist,
                distribution=distribution,
                deferred_reason=_deferred_reason(ep, distribution),
            )
        )
    return candidates


def _jax_candidates(jax_eps: list[EntryPoint], backends: list[_Candidate]) -> tuple[list[_Candidate], dict[str, list[JaxPackage]]]:
    """JAX plugin packages as candidates, and those that belong to one of our backends (by backend name).

    A package whose distribution also registers a backend in ``torch_xla.plugins`` is that
    backend (our own packages publish both). A package a backend's distribution requires
    (pjrt-plugin-gpu requires jax-cuda13-pjrt) is that backend's library: one plugin, two origins.
    """
    if not _jax_plugins.enabled():
        return [], {}
    packages = _jax_plugins.jax_packages(jax_eps)
    if not packages:
        return [], {}
    backend_dists = {c.distribution: c for c in backends if c.distribution}
    requirers: dict[str, _Candidate] = {}  # JAX package distribution -> the backend that requires it
    for _, backend in sorted(backend_dists.items(), key=lambda item: item[1].name):
        if backend.dist is not None:
            for required in _jax_plugins.required_distributions(backend.dist):
                requirers.setdefault(required, backend)
    candidates: list[_Candidate] = []
    merged: dict[str, list[JaxPackage]] = {}
    for package in packages:
        distribution = distribution_name(package.dist)
        if distribution in backend_dists:
            continue
        if distribution in requirers:
            merged.setdefault(requirers[distribution].name, []).append(package)
            continue
        try:
            name = canonical_name(_jax_plugins.plugin_name(package.module))
        except ValueError as exc:
            warnings.warn(f"pjrt_plugins: skipping JAX plugin {package.origin}: {exc}", PluginWarning, stacklevel=3)
            continue
        candidates.append(_Candidate(name, package.origin, dist=package.dist, distribution=distribution, jax=package))
    return candidates, merged


def _environment_candidates() -> list[_Candidate]:
    candidates = []
    for spec in library_specs_from_environment():
        if isinstance(spec, str):  # an entry that does not parse
            warnings.warn(f"pjrt_plugins: {spec}", PluginWarning, stacklevel=3)
            continue
        try:
            name = canonical_name(spec.name)
        except ValueError as exc:
            warnings.warn(f"pjrt_plugins: {spec.variable}: {exc}", PluginWarning, stacklevel=3)
            continue
        candidates.append(_Candidate(name, f"environment variable {spec.variable}", library=spec))
    return candidates


def _preferences() -> dict[str, str]:
    prefs = {}
    for item in filter(None, (p.strip() for p in os.environ.get(PREFER_VAR, "").split(","))):
        name, sep, dist = item.partition("=")
        if not sep or not name.strip() or not dist.strip():
            warnings.warn(f"pjrt_plugins: {PREFER_VAR} entry {item!r} is not NAME=DISTRIBUTION", PluginWarning, stacklevel=3)
            continue
        try:
            prefs[canonical_name(name)] = normalize_distribution_name(dist.strip())
        except ValueError as exc:
            warnings.warn(f"pjrt_plugins: {PREFER_VAR} entry {item!r}: {exc}", PluginWarning, stacklevel=3)
    return prefs


class _SysPathOrder:
    """Index of the sys.path entry a distribution was found in (computed only for duplicates)."""

    def __init__(self) -> None:
        self._index: dict[Path, int] | None = None

    def __call__(self, dist: Distribution | None) -> int:
        if self._index is None:
            self._index = {}
            for i, entry in enumerate(sys.path):
                try:
                    self._index.setdefault(Path(entry or os.getcwd()).resolve(), i)
                except OSError:
                    continue
        try:
            location = Path(dist.locate_file("")).resolve()  # type: ignore[union-attr, arg-type]
        except Exception:
            return len(sys.path)
        return self._index.get(location, len(sys.path))


def _rank(candidates: list[_Candidate], preferred: str | None, path_order: _SysPathOrder) -> list[_Candidate]:
    """The documented duplicate rule; the first candidate wins.

    1. a library named in the environment (an explicit choice for this process);
    2. the distribution named for this plugin in PJRT_PLUGINS_PREFER;
    3. a backend (``torch_xla.plugins``) over a JAX plugin package;
    4. an entry point loaded when asked for over a deferred (PyTorch/XLA) one;
    5. the distribution found earlier on sys.path (as ``import`` would);
    6. the alphabetically first distribution name, then entry-point value.
    """

    def key(c: _Candidate) -> tuple[Any, ...]:
        return (
            c.library is None,
            not (preferred is not None and c.distribution == preferred),
            c.jax is not None,
            c.deferred_reason is not None,
            path_order(c.dist) if c.library is None else 0,
            c.distribution or "",
            c.entry_point.value if c.entry_point is not None else c.origin,
        )

    return sorted(candidates, key=key)


def _warn_shadowed(winner: _Candidate, losers: list[_Candidate], preferred: str | None) -> None:
    quiet = preferred is not None and winner.distribution == preferred
    loud = [c for c in losers if not (winner.deferred_reason is None and c.distribution == TORCH_XLA_DISTRIBUTION)]
    if _logger().isEnabledFor(20):  # INFO; labels read METADATA: only pay for them when logged
        for loser in losers:
            _logger().info("plugin %r: %s shadows %s", winner.name, winner.label(), loser.label())
    if quiet or not loud:
        return
    others = ", ".join(c.label() for c in loud)
    if winner.library is not None:
        fix = f"Remove {winner.name!r} from {winner.library.variable} to use the installed plugin."
    else:
        alternatives = ", ".join(sorted({c.distribution for c in loud if c.distribution}))
        fix = f"Set {PREFER_VAR}={winner.name}=<distribution> (one of: {alternatives}) to choose, or uninstall one."
    warnings.warn(
        f"pjrt_plugins: plugin name {winner.name!r} is offered by {winner.label()} and by {others}; "
        f"using {winner.label() if winner.library else f'{winner.label()} ({winner.origin})'}. {fix}",
        PluginWarning,
        stacklevel=4,
    )


def _load_entry_point(candidate: _Candidate) -> DevicePlugin:
    """Import and call one entry point; every failure becomes a PluginLoadError with a hint.

    ``SystemExit`` from plugin code (``sys.exit()`` at import) is a failure of that
    plugin like any exception; only ``KeyboardInterrupt`` goes through.
    """
    ep = candidate.entry_point
    assert ep is not None
    where = f"plugin {candidate.name!r} from {candidate.label()} ({candidate.origin})"
    try:
        target = ep.load()
    except (Exception, SystemExit) as exc:
        raise PluginLoadError(
            f"{where} failed to import: {type(exc).__name__}: {exc}. "
            f"Hint: reinstall or upgrade {candidate.distribution or 'its package'} "
            f"(pip install --force-reinstall {candidate.distribution or '<package>'}), or uninstall it."
        ) from exc
    try:
        return _plugin_from_target(target)
    except (Exception, SystemExit) as exc:
        raise PluginLoadError(
            f"{where} failed to construct: {type(exc).__name__}: {exc}. "
            f"Hint: {candidate.distribution or 'the package'} may not match this pjrt-plugins version; "
            "upgrade it, or report this to its maintainers."
        ) from exc


def _plugin_from_target(target: Any) -> DevicePlugin:
    """Call the target as PyTorch/XLA does (``ep.load()()``) and adapt what it returns."""
    if not callable(target):
        raise TypeError(
            f"the entry point names {type(target).__name__} {target!r}; it must name a DevicePlugin class "
            "(or a zero-argument factory), because PyTorch/XLA calls it"
        )
    return _registry._coerce(target())


#: An entry-point value as importlib.metadata reads it: ``module.path:attr.path [extras]``.
_ENTRY_POINT_VALUE = re.compile(r"\s*(?P<module>[\w.]+)\s*(:\s*(?P<attr>[\w.]+)\s*)?(\[.*\])?\s*\Z")


def _entry_module(ep: EntryPoint) -> str | None:
    """The module an entry point names, or ``None`` when its value is not ``module:attribute``."""
    match = _ENTRY_POINT_VALUE.match(ep.value)
    if match is None or not all(match.group("module").split(".")):
        return None
    return match.group("module")


def _record_for(candidate: _Candidate) -> PluginRecord:
    """The record of one winning candidate: built from metadata alone, its code imported on first use.

    Only an environment-named library (no code of its own) is built now; an entry point
    whose value cannot name anything fails now, with a warning.
    """
    common: dict[str, Any] = dict(distribution=candidate.distribution, dist=candidate.dist, entry_name=_entry_name(candidate))
    if candidate.library is not None:
        try:
            plugin: DevicePlugin = make_library_plugin(candidate.library)
        except (ValueError, RecursionError) as exc:
            error = PluginLoadError(f"plugin {candidate.name!r}: {exc}")
            error.__cause__ = exc
            warnings.warn(f"pjrt_plugins: skipping {error}", PluginWarning, stacklevel=4)
            return PluginRecord(candidate.name, candidate.origin, error=error)
        return PluginRecord(candidate.name, candidate.origin, plugin=plugin)
    if candidate.jax is not None:  # core code only: the package itself is never imported
        return PluginRecord(candidate.name, candidate.origin, plugin=_jax_plugins.JaxPackagePlugin(candidate.jax), **common)
    assert candidate.entry_point is not None
    module = _entry_module(candidate.entry_point)
    if module is None:
        cause = ValueError(f"entry point value {candidate.entry_point.value!r} is not 'module:attribute'")
        error = PluginLoadError(
            f"plugin {candidate.name!r} from {candidate.label()} ({candidate.origin}) cannot be loaded: {cause}. "
            f"Hint: the package {candidate.distribution or ''} is broken; reinstall it, or report it to its maintainers."
        )
        error.__cause__ = cause
        record = PluginRecord(candidate.name, candidate.origin, error=error, **common)
        _registry.warn_load_failure(record, stacklevel=5)
        return record
    return PluginRecord(
        candidate.name,
        candidate.origin,
        loader=lambda: _load_entry_point(candidate),
        deferred_reason=candidate.deferred_reason,  # PyTorch/XLA's own: only when asked for by name
        ready=lambda: _module_being_imported(module) is None,
        **common,
    )


def _entry_name(candidate: _Candidate) -> str | None:
    """The name as its ``torch_xla.plugins`` entry point spells it (PyTorch/XLA sees that one), else ``None``."""
    return candidate.entry_point.name.strip() if candidate.entry_point is not None else None


def _module_being_imported(module: str) -> str | None:
    """``module`` (or a parent package) if it is in the middle of its own import."""
    parts = module.split(".")
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        loaded = sys.modules.get(name)
        if loaded is not None and getattr(getattr(loaded, "__spec__", None), "_initializing", False):
            return name
    return None


def _shadow_record(candidate: _Candidate) -> PluginRecord:
    return PluginRecord(
        candidate.name,
        candidate.origin,
        distribution=candidate.distribution,
        dist=candidate.dist,
        deferred_reason=candidate.deferred_reason,
        entry_name=_entry_name(candidate),
    )


# -- site overrides --------------------------------------------------------------


def _read_site_overrides(entry_points: list[EntryPoint]) -> None:
    for ep in entry_points:
        try:
            target = canonical_name(ep.name) if ep.name.strip() != "*" else "*"
        except ValueError as exc:
            warnings.warn(f"pjrt_plugins: skipping override {ep.name} = {ep.value}: {exc}", PluginWarning, stacklevel=3)
            continue
        dist = getattr(ep, "dist", None)
        entries = _site_overrides.setdefault(target, [])
        if all(existing.value != ep.value for existing, _ in entries):
            entries.append((ep, distribution_name(dist)))


def _apply_site_overrides(plugin: DevicePlugin, record: PluginRecord) -> None:
    """Layer every override registered for this name (or ``*``) over the plugin."""
    for ep, distribution in _site_overrides.get("*", []) + _site_overrides.get(record.name, []):
        where = f"override {ep.name} = {ep.value} from {distribution or 'an unknown distribution'}"
        try:
            target = ep.load()
            override = target() if isinstance(target, type) else target
            plugin.add_override(override, name=f"site-override:{ep.name}:{ep.value}")
        except Exception as exc:
            version = _version(getattr(ep, "dist", None))
            warnings.warn(
                f"pjrt_plugins: {where}{' ' + version if version else ''} was not applied to plugin "
                f"{record.name!r}: {type(exc).__name__}: {exc}. The plugin works without it.",
                PluginWarning,
                stacklevel=2,
            )
        else:
            _logger().debug("applied %s to plugin %r", where, record.name)


_registry._attach_callbacks.append(_apply_site_overrides)


# -- the one public entry -------------------------------------------------------------


def discover_plugins(*, installed: bool = True) -> list[PluginRecord]:
    """Register every installed plugin and every library named in the environment.

    Runs at ``import pjrt_plugins`` unless ``PJRT_PLUGINS_AUTOLOAD=0``. Reads
    metadata only: a plugin's module is imported when the plugin is first asked
    for. Calling it again registers only what is new since the last call (a name
    already taken keeps its plugin; the newcomer is recorded as shadowed and warned
    about). ``installed=False`` registers only the environment-named libraries.
    Returns the records it registered.
    """
    global _discovering
    with _discovery_lock:
        if _discovering:  # a plugin's import called us again
            return []
        _discovering = True
        try:
            return _discover(installed)
        finally:
            _discovering = False
            _registry._state["discovered"] = _registry._state["discovered"] or installed


def discover_for_tools() -> list[PluginRecord]:
    """What the CLI and its child processes discover: everything, or with ``PJRT_PLUGINS_AUTOLOAD=0`` only environment-named libraries."""
    return discover_plugins(installed=autoload_enabled())


def _discover(installed: bool) -> list[PluginRecord]:
    candidates = _environment_candidates()
    merged: dict[str, list[JaxPackage]] = {}
    if installed:
        plugin_eps, override_eps, jax_eps = _entry_points(PLUGINS_GROUP, OVERRIDES_GROUP, _jax_plugins.JAX_GROUP)
        _read_site_overrides(override_eps)
        backends = _entry_point_candidates(plugin_eps)
        jax_candidates, merged = _jax_candidates(jax_eps, backends)
        candidates += backends + jax_candidates
    candidates = [c for c in candidates if c.key not in _seen]
    _seen.update(c.key for c in candidates)

    by_name: dict[str, list[_Candidate]] = {}
    for candidate in candidates:
        by_name.setdefault(candidate.name, []).append(candidate)

    preferences = _preferences()
    path_order = _SysPathOrder()
    registered = []
    for name, offers in by_name.items():
        ranked = _rank(offers, preferences.get(name), path_order) if len(offers) > 1 else offers
        winner, losers = ranked[0], ranked[1:]
        existing = _registry._records.get(name)
        if existing is not None:  # registered earlier (register_plugin or a previous discovery)
            existing.shadowed.extend(_shadow_record(c) for c in ranked)
            warnings.warn(
                f"pjrt_plugins: plugin name {name!r} is already registered from {existing.provider}; "
                f"ignoring {', '.join(c.label() for c in ranked)}",
                PluginWarning,
                stacklevel=3,
            )
            continue
        if losers:
            _warn_shadowed(winner, losers, preferences.get(name))
        record = _record_for(winner)
        record.shadowed.extend(_shadow_record(c) for c in losers)
        _registry._add_record(record)
        registered.append(record)
    _merge_jax_origins(merged)
    _registry._add_framework_aliases()
    return registered


def _merge_jax_origins(merged: dict[str, list[JaxPackage]]) -> None:
    """Name a backend's JAX package as its second origin, and the package's JAX-derived name as an alias."""
    for backend, packages in merged.items():
        record = _registry._records.get(backend)
        if record is None:
            continue
        for package in packages:
            distribution = distribution_name(package.dist)  # no version: reading it would parse METADATA at import
            origin = f"JAX plugin package {distribution or package.module} ({package.origin})"
            if origin not in record.also:
                record.also.append(origin)
            try:
                _registry._add_alias(canonical_name(_jax_plugins.plugin_name(package.module)), backend, origin)
            except ValueError:
                continue
