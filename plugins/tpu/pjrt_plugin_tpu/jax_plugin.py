"""JAX's entry point (group ``jax_plugins``) that prepares libtpu's environment; it registers nothing.

JAX has its own TPU support and loads libtpu whenever it is installed, as it is with this
backend. On a host without TPU chips that attempt fails quietly, but libtpu first prints
placeholder errors about worker host names and host bounds (it has no metadata to read).
:func:`initialize` gives it the one-host topology the backend's own preflight gives it, on such
hosts only. Importing this module imports neither jax nor libtpu.
"""

from __future__ import annotations

import os

from ._host import count_tpu_chips
from ._plugin import default_topology_environment


def initialize() -> None:
    """Called by JAX before it creates its clients: off TPU hosts, a topology libtpu accepts silently."""
    if count_tpu_chips() == 0:
        os.environ.update(default_topology_environment())
