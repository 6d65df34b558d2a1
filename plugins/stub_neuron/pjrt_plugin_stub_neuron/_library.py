"""Where the PJRT library is: the stub built into this package, or NEURON_LIBRARY_PATH.

Only paths are computed here; nothing may open the library.
"""

from __future__ import annotations

from pathlib import Path

from pjrt_plugins import find_library

#: Environment variable naming a real Neuron PJRT library to use instead of the stub (PyTorch/XLA's name).
LIBRARY_PATH_ENV = "NEURON_LIBRARY_PATH"
#: File name of the stub library the package build compiles (see setup.py).
STUB_LIBRARY_NAME = "libpjrt_stub_neuron.so"


def stub_library_path() -> Path:
    """The stub library installed inside this package (it may be missing if the build failed)."""
    return Path(__file__).resolve().with_name(STUB_LIBRARY_NAME)


def vendor_library_override() -> str | None:
    """The library NEURON_LIBRARY_PATH names (made absolute), or ``None`` when it is unset or blank.

    A value that names no regular file raises ``PluginConfigurationError`` naming the
    variable (the core's ``find_library``): the user meant this plugin, so selection
    reports the setting instead of quietly using another plugin or the stub.
    """
    return find_library(LIBRARY_PATH_ENV, ())


def library_path() -> Path:
    """The library a client will load: NEURON_LIBRARY_PATH if set, else the stub."""
    override = vendor_library_override()
    return Path(override) if override is not None else stub_library_path()


#: What to do when the stub library is missing (the core reports the missing file with it).
MISSING_LIBRARY_HINT = (
    f"the package was installed without its {STUB_LIBRARY_NAME}: reinstall pjrt-plugin-stub-neuron from "
    f"source (its build compiles the library with gcc), or set {LIBRARY_PATH_ENV} to a vendor library"
)
