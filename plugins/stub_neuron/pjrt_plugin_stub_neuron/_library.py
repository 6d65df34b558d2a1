"""Where the PJRT library is: the stub built into this package, or NEURON_LIBRARY_PATH.

Only paths are computed here; nothing may open the library.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable naming a real Neuron PJRT library to use instead of the stub (PyTorch/XLA's name).
LIBRARY_PATH_ENV = "NEURON_LIBRARY_PATH"
#: File name of the stub library the package build compiles (see setup.py).
STUB_LIBRARY_NAME = "libpjrt_stub_neuron.so"


def stub_library_path() -> Path:
    """The stub library installed inside this package (it may be missing if the build failed)."""
    return Path(__file__).resolve().with_name(STUB_LIBRARY_NAME)


def vendor_library_override() -> str | None:
    """The value of NEURON_LIBRARY_PATH, or ``None`` when it is unset or empty."""
    value = os.environ.get(LIBRARY_PATH_ENV, "").strip()
    return value or None


def library_path() -> Path:
    """The library a client will load: NEURON_LIBRARY_PATH if set, else the stub."""
    override = vendor_library_override()
    if override is not None:
        return Path(override).expanduser()
    return stub_library_path()


def library_problem_hint() -> str | None:
    """A specific reason (with the fix) why the chosen library cannot be used, or ``None``."""
    override = vendor_library_override()
    if override is not None:
        path = Path(override).expanduser()
        if not path.is_absolute():
            return (
                f"{LIBRARY_PATH_ENV}={override!r} must be an absolute path to the Neuron PJRT library "
                "(for example /opt/aws/neuron/lib/libneuronpjrt.so)"
            )
        if not path.is_file():
            return f"{LIBRARY_PATH_ENV}={override!r} does not name an existing file; fix or unset it to use the stub"
        return None
    if not stub_library_path().is_file():
        return (
            f"the stub library {STUB_LIBRARY_NAME} is missing from the installed package; reinstall "
            "pjrt-plugin-stub-neuron from source (its build compiles the library with gcc)"
        )
    return None
