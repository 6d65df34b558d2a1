"""pjrt-plugin-stub-neuron: a stub Neuron PJRT plugin, and the template a vendor copies.

Importing this package opens no library. The entry point ``stub-neuron`` in the
group ``torch_xla.plugins`` names :class:`StubNeuronPlugin` (``PJRT_DEVICE=STUB-NEURON``),
and ``stub_neuron`` in the group ``jax_plugins`` its JAX module (``JAX_PLATFORMS=stub_neuron``).
"""

from __future__ import annotations

from ._library import LIBRARY_PATH_ENV, STUB_LIBRARY_NAME, library_path, stub_library_path
from ._plugin import DENSE_GATHER_FACTOR, KV_KEY_PREFIX, OPTION_SCHEMA, PRIORITY, StubNeuronPlugin

__version__ = "0.1.0"

__all__ = [
    "DENSE_GATHER_FACTOR",
    "KV_KEY_PREFIX",
    "LIBRARY_PATH_ENV",
    "OPTION_SCHEMA",
    "PRIORITY",
    "STUB_LIBRARY_NAME",
    "StubNeuronPlugin",
    "library_path",
    "stub_library_path",
]
