"""The CPU backend: finds the OpenXLA CPU PJRT library and says how many CPU devices to create.

Never opens the library and never imports a heavy module: everything here is
answered from environment variables and installed-package metadata (and the C
library's ``mallopt``, see :func:`keep_freed_host_memory`).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Mapping
from typing import Any

from pjrt_plugins import DevicePlugin, PluginConfigurationError, env_bool, env_int, find_library, hookimpl

logger = logging.getLogger(__name__)

#: Overrides the library found in the ``xla-cpu-pjrt`` distribution (e.g. a newer build).
LIBRARY_PATH_ENV = "PJRT_CPU_LIBRARY_PATH"
#: PyTorch/XLA's variable for the number of CPU devices; maps to ``cpu_device_count``.
NUM_DEVICES_ENV = "CPU_NUM_DEVICES"
#: The distribution that ships the library, and where the library sits inside it.
LIBRARY_DISTRIBUTION = "xla-cpu-pjrt"
LIBRARY_IN_DISTRIBUTION = "xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"
LIBRARY_DISTRIBUTIONS = ((LIBRARY_DISTRIBUTION, LIBRARY_IN_DISTRIBUTION),)
#: Devices per client when ``CPU_NUM_DEVICES`` is unset (PyTorch/XLA and JAX also default to 1).
DEFAULT_NUM_DEVICES = 1
#: What the library creates when no ``cpu_device_count`` option is given.
DEFAULT_LIBRARY_DEVICES = 4
#: More devices than this make client creation take minutes (see check_device_count).
MAX_NUM_DEVICES = 1024
#: Seconds without any CPU use after which a waiting execution is declared stuck; 0 turns the check off.
STALL_TIMEOUT_ENV = "PJRT_CPU_STALL_TIMEOUT"
DEFAULT_STALL_TIMEOUT_S = 10.0
#: XLA flags set for the library while it creates its client, unless the user's XLA_FLAGS names them.
#: XNNPACK fusions rebuild their runtime inside a program and then wait for tasks queued on the same
#: intra-op pool that collectives park threads in; with as many threads as devices (the library's
#: default on a machine with fewer cores) every thread can end up waiting, and the program
#: deadlocks in an all-reduce (the documentation's Backends page, "The all-reduce deadlock").
XLA_FLAG_DEFAULTS = {"xla_cpu_use_xnnpack": "false"}
#: XLA's pool-size variables. Unset, the library gives its pools ``max(cores, devices)`` threads:
#: enough with XNNPACK off, where the only thread a program parks is one per device in a collective
#: (XLA runs a device's collectives one at a time). A user who turns XNNPACK back on gets
#: THREADS_PER_DEVICE_WITH_XNNPACK threads per device instead, the margin that also ended the deadlock.
POOL_SIZE_ENVS = ("PJRT_NPROC", "NPROC")
THREADS_PER_DEVICE_WITH_XNNPACK = 2
#: ``0`` leaves glibc's malloc as it is (see keep_freed_host_memory); unset or ``1`` keeps freed memory.
KEEP_FREED_MEMORY_ENV = "PJRT_CPU_KEEP_FREED_MEMORY"
#: Requests below this come from malloc's heaps, not from fresh mmaps: glibc's largest (32 MiB on 64-bit).
MMAP_THRESHOLD = 32 << 20
#: Free memory at a heap's top is given back to the system only beyond this.
TRIM_THRESHOLD = 1 << 30
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
_kept_freed_memory: bool | None = None  # None: not tried yet in this process


def keep_freed_host_memory() -> bool:
    """Have glibc's malloc keep the memory a training step frees for the next one; True where it does.

    This library's device buffers and each execution's temporaries are host memory from malloc.
    By default glibc gives freed memory back to the system once a heap's free top passes its trim
    threshold, and serves requests above its mmap threshold with fresh mappings, raising both
    thresholds only as far as what it has seen freed. A step whose temporaries outgrow them then
    faults the same pages in again every step: 5,400 page faults and 13 ms of CPU a step for the
    Megatron Llama of ``benchmarks/hf_step.py`` (the documentation's Benchmarks page). Fixed
    thresholds keep that memory in the process, as the caching allocators of torch and jax do for
    GPU memory; the price is that the process does not shrink after a peak. Once per process; not
    on a C library without glibc's ``mallopt`` (then nothing changes).
    """
    global _kept_freed_memory
    if _kept_freed_memory is None:
        try:
            mallopt = ctypes.CDLL(None).mallopt  # the C library the process runs on; 1 on success
            _kept_freed_memory = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and (
                mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            )
        except (AttributeError, OSError) as exc:  # no mallopt: not glibc
            logger.debug("cannot set malloc's thresholds: %s", exc)
            _kept_freed_memory = False
        logger.debug("malloc keeps freed memory: %s", _kept_freed_memory)
    return _kept_freed_memory


def configure_host_memory() -> None:
    """Keep freed host memory (:func:`keep_freed_host_memory`) unless ``PJRT_CPU_KEEP_FREED_MEMORY=0``."""
    if env_bool(KEEP_FREED_MEMORY_ENV, default=True):
        keep_freed_host_memory()


def check_device_count(count: int, source: str) -> int:
    """Refuse a device count the library mishandles; ``source`` names where it came from.

    The library silently makes a client with no devices for a count below 1, and
    its client creation grows quadratically with the count (1024 devices take
    seconds, 4096 nearly a minute, 100000 never finish).
    """
    if not 1 <= count <= MAX_NUM_DEVICES:
        raise PluginConfigurationError(f"{source}={count} must be between 1 and {MAX_NUM_DEVICES} CPU devices")
    return count


def xla_flags_with_defaults(flags: str) -> str:
    """The user's ``XLA_FLAGS`` followed by each of :data:`XLA_FLAG_DEFAULTS` they do not name."""
    given = {token.lstrip("-").split("=", 1)[0] for token in flags.split()}
    extra = [f"--{name}={value}" for name, value in XLA_FLAG_DEFAULTS.items() if name not in given]
    return " ".join([flags.strip(), *extra]).strip()


def xnnpack_enabled(flags: str) -> bool:
    """Whether ``XLA_FLAGS`` turns XNNPACK on (the last ``--xla_cpu_use_xnnpack`` wins; a bare flag means true)."""
    enabled = False
    for token in flags.split():
        name, _, value = token.lstrip("-").partition("=")
        if name == "xla_cpu_use_xnnpack":
            enabled = value.lower() in ("", "true", "1")
    return enabled


def client_environment(device_count: int) -> dict[str, str]:
    """What the library must see in the environment while it creates a client of ``device_count`` devices.

    XNNPACK is off (see :data:`XLA_FLAG_DEFAULTS`) and the thread pools keep the library's own
    size; a user who turns XNNPACK back on gets ``max(cores, 2 * devices)`` threads
    (:data:`POOL_SIZE_ENVS`). A ``PJRT_NPROC``/``NPROC`` or flag the user set is kept. XLA
    reads its flags once per process, at the first client.
    """
    flags = xla_flags_with_defaults(os.environ.get("XLA_FLAGS", ""))
    environment = {"XLA_FLAGS": flags}
    if xnnpack_enabled(flags) and not any(os.environ.get(name, "").strip() for name in POOL_SIZE_ENVS):
        threads = THREADS_PER_DEVICE_WITH_XNNPACK * device_count
        environment["PJRT_NPROC"] = str(max(os.cpu_count() or 1, threads))
    return environment


def stall_timeout() -> float | None:
    """Seconds of no CPU use before a waiting execution is stuck: ``PJRT_CPU_STALL_TIMEOUT`` or 10; 0: off."""
    raw = os.environ.get(STALL_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_STALL_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise PluginConfigurationError(
            f"environment variable {STALL_TIMEOUT_ENV}={raw!r} must be a number of seconds"
        ) from None
    if not value >= 0 or value == float("inf"):
        raise PluginConfigurationError(
            f"environment variable {STALL_TIMEOUT_ENV}={raw!r} must be a finite number of seconds >= 0"
        )
    return value or None


def num_devices() -> int:
    """Devices per client: ``CPU_NUM_DEVICES`` or 1; raises ``ValueError`` for a bad value."""
    count = env_int(NUM_DEVICES_ENV, default=DEFAULT_NUM_DEVICES)
    return check_device_count(count, f"environment variable {NUM_DEVICES_ENV}")


class CpuPlugin(DevicePlugin):
    """PJRT on the host CPU, through the OpenXLA CPU plugin (PJRT C API 0.81 in xla-cpu-pjrt 0.0.1).

    The library ignores the key-value store and ``num_nodes``: every process gets
    its own independent set of ``cpu_device_count`` devices.
    """

    @hookimpl
    def pjrt_library_path(self) -> str | None:
        # A PJRT_CPU_LIBRARY_PATH naming no regular file raises PluginConfigurationError (find_library).
        return find_library(LIBRARY_PATH_ENV, LIBRARY_DISTRIBUTIONS)

    @hookimpl
    def pjrt_library_missing_hint(self) -> str:
        return (
            f"the {LIBRARY_DISTRIBUTION} package is not installed (or lacks {LIBRARY_IN_DISTRIBUTION}): "
            f"run `pip install {LIBRARY_DISTRIBUTION}` or set {LIBRARY_PATH_ENV}"
        )

    @hookimpl
    def pjrt_client_option_schema(self) -> dict[str, Any]:
        # This build reads only ``cpu_device_count``, ignores unknown names and
        # aborts the process on a wrong type: only a schema keeps that out.
        return {"cpu_device_count": int}

    @hookimpl
    def pjrt_client_create_options(self) -> dict[str, Any]:
        return {"cpu_device_count": num_devices()}

    @hookimpl
    def pjrt_check_client_options(self, options: Mapping[str, Any]) -> None:
        if "cpu_device_count" in options:
            check_device_count(options["cpu_device_count"], "client option cpu_device_count")

    @hookimpl
    def pjrt_client_create_environment(self, options: Mapping[str, Any]) -> dict[str, str]:
        return client_environment(int(options.get("cpu_device_count", DEFAULT_LIBRARY_DEVICES)))

    @hookimpl
    def pjrt_configure_single_process(self) -> None:
        configure_host_memory()

    @hookimpl
    def pjrt_configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        configure_host_memory()  # every process has its own devices: nothing to divide

    @hookimpl
    def pjrt_stall_timeout(self) -> float | None:
        return stall_timeout()

    @hookimpl
    def pjrt_physical_chip_count(self) -> int:
        # A CPU has no chips to count: a client's devices count as its chips, so torchrun's
        # process count (one per chip) and the device count agree.
        return num_devices()

    @hookimpl
    def pjrt_priority(self) -> int:
        return 0

    @hookimpl
    def pjrt_preflight(self) -> None:
        num_devices()  # a malformed CPU_NUM_DEVICES fails here, before anything is opened
