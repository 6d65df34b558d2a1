"""DevicePlugin: one backend, its own pluggy manager, and PyTorch/XLA's method contract.

A backend subclasses :class:`DevicePlugin` and marks the hooks it overrides with
``@hookimpl``. The public methods (``library_path()``, ``host_index()``, ...)
answer through the backend's own hook manager, so site overrides layered with
:meth:`DevicePlugin.add_override` are seen by every caller, PyTorch/XLA included.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._defaults import CoreDefaults, library_path_problem
from ._env import env_int
from ._timeouts import checked_timeout
from ._marker import HOOK_NAMES, IMPL_ATTRIBUTE, PROJECT_NAME
from .errors import PluginConfigurationError, PluginUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    import pluggy

    from .runtime import Client

# pluggy (and with it inspect) is imported when the first hook manager is built, not by
# `import pjrt_plugins`: constructing a backend at discovery must stay cheap.

_TORCH_XLA_PLUGINS = "torch_xla.experimental.plugins"
_torch_xla_variants: dict[type, type] = {}
_variants_lock = threading.Lock()
#: The RNG algorithms :meth:`DevicePlugin.rng_default` may answer.
RNG_ALGORITHMS = ("default", "three_fry", "philox")


def _torch_xla_variant(cls: type, base: type) -> type:
    """``cls`` mixed with torch_xla's DevicePlugin, so torch_xla accepts its instances."""
    with _variants_lock:
        variant = _torch_xla_variants.get(cls)
        if variant is None:
            variant = type(cls.__name__, (cls, base), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
            _torch_xla_variants[cls] = variant
        return variant


_manager_lock = threading.RLock()


def _new_plugin_manager() -> pluggy.PluginManager:
    """A pluggy manager that never runs a plugin's properties while looking for its hooks.

    pluggy before 1.7 reads every attribute with ``getattr`` when it registers a plugin;
    on a DevicePlugin that ran the ``hook`` property, which builds the manager being
    registered, and recursed until RecursionError. pluggy 1.7 looks statically, as here.
    """
    import inspect

    import pluggy

    class StaticPluginManager(pluggy.PluginManager):
        def parse_hookimpl_opts(self, plugin: object, name: str) -> Any:
            found = inspect.getattr_static(plugin, name, None)
            if not (inspect.isroutine(found) or isinstance(found, (staticmethod, classmethod))):
                return None
            return super().parse_hookimpl_opts(plugin, name)

    return StaticPluginManager(PROJECT_NAME)


_checked_classes: set[type] = set()


def _check_hook_names(cls: type) -> None:
    """Refuse a hookimpl whose hook does not exist (cheap: class attributes only, once per class)."""
    if cls in _checked_classes:
        return
    for attribute in dir(cls):
        options = getattr(getattr(cls, attribute, None), IMPL_ATTRIBUTE, None)
        if not isinstance(options, dict):
            continue
        hook = options.get("specname") or attribute
        if hook not in HOOK_NAMES and not _is_hookspec(hook):
            import pluggy

            raise pluggy.PluginValidationError(
                cls, f"unknown hook {hook!r} in plugin {cls.__qualname__}; the hooks are in pjrt_plugins.hookspecs"
            )
    _checked_classes.add(cls)


def _is_hookspec(name: str) -> bool:
    from . import hookspecs

    return hasattr(getattr(hookspecs, name, None), PROJECT_NAME + "_spec")


class DevicePlugin:
    """Base class of every backend.

    Subclass it, implement the hooks that differ from the core defaults with
    ``@pjrt_plugins.hookimpl`` on methods named after :mod:`pjrt_plugins.hookspecs`
    (``pjrt_library_path``, ...), and register the class as an entry point in the
    group ``torch_xla.plugins``. Do not override the public methods below.

    When PyTorch/XLA has been imported, constructing a DevicePlugin returns an
    instance that also subclasses ``torch_xla.experimental.plugins.DevicePlugin``,
    so PyTorch/XLA's own loader accepts our entry points; pjrt_plugins never
    imports torch_xla itself.
    """

    #: Set by the registry: the canonical (lower-case) plugin name.
    name: str | None = None
    #: Set by discovery: the (normalized) name of the distribution that provided the plugin.
    distribution: str | None = None
    # Set by discovery: reads the distribution's version on first use (METADATA is not read at import).
    _version_lookup: Any = None

    @property
    def distribution_version(self) -> str | None:
        """Version of :attr:`distribution`, or ``None``."""
        if "_distribution_version" not in self.__dict__ and self._version_lookup is not None:
            self.__dict__["_distribution_version"] = self._version_lookup()
        return self.__dict__.get("_distribution_version")

    @distribution_version.setter
    def distribution_version(self, value: str | None) -> None:
        self.__dict__["_distribution_version"] = value

    def __new__(cls, *args: Any, **kwargs: Any) -> DevicePlugin:
        txla = sys.modules.get(_TORCH_XLA_PLUGINS)
        base = getattr(txla, "DevicePlugin", None)
        if isinstance(base, type) and not issubclass(cls, base):
            cls = _torch_xla_variant(cls, base)
        return super().__new__(cls)

    def __init__(self) -> None:
        super().__init__()
        _check_hook_names(type(self))  # a misspelt pjrt_* hook fails here, not silently later
        # The pluggy manager is built on first use: registering scans every attribute, which
        # would make `import pjrt_plugins` pay for each installed backend.
        self._overrides: list[object] = []

    # -- layering ---------------------------------------------------------------

    @property
    def hook(self) -> Any:
        """The pluggy hook relay of this plugin's own manager."""
        return self.plugin_manager.hook

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """This backend's own manager: core defaults, then the backend, then overrides."""
        pm: pluggy.PluginManager | None = self.__dict__.get("_pm")
        if pm is not None:
            return pm
        self._require_initialized()
        from . import hookspecs

        with _manager_lock:
            pm = self.__dict__.get("_pm")
            if pm is None:
                pm = _new_plugin_manager()
                pm.add_hookspecs(hookspecs)
                pm.register(CoreDefaults(), name="core-defaults")
                pm.register(self, name="backend")
                pm.check_pending()
                self.__dict__["_pm"] = pm
        return pm

    def _require_initialized(self) -> None:
        """Raise TypeError if a subclass's ``__init__`` skipped ``super().__init__()`` (cheap)."""
        if "_overrides" not in self.__dict__:
            raise TypeError(f"{type(self).__qualname__}.__init__ must call super().__init__()")

    def add_override(self, override: object, name: str | None = None) -> object:
        """Layer a pluggy plugin over this backend; its hooks answer first.

        ``override`` is any object with ``@hookimpl`` methods, for example one
        that only implements ``pjrt_dense_gather_factor``. Returns it, so it can
        be passed to :meth:`remove_override`.
        """
        import pluggy

        pm = self.plugin_manager
        pm.register(override, name=name)
        try:
            pm.check_pending()  # an override of a hook that does not exist is a typo
            if not pm.get_hookcallers(override):
                raise TypeError(f"{override!r} has no @pjrt_plugins.hookimpl methods to layer over {self._label}")
        except (pluggy.PluginValidationError, TypeError):
            pm.unregister(override)
            raise
        self._overrides.append(override)
        return override

    def remove_override(self, override: object) -> None:
        self.plugin_manager.unregister(override)
        self._overrides.remove(override)

    # -- PyTorch/XLA's DevicePlugin contract --------------------------------------

    def library_path(self) -> str:
        """Absolute path of the PJRT library; raises PluginUnavailableError if there is none."""
        path = self.hook.pjrt_library_path()
        problem = self._library_problem(path)
        if problem is not None:
            raise PluginUnavailableError(f"plugin {self._label}: {problem}")
        fspath: str = os.fspath(path)
        return fspath

    def client_create_options(self) -> dict[str, Any]:
        return dict(self.hook.pjrt_client_create_options() or {})

    def requires_xla_coordinator(self) -> bool:
        return bool(self.hook.pjrt_requires_coordinator())

    def configure_single_process(self) -> None:
        self.hook.pjrt_configure_single_process()

    def configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        self.hook.pjrt_configure_multiprocess(local_rank=int(local_rank), local_world_size=int(local_world_size))

    def physical_chip_count(self) -> int:
        return int(self.hook.pjrt_physical_chip_count())

    def host_index(self) -> int:
        return int(self.hook.pjrt_host_index())

    # -- the rest of the hooks ---------------------------------------------------

    def option_schema(self) -> dict[str, Any] | None:
        """The create-option schema as ``{name: OptionType}``, or ``None``."""
        from .options import normalize_schema  # lazy: `import pjrt_plugins` stays cheap

        return normalize_schema(self.hook.pjrt_client_option_schema())

    def local_process_rank(self) -> int:
        return int(self.hook.pjrt_local_process_rank())

    def local_world_size(self) -> int:
        return int(self.hook.pjrt_local_world_size())

    def requires_coordinator(self) -> bool:
        return self.requires_xla_coordinator()

    def dense_gather_factor(self) -> int:
        """0 means sparse gathers always; else dense unless the dimension exceeds factor*10."""
        factor = int(self.hook.pjrt_dense_gather_factor() or 0)
        if factor > 0:  # the variable tunes dense gathers; it never turns them on
            factor = env_int("XLA_DENSE_GATHER_FACTOR", default=factor)
        return factor

    def rng_default(self) -> str:
        """The RNG algorithm; ``XLA_RNG_BIT_GENERATOR`` overrides the backend."""
        value = os.environ.get("XLA_RNG_BIT_GENERATOR") or self.hook.pjrt_rng_default() or "default"
        value = value.strip().lower()
        if value not in RNG_ALGORITHMS:
            raise ValueError(f"unknown RNG algorithm {value!r} for plugin {self._label}; use one of {RNG_ALGORITHMS}")
        return value

    def priority(self) -> int:
        return int(self.hook.pjrt_priority() or 0)

    def initialize_timeout(self) -> float:
        """Seconds opening the library, initializing it and creating a client may take (the hook's answer, checked)."""
        seconds = checked_timeout(self.hook.pjrt_initialize_timeout(), f"{self._label}'s pjrt_initialize_timeout", allow_none=False)
        assert seconds is not None
        return seconds

    def unavailable_reason(self) -> str | None:
        """Why this plugin cannot run here (cheap: no library is opened), or ``None``; never raises."""
        return self._availability()[0]

    def configuration_error(self) -> PluginConfigurationError | None:
        """The malformed setting (e.g. ``CPU_NUM_DEVICES=abc``) that keeps this plugin from running, or ``None``.

        A hook that raises :class:`~pjrt_plugins.PluginConfigurationError` says the user
        meant this plugin and got a setting wrong; default selection raises it rather
        than quietly moving on to another plugin.
        """
        return self._availability()[1]

    def _availability(self) -> tuple[str | None, PluginConfigurationError | None]:
        try:
            problem = self._library_problem(self.hook.pjrt_library_path())  # first: nothing runs without it
            if problem is not None:
                return problem, None
            reason = self.hook.pjrt_unavailable_reason()
            if reason:
                return str(reason), None
            if self.physical_chip_count() <= 0:
                return "no devices of this kind were found on this host", None
        except PluginConfigurationError as exc:
            return f"misconfigured: {exc}", exc
        except Exception as exc:  # a hook that raises makes the plugin unavailable, not the caller crash
            return f"{type(exc).__name__}: {exc}", None
        return None, None

    def is_available(self) -> bool:
        return self.unavailable_reason() is None

    def preflight(self) -> None:
        """Check that the library is there, then run the backend's pre-initialization checks.

        Raises :class:`PluginUnavailableError` (a missing library, with the backend's
        :func:`~pjrt_plugins.hookspecs.pjrt_library_missing_hint`, or the backend's own reason).
        """
        problem = self._library_problem(self.hook.pjrt_library_path())
        if problem is not None:
            raise PluginUnavailableError(f"plugin {self._label}: {problem}")
        self.hook.pjrt_preflight()

    def _library_problem(self, path: str | os.PathLike[str] | None) -> str | None:
        """Why ``path`` (the library hook's answer) is no library, with what to do about it, or ``None``."""
        problem = library_path_problem(path)
        if problem is None:
            return None
        hint = self.hook.pjrt_library_missing_hint() or self._fix_hint()
        return f"{problem}; {hint}"

    def create_client(
        self,
        options: Mapping[str, Any] | None = None,
        *,
        configure: bool = True,
        kv_store: Any = None,
    ) -> Client:
        """Configure the process, open the library and create a PJRT client.

        ``options`` are laid over :meth:`client_create_options` and checked
        against :meth:`option_schema` before the C call.
        """
        # The lazy seam to the runtime: `import pjrt_plugins` must not load cffi and numpy.
        from ._plugin_client import create_client_for_plugin

        return create_client_for_plugin(self, options, configure=configure, kv_store=kv_store)

    @property
    def _label(self) -> str:
        """For messages: the registered name, or the class when PyTorch/XLA built this instance itself."""
        return repr(self.name) if self.name else type(self).__qualname__

    def _fix_hint(self) -> str:
        dist = f" ({self.distribution})" if self.distribution else ""
        return f"reinstall the plugin package{dist} or set the library path its documentation names"

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} distribution={self.distribution!r}>"
