"""Host values made transferable: numpy arrays, torch CPU tensors and array-likes the plugin can read.

A plugin reads host memory in place only when it is C-contiguous and native-endian, and
aliases it (no copy at all) only when it is aligned; here values become such arrays.
Nothing here calls a plugin.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._dtypes import is_torch_tensor, torch_to_numpy

#: Host memory we hand over without a copy is aligned like this (the CPU plugin aliases
#: only 64-byte-aligned memory and copies anything else).
HOST_ALIGNMENT = 64


def host_array(value: Any) -> tuple[np.ndarray, bool]:
    """``(array, usable_as_is)`` for a numpy array, torch CPU tensor or array-like.

    ``usable_as_is`` is False when the plugin cannot read the array's memory directly
    (not C-contiguous, or not native-endian): then it must be copied with :func:`aligned_copy`.
    """
    if isinstance(value, np.ndarray):
        array = value
    elif is_torch_tensor(value):
        array = torch_to_numpy(value)
    else:
        array = np.asarray(value)
        if array.dtype == object:
            raise TypeError(f"cannot transfer a value of type {type(value).__name__} (it is not an array)")
    return array, bool(array.dtype.isnative and array.flags.c_contiguous)


def aligned_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` uninitialized host bytes (uint8) starting on a HOST_ALIGNMENT boundary.

    Plugins alias (read without a copy) only aligned host memory; numpy also asks Linux
    for transparent huge pages on large allocations, which makes first writes faster.
    """
    raw = np.empty(nbytes + HOST_ALIGNMENT, np.uint8)
    offset = (-raw.ctypes.data) % HOST_ALIGNMENT
    return raw[offset : offset + nbytes]


#: Below this size a private copy is not worth aligning (the plugin may copy it again).
_ALIGN_FROM_BYTES = 1 << 16


def aligned_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous, native-endian copy of ``array`` (one pass); HOST_ALIGNMENT-aligned if large."""
    dtype = array.dtype if array.dtype.isnative else array.dtype.newbyteorder("=")
    if array.nbytes < _ALIGN_FROM_BYTES:
        return np.array(array, dtype=dtype, order="C", copy=True)
    out = aligned_empty(array.size * dtype.itemsize).view(dtype).reshape(array.shape)
    np.copyto(out, array, casting="equiv")
    return out

