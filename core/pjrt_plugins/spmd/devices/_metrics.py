"""What the engine counts: bytes moved per device (transfer counters) and the execution metrics.

Counting only: the transport, execution and trace layers add to these counters, and ``xs.metrics()``
/ ``xs.transfer_counters()`` read snapshots of them. Never moves data or runs anything.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import Any

__all__ = [
    "Metrics",
    "TransferCounters",
    "count",
    "count_download",
    "count_fallback",
    "count_upload",
    "metrics",
    "metrics_report",
    "reset_metrics",
    "reset_transfer_counters",
    "transfer_counters",
]


# -- transfer counters -------------------------------------------------------------------


@dataclass(frozen=True)
class TransferCounters:
    """Bytes and buffers moved, per device ordinal, since the last reset.

    ``uploaded[i]`` / ``downloaded[i]`` are bytes sent to / read from device
    ``i`` (padding included, since it moves too); ``uploads`` / ``downloads``
    count buffers.

    Example (4 devices, a 16x8 float32 tensor split by rows)::

        xs.reset_transfer_counters()
        xs.mark_sharding(t, xs.Mesh(range(4), (4,)), (0, None))
        xs.transfer_counters().uploaded   # {0: 128, 1: 128, 2: 128, 3: 128}
        print(xs.transfer_counters().report())
    """

    uploaded: dict[int, int] = field(default_factory=dict)
    downloaded: dict[int, int] = field(default_factory=dict)
    uploads: int = 0
    downloads: int = 0

    @property
    def total_uploaded(self) -> int:
        return sum(self.uploaded.values())

    @property
    def total_downloaded(self) -> int:
        return sum(self.downloaded.values())

    def report(self) -> str:
        """A short text table of bytes per device."""
        devices = sorted(set(self.uploaded) | set(self.downloaded))
        lines = [f"{'device':>6} {'uploaded':>14} {'downloaded':>14}"]
        for d in devices:
            lines.append(f"{d:>6} {self.uploaded.get(d, 0):>14,} {self.downloaded.get(d, 0):>14,}")
        lines.append(f"{'total':>6} {self.total_uploaded:>14,} {self.total_downloaded:>14,}")
        lines.append(f"buffers: {self.uploads} uploaded, {self.downloads} downloaded")
        return "\n".join(lines)


class _TransferCounters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.uploaded: defaultdict[int, int] = defaultdict(int)
        self.downloaded: defaultdict[int, int] = defaultdict(int)
        self.uploads = 0
        self.downloads = 0

    def add_upload(self, ordinal: int, nbytes: int) -> None:
        with self.lock:
            self.uploaded[ordinal] += nbytes
            self.uploads += 1

    def add_download(self, ordinal: int, nbytes: int) -> None:
        with self.lock:
            self.downloaded[ordinal] += nbytes
            self.downloads += 1

    def snapshot(self) -> TransferCounters:
        with self.lock:
            return TransferCounters(dict(self.uploaded), dict(self.downloaded), self.uploads, self.downloads)


_transfer_counters = _TransferCounters()


def transfer_counters() -> TransferCounters:
    """A snapshot of the bytes moved per device since the last :func:`reset_transfer_counters`."""
    return _transfer_counters.snapshot()


def reset_transfer_counters() -> None:
    """Zero the transfer counters."""
    with _transfer_counters.lock:
        _transfer_counters.reset()


def count_upload(ordinal: int, nbytes: int) -> None:
    """Count one buffer of ``nbytes`` sent to device ``ordinal`` (the transport layer calls this)."""
    _transfer_counters.add_upload(ordinal, nbytes)


def count_download(ordinal: int, nbytes: int) -> None:
    """Count one buffer of ``nbytes`` read from device ``ordinal``."""
    _transfer_counters.add_download(ordinal, nbytes)


# -- execution metrics ---------------------------------------------------------------------


@dataclass(frozen=True)
class Metrics:
    """Counters of the execution engine since the last :func:`reset_metrics` (``xs.metrics()`` returns one).

    ``compiles``: programs compiled by the plugin; ``cache_hits``: compiles avoided by the
    in-memory cache; ``persistent_cache_hits``: executables loaded from the cache directory;
    ``executions``: programs run; ``ops_recorded``: ATen operators traced;
    ``bytes_uploaded`` / ``bytes_downloaded``: host<->device bytes over all devices (from
    the transfer counters); ``fallbacks`` / ``fallback_ops``: operators run on the CPU
    because :func:`~pjrt_plugins.spmd.set_cpu_fallback` is on (total, and per operator);
    ``lowering_seconds`` / ``compile_seconds`` / ``execute_seconds``: wall time per phase;
    ``donated_buffers``: device buffers given to a program to write its outputs into (see
    :func:`~pjrt_plugins.spmd.set_donation`).
    A frozen snapshot: compare the fields of two to measure a stretch of work.

    Example::

        before = xs.metrics()
        train_step(); xs.sync()
        after = xs.metrics()
        after.compiles - before.compiles       # 0 once the step is compiled
        print(after)                           # the same text as after.report()
    """

    compiles: int = 0
    cache_hits: int = 0
    persistent_cache_hits: int = 0
    executions: int = 0
    bytes_uploaded: int = 0
    bytes_downloaded: int = 0
    fallbacks: int = 0
    ops_recorded: int = 0
    lowering_seconds: float = 0.0
    compile_seconds: float = 0.0
    execute_seconds: float = 0.0
    donated_buffers: int = 0
    fallback_ops: dict[str, int] = field(default_factory=dict)

    def report(self) -> str:
        """A short text report, one counter per line."""
        lines = [
            f"compiles:              {self.compiles}",
            f"cache hits:            {self.cache_hits}",
            f"persistent cache hits: {self.persistent_cache_hits}",
            f"executions:            {self.executions}",
            f"ops recorded:          {self.ops_recorded}",
            f"bytes uploaded:        {self.bytes_uploaded:,}",
            f"bytes downloaded:      {self.bytes_downloaded:,}",
            f"cpu fallbacks:         {self.fallbacks}",
            f"lowering time:         {self.lowering_seconds:.3f} s",
            f"compile time:          {self.compile_seconds:.3f} s",
            f"execute time:          {self.execute_seconds:.3f} s",
            f"donated buffers:       {self.donated_buffers}",
        ]
        if self.fallback_ops:
            ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.fallback_ops.items()))
            lines.append(f"fallback ops:          {ops}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


class _EngineCounters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, Any] = {}
        self.reset(baseline=False)

    def reset(self, baseline: bool = True) -> None:
        """Zero the counters; byte counts restart from the transfer counters' current totals."""
        with self.lock:
            self.values = {f.name: (0.0 if f.type == "float" else 0) for f in fields(Metrics) if f.name not in
                           ("bytes_uploaded", "bytes_downloaded", "fallback_ops")}
            self.values["fallback_ops"] = {}
            self.upload_base, self.download_base = _transfer_totals() if baseline else (0, 0)

    def add(self, name: str, amount: float = 1) -> None:
        with self.lock:
            self.values[name] += amount

    def add_fallback(self, op: str) -> None:
        with self.lock:
            self.values["fallbacks"] += 1
            ops = self.values["fallback_ops"]
            ops[op] = ops.get(op, 0) + 1

    def snapshot(self) -> Metrics:
        up, down = _transfer_totals()
        with self.lock:
            values = dict(self.values)
            values["fallback_ops"] = dict(values["fallback_ops"])
            # The transfer counters may have been reset since our baseline: then count from zero.
            up = up - self.upload_base if up >= self.upload_base else up
            down = down - self.download_base if down >= self.download_base else down
            return Metrics(bytes_uploaded=up, bytes_downloaded=down, **values)


