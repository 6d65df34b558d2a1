"""Time limits: the core's default, and the check every limit a user gives passes.

Pure Python, below everything that waits: the runtime, the hook defaults and the command
line use the same rules, so a limit that cannot be kept (``nan``, ``1e300``, ``"10"``)
is refused with one message wherever it is given, never deep inside a wait.
"""

from __future__ import annotations

import math
import numbers
import threading

#: How long opening a plugin, ``PJRT_Plugin_Initialize`` and client creation may take by default.
DEFAULT_INITIALIZE_TIMEOUT_S = 60.0
#: The longest limit the platform's waits can keep (``threading.TIMEOUT_MAX``, about 292 years on Linux).
MAX_TIMEOUT_S = float(threading.TIMEOUT_MAX)


def seconds_problem(seconds: float) -> str | None:
    """Why ``seconds`` cannot be a time limit (not finite, not above 0, longer than the
    platform can wait), as "must be ...", or ``None``."""
    if not math.isfinite(seconds) or seconds <= 0:
        return "must be a finite number of seconds above 0"
    if seconds > MAX_TIMEOUT_S:
        return f"must be at most {MAX_TIMEOUT_S:.0f} seconds (about 292 years)"
    return None


def checked_timeout(value: object, name: str, *, allow_none: bool = True) -> float | None:
    """``value`` as float seconds; ``None`` stays ``None`` (no limit) when ``allow_none``.

    Raises ``TypeError`` for a value that is not a real number (a string, a bool) and
    ``ValueError`` for one :func:`seconds_problem` refuses, naming ``name``.
    """
    hint = "; use None for no limit" if allow_none else ""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r}{hint}")
    seconds = float(value)
    problem = seconds_problem(seconds)
    if problem is not None:
        raise ValueError(f"{name} {problem}, got {value!r}{hint}")
    return seconds
