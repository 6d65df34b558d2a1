"""PJRT_NamedValue arrays: encode validated options for the plugin, decode what it returns.

Encoding keeps every cffi allocation alive in the returned holder; the caller must hold
it until the C call that reads the array has returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from ..options import NamedValue, OptionType
from ._args import checked_count, unpack_text
from ._cdef import STRUCT_SIZE, ffi


class EncodedNamedValues:
    """A ``PJRT_NamedValue[]`` plus the memory its pointers refer to."""

    def __init__(self, values: Sequence[NamedValue]) -> None:
        self._keep: list[Any] = []
        self.count = len(values)
        self.array = ffi.new("PJRT_NamedValue[]", max(1, self.count))
        for slot, value in zip(self.array, values):
            slot.struct_size = STRUCT_SIZE["PJRT_NamedValue"]
            name = value.name.encode("utf-8")
            name_c = ffi.new("char[]", name)
            self._keep.append(name_c)
            slot.name = name_c
            slot.name_size = len(name)
            kind = OptionType(value.type)
            slot.type = int(kind)
            if kind is OptionType.STRING:
                data = str(value.value).encode("utf-8")
                data_c = ffi.new("char[]", data)
                self._keep.append(data_c)
                slot.string_value = data_c
                slot.value_size = len(data)
            elif kind is OptionType.INT64:
                slot.int64_value = cast(int, value.value)  # validate_options made it an int
                slot.value_size = 1
            elif kind is OptionType.INT64_LIST:
                items = [int(v) for v in value.value]  # type: ignore[union-attr]
                data_c = ffi.new("int64_t[]", max(1, len(items)))
                for i, item in enumerate(items):
                    data_c[i] = item
                self._keep.append(data_c)
                slot.int64_array_value = data_c
                slot.value_size = len(items)
            elif kind is OptionType.FLOAT:
                slot.float_value = cast(float, value.value)  # validate_options made it a float
                slot.value_size = 1
            elif kind is OptionType.BOOL:
                slot.bool_value = bool(value.value)
                slot.value_size = 1
            else:  # pragma: no cover - OptionType is closed
                raise TypeError(f"cannot encode option {value.name!r} of kind {kind!r}")

    @property
    def pointer(self) -> Any:
        return self.array if self.count else ffi.NULL


def decode_named_values(array: Any, count: int, function: str = "a PJRT function") -> dict[str, Any]:
    """Turn a plugin-owned ``PJRT_NamedValue[count]`` (``function``'s answer) into ``{name: value}``
    (lists as tuples)."""
    result: dict[str, Any] = {}
    if array == ffi.NULL:
        return result
    for i in range(checked_count(array, count, function, "named values", "the plugin")):
        item = array[i]
        name = unpack_text(item.name, item.name_size)
        kind = int(ffi.cast("int", item.type))
        size = int(item.value_size)
        value: Any
        if kind == OptionType.STRING:
            value = unpack_text(item.string_value, size) if size else ""
        elif kind == OptionType.INT64:
            value = int(item.int64_value)
        elif kind == OptionType.INT64_LIST:
            value = tuple(ffi.unpack(item.int64_array_value, checked_count(item.int64_array_value, size, function, "integers", "the plugin"))) if size else ()
        elif kind == OptionType.FLOAT:
            value = float(item.float_value)
        elif kind == OptionType.BOOL:
            value = bool(item.bool_value)
        else:
            value = f"<unknown named-value type {kind}>"
        result[name] = value
    return result
