"""Every conformance check, in the order they run: importing this module declares them all.

The check modules register themselves with :func:`._framework.check` at import, each after
the modules whose checks it requires. They import the runtime, so the harness imports this
catalog only when it plans or runs checks, never at ``import pjrt_plugins.conform``.
"""

from __future__ import annotations

from . import _checks_python  # noqa: F401, I001 - the order of these imports is the order of the checks
from . import _checks_capi  # noqa: F401
from . import _checks_buffers  # noqa: F401
from . import _checks_programs  # noqa: F401
from . import _checks_frameworks  # noqa: F401
from ._framework import Check, registered_checks


def all_checks() -> list[Check]:
    """Every check, in the order they run."""
    return registered_checks()
