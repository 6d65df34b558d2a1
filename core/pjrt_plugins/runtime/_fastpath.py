"""The runtime's compiled fast path (``csrc/fastpath.c``): an execute with its wait, the finish of
ready events, a pinned read, and the destroy of many buffers, each in one C call instead of several through libffi, each of
which costs about 0.2 us (the Architecture page, "The hot paths").

Optional. When the library is missing, damaged or replaced (its checksum, checked before it is
opened), built from other declarations than this package's, or ``PJRT_PLUGINS_FASTPATH`` is
off (``0``, ``false``, ``no``, ``off``), the runtime makes the same calls from Python: the same
results, a few microseconds more per execute. It says why once (a RuntimeWarning, or a log line
for the variable). ``pjrt-plugins doctor`` reports which path runs.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

from .._env import BOOLEAN_WORDS, parse_bool
from ..errors import LibraryLoadError
from . import _file_checksum
from ._cdef import FASTPATH_CRC, ffi
from ._elf import check_shared_library

LIBRARY_FILE = "libpjrt_plugins_fastpath.so"
ENV_VARIABLE = "PJRT_PLUGINS_FASTPATH"

logger = logging.getLogger(__name__)

# Statuses of pjrtp_finish_ready and pjrtp_execute (PJRTP_Status in _cdef.FASTPATH_DECLARATIONS).
DONE, DONE_WITH_ERRORS, EXECUTE_FAILED, RUNNING, READINESS_UNKNOWN = range(5)
#: pjrtp_finish_ready or pjrtp_execute refused its arguments and touched nothing (csrc/fastpath.c).
INVALID_ARGUMENTS = -1
#: The function that failed in pjrtp_read_pinned, by PJRTP_ReadStep.
READ_STEPS = (
    "PJRT_Buffer_IncreaseExternalReferenceCount",
    "PJRT_Buffer_OpaqueDeviceMemoryDataPointer",
    "PJRT_Buffer_DecreaseExternalReferenceCount",
)
#: pjrtp_read_pinned's failed steps of its own (csrc/fastpath.c): the plugin gave NULL as the address
#: of the bytes, or the call refused its arguments. It then returns a marker, never a plugin's error.
STEP_NO_DATA, STEP_INVALID = 3, 4


def switched_off() -> str | None:
    """``"PJRT_PLUGINS_FASTPATH=<value>"`` when the variable turns the fast path off, else None.

    Any case of 0/false/no/off turns it off; 1/true/yes/on or unset or blank leave it on. Anything
    else leaves it on too, with a RuntimeWarning that says how to write it.
    """
    raw = os.environ.get(ENV_VARIABLE, "").strip()
    if not raw:
        return None
    try:
        on = parse_bool(raw)
    except ValueError:
        warnings.warn(
            f"{ENV_VARIABLE}={raw!r} is not a boolean ({BOOLEAN_WORDS}); the compiled fast path stays on. "
            f"Set {ENV_VARIABLE}=0 to run without it.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    return None if on else f"{ENV_VARIABLE}={raw}"


def _load() -> tuple[Any, str]:
    """``(library, "")``, or ``(None, why it is not used)``."""
    off = switched_off()
    if off is not None:
        return None, f"{off} is set"
    path = Path(__file__).with_name(LIBRARY_FILE)
    if not path.is_file():
        return None, f"{path} is missing"
    problem = _file_checksum.problem(path)  # before dlopen, which runs the file's constructors
    if problem is not None:
        return None, f"{path} cannot be loaded: {problem}"
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


def destroy_plan(destroy_fn: Any, args: Any) -> Any:
    """A PJRTP_DestroyPlan for ``pjrtp_destroy_buffers`` over ``PJRT_Buffer_Destroy`` and one args struct
    the caller owns for the call (None without the fast path)."""
    if library is None:
        return None
    plan = ffi.new("PJRTP_DestroyPlan*")
    plan.destroy = destroy_fn
    plan.destroy_args = args
    return plan