def _transfer_totals() -> tuple[int, int]:
    c = transfer_counters()
    return c.total_uploaded, c.total_downloaded


_engine_counters = _EngineCounters()


def metrics() -> Metrics:
    """A snapshot of the execution counters (compiles, cache hits, executions, bytes, fallbacks).

    Example (a training loop that repeats one step compiles it once)::

        import pjrt_plugins.spmd as xs
        xs.reset_metrics()
        for _ in range(10):
            loss = model(x).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
            xs.sync()
        m = xs.metrics()
        m.compiles, m.cache_hits, m.executions   # (1, 9, 10)
    """
    return _engine_counters.snapshot()


def reset_metrics() -> None:
    """Zero the execution counters (the transfer counters are not touched).

    Byte counts restart from the transfer counters' totals at this moment.

    Example::

        xs.reset_metrics()
        xs.metrics().executions   # 0
    """
    _engine_counters.reset()


def metrics_report() -> str:
    """:func:`metrics` as a short text report, one counter per line.

    Example::

        print(xs.metrics_report())
        # compiles:              1
        # cache hits:            9
        # executions:            10
        # ...
    """
    return metrics().report()


def count(name: str, amount: float = 1) -> None:
    """Add to one counter (used by the lazy tracer)."""
    _engine_counters.add(name, amount)


def count_fallback(op: str) -> None:
    _engine_counters.add_fallback(op)
