"""Which files of ``plugins/stub_neuron`` make the plugin template (one list, read by new-plugin and the build).

Plain constants, no imports: the core's build loads this file by path.
"""

#: The template's source directory, relative to the repository root.
TEMPLATE_SOURCE = "plugins/stub_neuron"
#: Where built wheels of pjrt-plugins carry a copy, relative to this package.
PACKAGED_TEMPLATE = "_template"
#: Glob patterns, relative to the template directory. Build outputs never match them.
TEMPLATE_FILES = (
    "pyproject.toml",
    "setup.py",
    "MANIFEST.in",
    "README.md",
    "csrc/*.c",
    "csrc/*.h",
    "pjrt_plugin_stub_neuron/*.py",
    "pjrt_plugin_stub_neuron/py.typed",
)
#: Files whose presence identifies a template directory.
TEMPLATE_MARKERS = ("pyproject.toml", "pjrt_plugin_stub_neuron/_plugin.py")
