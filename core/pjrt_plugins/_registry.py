"""The plugin registry: one record per canonical name, lookup, and default selection.

Discovery fills it (``_discovery.py``); nothing here reads entry points, opens a
library or imports torch. Names are canonicalized once, by :func:`canonical_name`:
``stub_neuron``, ``STUB-NEURON`` and ``stub.neuron`` are one plugin, ``stub-neuron``.
"""

from __future__ import annotations

import os
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ._plugin import DevicePlugin
from ._torch_xla import TorchXlaStylePlugin, looks_like_torch_xla_plugin, normalize_distribution_name
from .errors import PluginConfigurationError, PluginLoadError, PluginNotFoundError, PluginUnavailableError, PluginWarning

if TYPE_CHECKING:  # pragma: no cover
    import logging
    from importlib.metadata import Distribution

    from .runtime import Client


def _logger() -> logging.Logger:
    import logging  # on the first log record: `import pjrt_plugins` does not pay for logging

    return logging.getLogger(__name__)


#: Environment variable naming the default plugin (as in PyTorch/XLA), any case.
PJRT_DEVICE_VAR = "PJRT_DEVICE"
_NAME = re.compile(r"[a-z0-9._-]+")


def canonical_name(name: str) -> str:
    """The one spelling of a plugin name used everywhere: NFKC-normalized, stripped, lower-case, ``-`` separated.

    NFKC folds look-alikes such as fullwidth ``ｃｐｕ`` into ``cpu``. What is left
    must be ASCII letters, digits, ``-``, ``_`` or ``.``; anything else (whitespace,
    ``, : = ; / \\``, which the environment-variable formats cannot carry, or an
    invisible character such as a zero-width space) raises ``ValueError`` naming it.
    Then, as PEP 503 does for distribution names, every run of ``-``, ``_`` and ``.``
    becomes one ``-``: ``stub_neuron`` and ``STUB-NEURON`` are both ``stub-neuron``.
    ``-`` is the spelling PyTorch/XLA can select (it cuts ``PJRT_DEVICE`` at the first
    ``_``), so it is the one ``list`` shows.
    """
    if not isinstance(name, str):
        raise TypeError(f"a plugin name must be a str, got {type(name).__name__}")
    canonical = name
    if not canonical.isascii():
        import unicodedata  # only for the rare non-ASCII name

        canonical = unicodedata.normalize("NFKC", canonical)
    canonical = canonical.strip().lower()
    if not _NAME.fullmatch(canonical):
        raise ValueError(f"invalid plugin name {name!r}{_odd_characters(canonical)}: use ASCII letters, digits, '-', '_' or '.'")
    return normalize_distribution_name(canonical)


def _odd_characters(text: str) -> str:
    odd = sorted({ch for ch in text if not _NAME.fullmatch(ch)})
    if not odd or all(ch.isascii() for ch in odd):
        return ""
    import unicodedata

    return " (it contains " + ", ".join(f"U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed character')}" for ch in odd) + ")"


