"""Whether an address lies in executable memory of this process: a sanity check of function pointers.

A plugin's ``PJRT_Api`` table is trusted only up to what its ``struct_size`` and version
claim; a pointer past the real table is whatever data follows it. Before calling a slot we
check that it points into an executable mapping (``/proc/self/maps``): calling anything
else would crash. Linux only; elsewhere every address passes.
"""

from __future__ import annotations

import bisect
import logging
import threading

logger = logging.getLogger(__name__)

_MAPS = "/proc/self/maps"
_lock = threading.Lock()
_starts: list[int] = []
_ends: list[int] = []
_unavailable = False


def _read_executable_ranges() -> tuple[list[int], list[int]] | None:
    try:
        with open(_MAPS) as f:
            lines = f.readlines()
    except OSError as exc:
        logger.debug("cannot read %s (%s): function pointers are not checked against executable memory", _MAPS, exc)
        return None
    ranges = []
    for line in lines:
        fields = line.split(maxsplit=2)
        if len(fields) >= 2 and "x" in fields[1]:
            start, _, end = fields[0].partition("-")
            ranges.append((int(start, 16), int(end, 16)))
    ranges.sort()
    return [start for start, _ in ranges], [end for _, end in ranges]


def is_executable_address(address: int) -> bool:
    """True when ``address`` is inside an executable mapping (always True where that cannot be known).

    The mappings are read once and again only when an address is not found (a library
    loaded since), so checking the slots of a loaded plugin costs a bisect each.
    """
    global _starts, _ends, _unavailable
    for attempt in range(2):
        with _lock:
            if _unavailable:
                return True
            i = bisect.bisect_right(_starts, address) - 1
            if i >= 0 and address < _ends[i]:
                return True
            if attempt:
                return False
            ranges = _read_executable_ranges()
            if ranges is None:
                _unavailable = True
                return True
            _starts, _ends = ranges
    return False
