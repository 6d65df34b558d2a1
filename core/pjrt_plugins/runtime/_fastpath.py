"""The runtime's compiled fast path (``csrc/fastpath.c``): an execute with its wait, the finish of
ready events, and a pinned read, each in one C call instead of several through libffi, each of
which costs about 0.2 us (the Architecture page, "The hot paths").

Optional. When the library is missing, damaged or built from other declarations than this
package's, or ``PJRT_PLUGINS_FASTPATH=0`` is set, the runtime makes the same calls from Python:
the same results, a few microseconds more per execute. It says why once (a RuntimeWarning,
or a log line for the variable). ``pjrt-plugins doctor`` reports which path runs.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

from ..errors import LibraryLoadError
from ._cdef import FASTPATH_CRC, ffi
from ._elf import check_shared_library

LIBRARY_FILE = "libpjrt_plugins_fastpath.so"
ENV_VARIABLE = "PJRT_PLUGINS_FASTPATH"

logger = logging.getLogger(__name__)

# Statuses of pjrtp_finish_ready and pjrtp_execute (PJRTP_Status in _cdef.FASTPATH_DECLARATIONS).
DONE, DONE_WITH_ERRORS, EXECUTE_FAILED, RUNNING, READINESS_UNKNOWN = range(5)
#: The function that failed in pjrtp_read_pinned, by PJRTP_ReadStep.
READ_STEPS = (
    "PJRT_Buffer_IncreaseExternalReferenceCount",
    "PJRT_Buffer_OpaqueDeviceMemoryDataPointer",
    "PJRT_Buffer_DecreaseExternalReferenceCount",
)


def _load() -> tuple[Any, str]:
    """``(library, "")``, or ``(None, why it is not used)``."""
    if os.environ.get(ENV_VARIABLE, "").strip() == "0":
        return None, f"{ENV_VARIABLE}=0 is set"
    path = Path(__file__).with_name(LIBRARY_FILE)
    if not path.is_file():
        return None, f"{path} is missing"
    try:
        check_shared_library(str(path))
        library = ffi.dlopen(str(path), ffi.RTLD_NOW | ffi.RTLD_LOCAL)
        crc = library.pjrtp_declarations_crc()
    except (LibraryLoadError, OSError, AttributeError) as exc:
        return None, f"{path} cannot be loaded ({exc})"
    if crc != FASTPATH_CRC:
        return None, f"{path} was built from other declarations than this pjrt_plugins (a stale build)"
    return library, ""


library, unavailable_reason = _load()
if library is None and unavailable_reason.startswith(ENV_VARIABLE):
    logger.info("pjrt_plugins.runtime: the compiled fast path is off (%s)", unavailable_reason)
elif library is None:
    warnings.warn(
        f"pjrt_plugins.runtime runs without its compiled fast path: {unavailable_reason}. Results are "
        "the same; each execute costs a few microseconds more. Reinstall pjrt-plugins to restore it "
        "(pip install --force-reinstall pjrt-plugins; a build from source needs a C compiler), or set "
        f"{ENV_VARIABLE}=0 to run without it quietly.",
        RuntimeWarning,
        stacklevel=2,
    )


def launch_id_counter(start: int) -> Any:
    """An executable's launch-id counter for :func:`execute_plan` (an ``int64_t*``)."""
    return ffi.new("int64_t*", start)


def event_plan(functions: tuple[Any, Any, Any], structs: tuple[Any, Any, Any]) -> Any:
    """A PJRTP_EventPlan over ReadyEvents' three functions and args structs (None without the
    fast path); its owner points its ``errors`` and ``destroy_errors`` at arrays large enough."""
    if library is None:
        return None
    plan = ffi.new("PJRTP_EventPlan*")
    plan.is_ready, plan.await_event, plan.destroy_event = functions
    plan.is_ready_args, plan.await_args, plan.destroy_args = structs
    return plan


def execute_plan(execute_fn: Any, args: Any, events: Any, launch_ids: Any) -> Any:
    """A PJRTP_ExecutePlan for ``pjrtp_execute`` over one execute frame's args struct, the event
    plan (:func:`event_plan`) that finishes its device-complete events and its executable's
    ``launch_ids`` (:func:`launch_id_counter`), or None without the fast path. The caller keeps
    them alive together."""
    if library is None or events is None:
        return None
    plan = ffi.new("PJRTP_ExecutePlan*")
    plan.execute = execute_fn
    plan.execute_args = args
    plan.events = events
    plan.launch_ids = launch_ids
    return plan


def read_plan(functions: tuple[Any, Any, Any], structs: tuple[Any, Any, Any]) -> Any:
    """A PJRTP_ReadPlan over a pinning's three functions and args structs (None without the fast path)."""
    if library is None:
        return None
    plan = ffi.new("PJRTP_ReadPlan*")
    plan.hold, plan.where, plan.unhold = functions
    plan.hold_args, plan.where_args, plan.unhold_args = structs
    return plan