class PluginRecord:
    """Everything known about one registered name; read-only for users.

    ``status`` is ``"loaded"`` (``plugin`` is set), ``"failed"`` (``error`` is the
    :class:`PluginLoadError` to raise, its ``__cause__`` the original error, which
    ``failure`` names) or ``"deferred"``: discovery reads metadata only, so an
    installed plugin's module is imported when the plugin is first asked for
    (:func:`get_plugin`, :func:`registered_plugins`, :func:`default_plugin`).
    ``deferred_reason`` is set for the records that load only when asked for by
    name (PyTorch/XLA's own, which import torch); ``ready()`` says whether a
    deferred record can load now (not while its module is mid-import).
    ``shadowed`` lists the records that offered the same name and lost; ``also``
    names further origins of this same plugin (the JAX plugin package whose
    library a backend wraps); ``aliases`` the other names that reach it.
    ``entry_name`` is the name as its ``torch_xla.plugins`` entry point spells it
    (what PyTorch/XLA registers, upper-cased, and what its ``PJRT_DEVICE`` must say),
    ``None`` for a plugin PyTorch/XLA never sees (``register_plugin()``, a library
    named in the environment, a JAX plugin package).
    ``version`` is read from the distribution's metadata only when first asked.
    """

    def __init__(
        self,
        name: str,
        origin: str,
        *,
        distribution: str | None = None,
        version: str | None = None,
        dist: Distribution | None = None,
        plugin: DevicePlugin | None = None,
        error: PluginLoadError | None = None,
        loader: Callable[[], DevicePlugin] | None = None,
        deferred_reason: str | None = None,
        ready: Callable[[], bool] | None = None,
        entry_name: str | None = None,
    ) -> None:
        self.name = name
        self.origin = origin  # e.g. "entry point torch_xla.plugins: cpu = pkg:Cls"
        self.entry_name = entry_name
        self.distribution = distribution
        self._version = version
        self._dist = dist
        self.plugin = plugin
        self.error = error
        self.loader = loader
        self.deferred_reason = deferred_reason
        self.ready = ready
        self.shadowed: list[PluginRecord] = []
        self.also: list[str] = []  # further origins of the same plugin (a JAX package wrapping the same library)

    @property
    def aliases(self) -> list[str]:
        """Other names that reach this plugin (``cuda`` for ``gpu``), sorted."""
        return sorted(alias for alias, (target, _) in _aliases.items() if target == self.name)

    @property
    def version(self) -> str | None:
        if self._version is None and self._dist is not None:
            try:
                self._version = self._dist.version
            except Exception:  # unreadable METADATA: show no version rather than fail
                self._version = None
            self._dist = None
        return self._version

    @property
    def on_request_only(self) -> bool:
        """Loaded only when asked for by name, never by :func:`registered_plugins` (see ``deferred_reason``)."""
        return self.deferred_reason is not None

    @property
    def status(self) -> str:
        if self.plugin is not None:
            return "loaded"
        if self.error is not None:
            return "failed"
        return "deferred"

    @property
    def failure(self) -> str | None:
        """What made a failed record fail, as ``"ImportError: ..."`` (the original error), else ``None``."""
        if self.error is None:
            return None
        cause = self.error.__cause__ if self.error.__cause__ is not None else self.error
        return f"{type(cause).__name__}: {cause}"

    @property
    def provider(self) -> str:
        """``"dist 1.2"``, or the origin when no distribution provided it."""
        if self.distribution:
            version = self.version
            return f"{self.distribution} {version}" if version else self.distribution
        return self.origin

    def __repr__(self) -> str:
        return f"<PluginRecord {self.name!r} {self.status} from {self.distribution or self.origin}>"


#: PyTorch/XLA's and JAX's names for our reference backends: alias -> plugin name.
FRAMEWORK_ALIASES = {"cuda": "gpu"}

_lock = threading.RLock()
_records: dict[str, PluginRecord] = {}
_aliases: dict[str, tuple[str, str]] = {}  # alias -> (plugin name, where the alias comes from)
_settling = False
# Called on every plugin object that enters the registry (discovery layers site overrides).
_attach_callbacks: list[Callable[[DevicePlugin, PluginRecord], None]] = []
#: Set by discovery: whether installed plugins were discovered in this process.
_state: dict[str, Any] = {"discovered": False}


def _bind(plugin: DevicePlugin, record: PluginRecord) -> None:
    plugin.name = record.name
    if record.distribution is not None:
        plugin.distribution = record.distribution
        plugin._version_lookup = lambda: record.version  # metadata is read only if asked
    for callback in _attach_callbacks:
        callback(plugin, record)


def _coerce(plugin: Any) -> DevicePlugin:
    if isinstance(plugin, type) and issubclass(plugin, DevicePlugin):
        plugin = plugin()
    if isinstance(plugin, DevicePlugin):
        plugin._require_initialized()
        return plugin
    if looks_like_torch_xla_plugin(plugin):
        return TorchXlaStylePlugin(plugin)
    raise TypeError(
        f"cannot register {plugin!r}: expected a pjrt_plugins.DevicePlugin (instance or subclass) "
        "or a PyTorch/XLA-style plugin object with a library_path() method"
    )


def register_plugin(name: str, plugin: Any, *, replace: bool = False) -> DevicePlugin:
    """Register ``plugin`` under ``name`` (any case; ``-``, ``_`` and ``.`` alike) and return it.

    ``plugin`` is a :class:`DevicePlugin` instance or subclass, or a
    PyTorch/XLA-style object (adapted to the hooks). Registering the same object
    twice is a no-op. Taking over a name that is already registered warns (a
    :class:`PluginWarning` naming both) unless ``replace=True``.
    """
    canonical = canonical_name(name)
    device_plugin = _coerce(plugin)
    with _lock:
        previous = _records.get(canonical)
        if previous is not None and previous.plugin is device_plugin:
            return device_plugin
        record = PluginRecord(canonical, origin="register_plugin()", plugin=device_plugin)
        if previous is not None:
            record.shadowed.append(previous)
            if not replace:
                warnings.warn(
                    f"pjrt_plugins: register_plugin({name!r}) replaces the plugin from {previous.provider}; "
                    "pass replace=True to do this without a warning",
                    PluginWarning,
                    stacklevel=2,
                )
        _bind(device_plugin, record)
        _records[canonical] = record
    return device_plugin


