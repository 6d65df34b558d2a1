"""The core's answer to every hook, registered below each backend (``trylast``).

A backend overrides only what differs from these. Nothing here may open a
library or import torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ._marker import hookimpl
from ._timeouts import DEFAULT_INITIALIZE_TIMEOUT_S
from .errors import PluginConfigurationError

T = TypeVar("T")
D = TypeVar("D")


def env_value(name: str, parse: Callable[[str], T], *, default: D, expected: str) -> T | D:
    """The environment variable ``name`` parsed by ``parse``, else ``default`` (unset or blank).

    The one way a backend reads a setting: ``parse`` gets the stripped text and raises
    ``ValueError`` for a value it refuses; that becomes
    :class:`~pjrt_plugins.PluginConfigurationError` (a ``ValueError``) naming the variable,
    ``environment variable NAME='text' must be EXPECTED``. The core's availability check
    and default selection report that error instead of quietly choosing another plugin.
    Public as ``pjrt_plugins.env_value``, e.g.
    ``env_value("ACME_TIMEOUT", positive_float, default=30.0, expected="a positive number")``.
    """
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return parse(raw.strip())
    except ValueError:
        raise PluginConfigurationError(f"environment variable {name}={raw!r} must be {expected}") from None


def env_int(*names: str, default: int, minimum: int | None = None) -> int:
    """The first of ``names`` set in the environment, as an int (at least ``minimum``), else ``default``.

    An empty or blank value counts as unset; a value that is not an integer, or is below
    ``minimum``, raises :class:`~pjrt_plugins.PluginConfigurationError` naming the variable
    (see :func:`env_value`), e.g. ``env_int("LOCAL_RANK", default=0, minimum=0)``.
    Public as ``pjrt_plugins.env_int`` for backends reading their own variables.
    """

    def parse(text: str) -> int:
        value = int(text)
        if minimum is not None and value < minimum:
            raise ValueError(text)
        return value

    expected = "an integer" if minimum is None else f"an integer >= {minimum}"
    for name in names:
        raw = os.environ.get(name)
        if raw is not None and raw.strip() != "":
            return env_value(name, parse, default=default, expected=expected)
    return default


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(text)


def env_bool(name: str, default: bool | None = None) -> bool | None:
    """A boolean environment variable (1/0, true/false, yes/no, on/off, any case), else ``default``.

    Anything else raises :class:`~pjrt_plugins.PluginConfigurationError` naming the variable
    (see :func:`env_value`): a switch the user set but we cannot read is never taken as off.
    Public as ``pjrt_plugins.env_bool``.
    """
    return env_value(name, _parse_bool, default=default, expected="a boolean (1/0, true/false, yes/no, on/off)")


class CoreDefaults:
    """Defaults shared by every backend (PyTorch/XLA's conventions)."""

    @hookimpl(trylast=True)
    def pjrt_library_path(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_library_missing_hint(self) -> None:
        return None  # DevicePlugin names the plugin's distribution instead

    @hookimpl(trylast=True)
    def pjrt_client_option_schema(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_client_create_options(self) -> dict[str, Any]:
        return {}

    @hookimpl(trylast=True)
    def pjrt_client_create_environment(self, options: dict[str, Any]) -> dict[str, str]:
        return {}

    @hookimpl(trylast=True)
    def pjrt_stall_timeout(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_local_process_rank(self) -> int:
        return env_int("PJRT_LOCAL_PROCESS_RANK", "LOCAL_RANK", default=0)

    @hookimpl(trylast=True)
    def pjrt_local_world_size(self) -> int:
        return env_int("PJRT_LOCAL_PROCESS_COUNT", "LOCAL_WORLD_SIZE", default=1)

    @hookimpl(trylast=True)
    def pjrt_host_index(self) -> int:
        # torchrun's node rank: without it every host of a multi-host job would claim index 0.
        return env_int("GROUP_RANK", default=0)

    @hookimpl(trylast=True)
    def pjrt_dense_gather_factor(self) -> int:
        return 0

    @hookimpl(trylast=True)
    def pjrt_rng_default(self) -> str:
        return "default"

    @hookimpl(trylast=True)
    def pjrt_physical_chip_count(self) -> int:
        return 1

    @hookimpl(trylast=True)
    def pjrt_configure_single_process(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_requires_coordinator(self) -> bool:
        return False

    @hookimpl(trylast=True)
    def pjrt_priority(self) -> int:
        return 0

    @hookimpl(trylast=True)
    def pjrt_unavailable_reason(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_preflight(self) -> None:
        return None

    @hookimpl(trylast=True)
    def pjrt_initialize_timeout(self) -> float:
        return DEFAULT_INITIALIZE_TIMEOUT_S


def library_path_problem(path: str | os.PathLike[str] | None) -> str | None:
    """Why ``path`` cannot be a plugin library (cheap checks only), or ``None``."""
    if path is None:
        return "its PJRT library could not be found"
    p = Path(path)
    if not p.is_absolute():
        return f"its library path {str(p)!r} is not absolute"
    if not p.exists():
        return f"its library {str(p)!r} does not exist"
    if not p.is_file():
        return f"its library path {str(p)!r} is not a regular file"
    return None
