"""Library-only plugins: a bare PJRT library named by an environment variable, with core defaults.

``PJRT_LIBRARY_PATH`` (PyTorch/XLA's generic device, name ``library``) and JAX's
``PJRT_NAMES_AND_LIBRARY_PATHS=name:path,...``. Only paths are checked here; the
library itself is never opened.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from ._defaults import library_path_problem
from ._marker import hookimpl
from ._plugin import DevicePlugin
from ._registry import registered_plugins

LIBRARY_PATH_VAR = "PJRT_LIBRARY_PATH"
NAMES_AND_PATHS_VAR = "PJRT_NAMES_AND_LIBRARY_PATHS"
#: The name PyTorch/XLA gives a plugin selected by ``PJRT_LIBRARY_PATH``.
LIBRARY_PLUGIN_NAME = "library"


class LibraryPlugin(DevicePlugin):
    """A PJRT library with no Python package: the core defaults plus its path (and options).

    When the file is the library of an installed backend (``PJRT_LIBRARY_PATH`` set to
    the CPU plugin's ``xla_cpu_pjrt.so``), that backend's option schema and option
    checks apply, so a mistyped option is refused in Python instead of aborting the
    process inside the library.
    """

    def __init__(self, path: str | os.PathLike[str], create_options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.path = os.fspath(path)
        self.create_options = dict(create_options or {})

    @hookimpl
    def pjrt_library_path(self) -> str:
        return self.path

    @hookimpl
    def pjrt_client_create_options(self) -> dict[str, Any]:
        return dict(self.create_options)

    @hookimpl
    def pjrt_client_option_schema(self) -> Mapping[str, Any] | None:
        backend = self.backend()
        return None if backend is None else backend.hook.pjrt_client_option_schema()

    @hookimpl
    def pjrt_check_client_options(self, options: Mapping[str, Any]) -> None:
        backend = self.backend()
        if backend is not None:
            backend.hook.pjrt_check_client_options(options=options)

    def backend(self) -> DevicePlugin | None:
        """The installed backend whose library is this same file, or ``None`` (imports the installed plugins)."""
        for plugin in registered_plugins().values():
            if plugin is self or isinstance(plugin, LibraryPlugin):
                continue
            try:
                path = plugin.hook.pjrt_library_path()
                if path is not None and os.path.samefile(path, self.path):
                    return plugin
            except Exception:  # noqa: BLE001 - a backend that cannot say is not this one
                continue
        return None

    def __repr__(self) -> str:
        return f"<LibraryPlugin name={self.name!r} path={self.path!r}>"


class LibrarySpec(NamedTuple):
    """One library named in the environment, before it becomes a plugin."""

    name: str
    path: str
    variable: str  # which environment variable named it, for messages


def library_specs_from_environment(environ: Mapping[str, str] | None = None) -> Iterator[LibrarySpec | str]:
    """Each library the environment names, or a message for each entry that cannot be parsed."""
    environ = os.environ if environ is None else environ
    single = environ.get(LIBRARY_PATH_VAR, "").strip()
    if single:
        yield LibrarySpec(LIBRARY_PLUGIN_NAME, single, LIBRARY_PATH_VAR)
    pairs = environ.get(NAMES_AND_PATHS_VAR, "").strip()
    for item in filter(None, (part.strip() for part in pairs.split(","))):
        name, sep, path = item.partition(os.pathsep)
        if not sep or not name.strip() or not path.strip():
            yield (
                f"{NAMES_AND_PATHS_VAR}: entry {item!r} is not NAME{os.pathsep}PATH; "
                f"write e.g. {NAMES_AND_PATHS_VAR}=mydev{os.pathsep}/opt/mydev/pjrt_plugin.so"
            )
            continue
        yield LibrarySpec(name.strip(), path.strip(), NAMES_AND_PATHS_VAR)


def make_library_plugin(spec: LibrarySpec) -> LibraryPlugin:
    """Build the plugin for ``spec``; raises ``ValueError`` saying what is wrong with the path.

    As in JAX, a path ending in ``.json`` is a config file with ``library_path``
    and optional ``create_options``.
    """
    path, options = spec.path, None
    if path.endswith(".json") and library_path_problem(path) is None:
        path, options = _read_json_config(path)
    problem = library_path_problem(path)
    if problem is not None:
        raise ValueError(
            f"{spec.variable} names {spec.name!r} but {problem.removeprefix('its ')}; "
            "give the absolute path of the plugin's shared library (a regular file)"
        )
    return LibraryPlugin(path, options)


def _read_json_config(path: str) -> tuple[str, dict[str, Any] | None]:
    import json  # only when a config file is named: keeps `import pjrt_plugins` cheap

    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        raise ValueError(f"cannot read PJRT plugin config {path!r}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(config, dict) or not isinstance(config.get("library_path"), str):
        raise ValueError(f"PJRT plugin config {path!r} must be a JSON object with a \"library_path\" string")
    options = config.get("create_options")
    if options is not None and not isinstance(options, dict):
        raise ValueError(f"PJRT plugin config {path!r}: \"create_options\" must be a JSON object")
    return config["library_path"], options
