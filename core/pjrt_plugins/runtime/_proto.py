"""Just enough protobuf wire format for the messages we build or pick apart by hand.

Encoding of ints, packed ints and sub-messages, and reading the length-delimited fields
of a message. No schema, no dependency; the tests check results with jaxlib's parsers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

VARINT = 0
FIXED64 = 1
LENGTH_DELIMITED = 2
FIXED32 = 5


def varint(value: int) -> bytes:
    """Base-128 varint; negative values as 64-bit two's complement (protobuf int64)."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(number: int, wire_type: int) -> bytes:
    return varint((number << 3) | wire_type)


def int_field(number: int, value: int) -> bytes:
    return key(number, VARINT) + varint(int(value))


def message_field(number: int, payload: bytes) -> bytes:
    return key(number, LENGTH_DELIMITED) + varint(len(payload)) + payload


def packed_ints(number: int, values: Sequence[int]) -> bytes:
    return message_field(number, b"".join(varint(int(v)) for v in values))


def _read_varint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated protobuf varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """``(number, wire type, value)`` of each field of a serialized message, in order: an int
    for a varint, a memoryview for a length-delimited field, None for a fixed-width one."""
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        tag, pos = _read_varint(view, pos)
        number, wire = tag >> 3, tag & 7
        value: Any = None
        if wire == VARINT:
            value, pos = _read_varint(view, pos)
        elif wire == FIXED64:
            pos += 8
        elif wire == FIXED32:
            pos += 4
        elif wire == LENGTH_DELIMITED:
            size, pos = _read_varint(view, pos)
            value, pos = view[pos : pos + size], pos + size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > len(view):
            raise ValueError("truncated protobuf message")
        yield number, wire, value


def length_delimited_fields(data: bytes, number: int) -> list[bytes]:
    """Every length-delimited field ``number`` of a serialized message, in order."""
    return [bytes(value) for field, wire, value in _fields(data) if field == number and wire == LENGTH_DELIMITED]


def varint_fields(data: bytes, number: int) -> list[int]:
    """Every varint field ``number`` of a message, packed or not, in order."""
    found: list[int] = []
    for field, wire, value in _fields(data):
        if field != number:
            continue
        if wire == VARINT:
            found.append(value)
        elif wire == LENGTH_DELIMITED:  # packed repeated varints
            pos = 0
            while pos < len(value):
                item, pos = _read_varint(value, pos)
                found.append(item)
    return found