def _add_record(record: PluginRecord) -> None:
    """Discovery's entry: the record must already have won its name (see _discovery)."""
    with _lock:
        if record.plugin is not None:
            _bind(record.plugin, record)
        _records[record.name] = record


def _add_alias(alias: str, target: str, origin: str) -> None:
    """Let ``alias`` reach ``target``; a registered name always wins over an alias, and the first alias stays."""
    with _lock:
        if alias != target and alias not in _records:
            _aliases.setdefault(alias, (target, origin))


def _add_framework_aliases() -> None:
    for alias, target in FRAMEWORK_ALIASES.items():
        if target in _records:
            _add_alias(alias, target, "PyTorch/XLA's and JAX's name for it")


def resolve_name(name: str) -> str:
    """The registered name ``name`` (any case, or an alias such as ``CUDA``) stands for; unknown names come back canonical."""
    canonical = canonical_name(name)
    with _lock:
        if canonical not in _records and canonical in _aliases:
            return _aliases[canonical][0]
    return canonical


def warn_load_failure(record: PluginRecord, stacklevel: int = 3) -> None:
    """The one warning for a plugin that failed to load: names distribution, version and error."""
    warnings.warn(
        f"pjrt_plugins: skipping plugin {record.name!r} from {record.provider}: "
        f"{record.failure}. The other plugins are unaffected; "
        f"pjrt_plugins.get_plugin({record.name!r}) raises the full error.",
        PluginWarning,
        stacklevel=stacklevel,
    )


def _load_pending() -> None:
    """Import every installed plugin not loaded yet (not the on-request-only ones); failures are warned about."""
    for record in list(_records.values()):
        if record.loader is None or record.on_request_only or (record.ready is not None and not record.ready()):
            continue
        try:
            _load_deferred(record)
        except PluginLoadError:
            warn_load_failure(record, stacklevel=4)


def plugin_records() -> list[PluginRecord]:
    """Every registered name, loaded, failed or deferred, sorted by name; nothing is imported (for tools like the CLI)."""
    with _lock:
        return [_records[name] for name in sorted(_records)]


def registered_plugins() -> dict[str, DevicePlugin]:
    """Every installed plugin, imported now if it was not yet, by canonical name, sorted.

    Plugins that fail to load are left out with a :class:`PluginWarning`
    (``get_plugin`` raises their error), and so are the ones that load only when
    asked for by name (PyTorch/XLA's own entries, which would import torch).
    """
    with _lock:
        _load_pending()
        return {name: plugin for name in sorted(_records) if (plugin := _records[name].plugin) is not None}


def _installed_listing() -> str:
    with _lock:
        names = [f"{r.name} ({r.status})" if r.status == "failed" or r.on_request_only else r.name for r in plugin_records()]
    if names:
        return ", ".join(names)
    hint = "none"
    if not _state["discovered"]:
        hint += " (discovery has not run: PJRT_PLUGINS_AUTOLOAD is off; call pjrt_plugins.discover_plugins())"
    return hint


def mark_failed(name: str, error: PluginLoadError) -> None:
    """Make a not-yet-loaded plugin fail with ``error`` without running its code (a tool found it kills or hangs a process)."""
    with _lock:
        record = _records.get(canonical_name(name))
        if record is not None and record.plugin is None:
            record.error, record.loader, record.ready = error, None, None


def _load_deferred(record: PluginRecord) -> DevicePlugin:
    assert record.loader is not None
    try:
        plugin = record.loader()
    except PluginLoadError as exc:
        record.error = exc
        record.loader = record.ready = None
        raise
    record.plugin, record.loader, record.ready = plugin, None, None
    _bind(plugin, record)
    _logger().debug("loaded deferred plugin %r from %s", record.name, record.provider)
    return plugin


def _not_found(name: str) -> PluginNotFoundError:
    """The error for ``name`` as the caller spelt it (stripped), listing what is installed."""
    return PluginNotFoundError(
        f"no PJRT plugin named {name.strip()!r}. Installed plugins: {_installed_listing()}. "
        "Install the backend's package, or check the spelling."
    )


def plugin_record(name: str) -> PluginRecord:
    """The record of ``name`` (any case), as :func:`plugin_records` lists it; nothing is loaded.

    Raises :class:`PluginNotFoundError` listing the installed plugins (for tools
    that report on a plugin without loading it, like ``doctor`` and ``conform``).
    """
    canonical = resolve_name(name)
    with _lock:
        record = _records.get(canonical)
        if record is None:
            raise _not_found(name)
        return record


