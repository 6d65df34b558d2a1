"""XSpace, XLA's profile format, read just enough to write it as Chrome trace events (what Perfetto opens).

Schema: ``tsl/profiler/protobuf/xplane.proto`` (XSpace > XPlane > XLine > XEvent, event names in
each plane's ``event_metadata``). Pure functions over bytes: no I/O, no C calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from ._proto import LENGTH_DELIMITED, VARINT, _fields


class TraceEvent(NamedTuple):
    """One complete event: its plane (a process in the trace), line (a thread), name, start and duration."""

    plane: str
    line: str
    name: str
    start_ns: float
    duration_ns: float


def _signed(value: int) -> int:
    """A protobuf int64 read as an unsigned varint, back to its sign."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _message(data: Any) -> dict[int, list[Any]]:
    """``{field number: [values]}`` of one serialized message (varints as ints, the rest as bytes)."""
    fields: dict[int, list[Any]] = {}
    for number, wire, value in _fields(bytes(data)):
        if wire == VARINT:
            fields.setdefault(number, []).append(_signed(value))
        elif wire == LENGTH_DELIMITED:
            fields.setdefault(number, []).append(bytes(value))
    return fields


def _text(fields: dict[int, list[Any]], number: int) -> str:
    values = fields.get(number)
    return values[-1].decode("utf-8", "replace") if values else ""


def _int(fields: dict[int, list[Any]], number: int) -> int:
    values = fields.get(number)
    return int(values[-1]) if values else 0


def hostnames(xspace: bytes) -> list[str]:
    """The hosts the XSpace was recorded on (``XSpace.hostnames``)."""
    return [name.decode("utf-8", "replace") for name in _message(xspace).get(4, [])]


def trace_events(xspace: bytes) -> Iterator[TraceEvent]:
    """Every timed event of every plane; aggregated ones (``num_occurrences``, no offset) are skipped."""
    for plane_data in _message(xspace).get(1, []):
        plane = _message(plane_data)
        names: dict[int, str] = {}
        for entry_data in plane.get(4, []):  # map<int64, XEventMetadata>
            entry = _message(entry_data)
            metadata = _message(entry[2][-1]) if entry.get(2) else {}
            names[_int(entry, 1)] = _text(metadata, 4) or _text(metadata, 2)  # display_name, else name
        plane_name = _text(plane, 2) or f"plane {_int(plane, 1)}"
        for line_data in plane.get(3, []):
            line = _message(line_data)
            line_name = _text(line, 11) or _text(line, 2) or f"line {_int(line, 1)}"
            timestamp_ns = _int(line, 3)
            for event_data in line.get(4, []):
                event = _message(event_data)
                if 5 in event:  # num_occurrences: an aggregate, not a span in time
                    continue
                metadata_id = _int(event, 1)
                yield TraceEvent(
                    plane_name,
                    line_name,
                    names.get(metadata_id) or f"event {metadata_id}",
                    timestamp_ns + _int(event, 2) / 1000,
                    _int(event, 3) / 1000,
                )


def chrome_trace(xspace: bytes) -> dict[str, Any]:
    """The XSpace as a Chrome trace (``{"traceEvents": [...]}``; times in microseconds), for Perfetto.

    Each plane becomes a process and each of its lines a thread, named by metadata events.
    """
    processes: dict[str, int] = {}
    threads: dict[tuple[str, str], int] = {}
    events: list[dict[str, Any]] = []
    for event in trace_events(xspace):
        if event.plane not in processes:
            processes[event.plane] = len(processes) + 1
            events.append({"ph": "M", "name": "process_name", "pid": processes[event.plane], "args": {"name": event.plane}})
        pid = processes[event.plane]
        key = (event.plane, event.line)
        if key not in threads:
            threads[key] = len(threads) + 1
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": threads[key], "args": {"name": event.line}})
        events.append({"ph": "X", "name": event.name, "pid": pid, "tid": threads[key],
                       "ts": event.start_ns / 1000, "dur": event.duration_ns / 1000})
    return {"displayTimeUnit": "ns", "traceEvents": events}
