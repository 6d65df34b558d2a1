"""JAX's entry point for this plugin (group ``jax_plugins`` in pyproject.toml).

JAX imports this module while it discovers plugins and calls :func:`initialize`;
then ``JAX_PLATFORMS=stub_neuron`` selects the plugin's devices. Importing it
imports neither jax nor the library.
"""

from __future__ import annotations

from pjrt_plugins.jax_plugin import register_with_jax


def initialize() -> None:
    """Register the plugin with JAX: library path and create options come from its hooks."""
    register_with_jax("stub_neuron")