def get_plugin(name: str) -> DevicePlugin:
    """The plugin registered as ``name`` (any case; ``-``, ``_`` and ``.`` alike: ``STUB_NEURON`` is ``stub-neuron``).

    Raises :class:`PluginNotFoundError` listing the installed plugins, or
    :class:`PluginLoadError` (the original error as ``__cause__``) for a plugin
    that is installed but failed to load. A deferred plugin is loaded now. An
    alias (``CUDA`` for ``gpu``, see :attr:`PluginRecord.aliases`) reaches the
    plugin it names.
    """
    canonical = resolve_name(name)
    with _lock:
        record = _records.get(canonical)
        if record is None:
            raise _not_found(name)
        if record.plugin is not None:
            return record.plugin
        if record.error is not None:
            raise record.error
        if record.ready is not None and not record.ready():
            raise PluginLoadError(
                f"plugin {canonical!r} ({record.origin}) is still being imported; "
                "ask for it once its module has finished importing (this is a circular import)"
            )
        return _load_deferred(record)


def _selection_candidates() -> list[tuple[int, str, DevicePlugin]]:
    ranked = []
    for name, plugin in registered_plugins().items():
        try:
            priority = plugin.priority()
        except Exception as exc:  # a broken hook makes that plugin lose, not the selection fail
            _logger().warning("plugin %r: priority() raised %s: %s", name, type(exc).__name__, exc)
            continue
        ranked.append((priority, name, plugin))
    ranked.sort(key=lambda item: (-item[0], item[1]))
    return ranked


def default_plugin() -> DevicePlugin:
    """The plugin to use when none is named.

    ``PJRT_DEVICE`` (any spelling :func:`get_plugin` takes) names it, as in PyTorch/XLA; it is returned even
    if it reports itself unavailable, since it was asked for. Otherwise the
    loaded plugin with the highest :meth:`~DevicePlugin.priority` whose
    :meth:`~DevicePlugin.unavailable_reason` is ``None`` wins; equal priorities
    go to the alphabetically first name. A plugin met on the way whose setting is
    malformed (:meth:`~DevicePlugin.configuration_error`) stops the selection with
    :class:`PluginConfigurationError` naming it. Deferred plugins are not candidates
    (checking them would import torch_xla); name them with ``PJRT_DEVICE``.
    """
    requested = os.environ.get(PJRT_DEVICE_VAR, "").strip()
    if requested:
        try:
            return get_plugin(requested)
        except PluginNotFoundError as exc:
            raise PluginNotFoundError(f"{PJRT_DEVICE_VAR}={requested!r}: {exc}") from None
    reasons = []
    for _priority, name, plugin in _selection_candidates():
        reason, misconfigured = plugin._availability()
        if misconfigured is not None:  # the user meant this plugin: say so rather than pick another
            raise PluginConfigurationError(
                f"plugin {name!r} would be the default but is misconfigured: {misconfigured}. "
                f"Fix or unset that setting, or set {PJRT_DEVICE_VAR} to choose another plugin."
            ) from misconfigured
        if reason is None:
            return plugin
        reasons.append(f"{name}: {reason}")
    with _lock:
        for record in plugin_records():
            if record.status == "failed":
                reasons.append(f"{record.name}: failed to load ({record.error})")
            elif record.status == "deferred" and record.on_request_only:
                reasons.append(f"{record.name}: not considered ({record.deferred_reason}); select it with PJRT_DEVICE")
    if not reasons:
        raise PluginNotFoundError(
            f"no PJRT plugins are installed. Installed plugins: {_installed_listing()}. "
            "Install a backend package (for example pjrt-plugin-cpu) or set PJRT_LIBRARY_PATH."
        )
    listing = "\n  ".join(reasons)
    raise PluginUnavailableError(
        f"no installed PJRT plugin can run here:\n  {listing}\n"
        f"Fix one of the reasons above, or set {PJRT_DEVICE_VAR} to pick a plugin explicitly."
    )


def create_client(name: str | None = None, options: Mapping[str, Any] | None = None, **kwargs: Any) -> Client:
    """Create a PJRT client on plugin ``name`` (default: :func:`default_plugin`).

    ``options`` and ``kwargs`` go to :meth:`DevicePlugin.create_client`.
    """
    plugin = get_plugin(name) if name is not None else default_plugin()
    return plugin.create_client(options, **kwargs)
