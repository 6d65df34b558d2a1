"""Settings from the environment: the one way the core and the backends read a variable.

A variable the user set but that cannot be read is a
:class:`~pjrt_plugins.PluginConfigurationError` naming it, never a silent default. Pure
Python below every layer: the runtime reads its own switches with :func:`parse_bool`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

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
#: How a boolean setting may be written, for messages.
BOOLEAN_WORDS = "1/0, true/false, yes/no, on/off"


def parse_bool(text: str) -> bool:
    """``text`` (stripped) as a boolean in any case: 1/0, true/false, yes/no, on/off; else ``ValueError``."""
    lowered = text.strip().lower()
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
    return env_value(name, parse_bool, default=default, expected=f"a boolean ({BOOLEAN_WORDS})")
