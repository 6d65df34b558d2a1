"""The TPU backend: libtpu's path, the TPU topology hooks, and the checks that keep libtpu from hanging.

Off a TPU VM libtpu blocks for more than ten minutes inside PJRT_Plugin_Initialize,
so the preflight refuses to go on when no TPU chip is on the PCI bus. Nothing here
imports ``libtpu`` (its import sets TPU_LIBRARY_PATH) or opens the library.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from typing import Any

from pjrt_plugins import (
    DevicePlugin,
    PluginConfigurationError,
    PluginUnavailableError,
    env_bool,
    env_int,
    env_value,
    find_library,
    hookimpl,
)

from . import _host, _metadata
from ._topology import DEFAULT_BASE_PORT, TpuSlice, bounds_size, multiprocess_environment

logger = logging.getLogger(__name__)

#: libtpu's own variable (``import libtpu`` sets it too); overrides the installed package.
LIBRARY_PATH_ENV = "TPU_LIBRARY_PATH"
#: ``1`` skips the PCI check: for TPUs this host cannot see in sysfs. Initialization
#: may then block, up to the initialize timeout.
SKIP_CHIP_CHECK_ENV = "PJRT_TPU_SKIP_CHIP_CHECK"
#: libtpu's switch to read the topology from the environment instead of the GCE metadata server.
SKIP_MDS_QUERY_ENV = "TPU_SKIP_MDS_QUERY"
#: libtpu's topology for one host, set off GCE when the environment names none.
SINGLE_HOST_DEFAULTS = {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_HOST_BOUNDS": "1,1,1"}
#: PyTorch/XLA's knob for the ``max_inflight_computations`` create option.
MAX_INFLIGHT_ENV = "XLA_TPU_MAX_INFLIGHT_COMPUTATIONS"
DEFAULT_MAX_INFLIGHT_COMPUTATIONS = 32
#: Seconds allowed for PJRT_Plugin_Initialize (takes seconds on a TPU VM).
INITIALIZE_TIMEOUT_ENV = "PJRT_TPU_INITIALIZE_TIMEOUT"
DEFAULT_INITIALIZE_TIMEOUT_S = 120.0
#: First port of the per-process runtime servers under torchrun.
BASE_PORT_ENV = "PJRT_TPU_BASE_PORT"
#: Distributions that ship libtpu, and where the library sits in them.
LIBRARY_DISTRIBUTIONS = (("libtpu", "libtpu/libtpu.so"), ("libtpu-nightly", "libtpu/libtpu.so"))
DENSE_GATHER_FACTOR = 8192

NO_TPU_MESSAGE = (
    "no TPU chips found on this host (no PCI device of Google's vendor id 0x1ae0 with a TPU device id "
    "under /sys/bus/pci/devices), and libtpu would block for minutes looking for one. Run on a Cloud TPU VM, "
    "or choose another device (e.g. PJRT_DEVICE=CPU with pjrt-plugin-cpu installed). "
    f"If this host does have TPUs that sysfs does not show, set {SKIP_CHIP_CHECK_ENV}=1."
)


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:  # also refuses nan
        raise ValueError(text)
    return value


def _may_ask_metadata_server() -> bool:
    """Only a GCE VM with TPU chips has a metadata server worth asking; libtpu's skip switch is honoured."""
    if env_bool(SKIP_MDS_QUERY_ENV):
        return False
    return _host.on_google_compute_engine() and _host.count_tpu_chips() > 0


def _metadata_tpu_env() -> dict[str, str]:
    """The ``tpu-env`` attribute on a TPU VM (answers are cached by ``metadata_attribute``), else ``{}``."""
    text = _metadata.metadata_attribute("tpu-env") if _may_ask_metadata_server() else None
    return _metadata.parse_tpu_env(text) if text else {}


def _first_env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def default_topology_environment() -> dict[str, str]:
    """One host (:data:`SINGLE_HOST_DEFAULTS`) when the environment names no topology, else nothing.

    For libtpu without the metadata server: left without a topology, it logs placeholder errors
    ("unexpected worker hostname 'WARNING: could not determine ...'") on stderr.
    """
    if _first_env(*SINGLE_HOST_DEFAULTS, "TPU_PROCESS_BOUNDS", "TPU_ACCELERATOR_TYPE"):
        return {}
    return dict(SINGLE_HOST_DEFAULTS)


def current_slice() -> TpuSlice:
    """The slice description: environment variables first, then (on a TPU VM only) the metadata server."""
    meta = _metadata_tpu_env()
    worker_id: int | None = env_int("TPU_WORKER_ID", default=-1, minimum=0)
    if worker_id < 0:  # unset: the metadata's, if any
        worker = meta.get("WORKER_ID")
        try:
            worker_id = int(worker) if worker is not None else None
        except ValueError:
            raise PluginConfigurationError(f"the TPU metadata's WORKER_ID {worker!r} must be an integer") from None
    hostnames = _first_env("TPU_WORKER_HOSTNAMES")
    if hostnames:
        addresses = tuple(h.strip() for h in hostnames.split(",") if h.strip())
    else:
        endpoints = _metadata.metadata_attribute("worker-network-endpoints") if _may_ask_metadata_server() else None
        addresses = tuple(_metadata.parse_worker_endpoints(endpoints)) if endpoints else ()
    return TpuSlice(
        accelerator_type=_first_env("TPU_ACCELERATOR_TYPE") or meta.get("ACCELERATOR_TYPE"),
        host_bounds=_first_env("TPU_HOST_BOUNDS") or meta.get("TPU_PROCESS_BOUNDS") or meta.get("TPU_HOST_BOUNDS"),
        chips_per_host_bounds=_first_env("TPU_CHIPS_PER_HOST_BOUNDS")
        or meta.get("TPU_CHIPS_PER_PROCESS_BOUNDS")
        or meta.get("TPU_CHIPS_PER_HOST_BOUNDS"),
        worker_id=worker_id,
        worker_addresses=addresses,
    )


def _framework_version() -> str:
    try:
        return importlib.metadata.version("pjrt-plugins")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


class TpuPlugin(DevicePlugin):
    """Cloud TPUs through libtpu (from the ``libtpu`` package or ``TPU_LIBRARY_PATH``).

    One process drives every local chip (SPMD) unless a launcher starts one
    process per chip, in which case :meth:`configure_multiprocess` gives each its
    chip through libtpu's ``TPU_*`` variables, as PyTorch/XLA does.
    """

    @hookimpl
    def pjrt_library_path(self) -> str | None:
        # A TPU_LIBRARY_PATH naming no regular file raises PluginConfigurationError (find_library).
        return find_library(LIBRARY_PATH_ENV, LIBRARY_DISTRIBUTIONS)

    @hookimpl
    def pjrt_library_missing_hint(self) -> str:
        return f"run `pip install libtpu` or set {LIBRARY_PATH_ENV} to libtpu.so"

    @hookimpl
    def pjrt_client_option_schema(self) -> dict[str, Any]:
        return {"max_inflight_computations": int, "ml_framework_name": str, "ml_framework_version": str}

    @hookimpl
    def pjrt_client_create_options(self) -> dict[str, Any]:
        inflight = env_int(MAX_INFLIGHT_ENV, default=DEFAULT_MAX_INFLIGHT_COMPUTATIONS, minimum=1)
        return {
            "max_inflight_computations": inflight,
            "ml_framework_name": "pjrt-plugins",
            "ml_framework_version": _framework_version(),
        }

    @hookimpl
    def pjrt_host_index(self) -> int:
        worker_id = current_slice().worker_id
        return worker_id if worker_id is not None else 0

    @hookimpl
    def pjrt_dense_gather_factor(self) -> int:
        return DENSE_GATHER_FACTOR

    @hookimpl
    def pjrt_physical_chip_count(self) -> int:
        chips = _host.count_tpu_chips()
        bounds = _first_env("TPU_PROCESS_BOUNDS")
        if bounds:  # never start more processes than the configured slice has
            chips = min(chips, bounds_size(bounds, what="environment variable TPU_PROCESS_BOUNDS"))
        return chips

    @hookimpl
    def pjrt_configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        if _first_env("TPU_PROCESS_BOUNDS") and _first_env("TPU_VISIBLE_CHIPS"):
            logger.info("TPU topology already set in the environment; leaving it as it is")
            return
        base_port = env_int(BASE_PORT_ENV, default=DEFAULT_BASE_PORT, minimum=1)
        chips = _host.count_tpu_chips() or local_world_size
        environment = multiprocess_environment(local_rank, local_world_size, current_slice(), chips, base_port)
        for name, value in environment.items():
            os.environ.setdefault(name, value)
        logger.info("TPU process %d/%d: %s", local_rank, local_world_size, environment)

    @hookimpl
    def pjrt_priority(self) -> int:
        return 300

    @hookimpl
    def pjrt_unavailable_reason(self) -> str | None:
        if _host.count_tpu_chips() == 0 and not env_bool(SKIP_CHIP_CHECK_ENV):
            return NO_TPU_MESSAGE
        return None

    @hookimpl
    def pjrt_preflight(self) -> None:
        if _host.count_tpu_chips() == 0:
            if not env_bool(SKIP_CHIP_CHECK_ENV):
                raise PluginUnavailableError(f"plugin 'tpu': {NO_TPU_MESSAGE}")
            logger.warning("%s is set: initializing libtpu without a TPU chip in sysfs", SKIP_CHIP_CHECK_ENV)
        if not _host.on_google_compute_engine() and SKIP_MDS_QUERY_ENV not in os.environ:
            # Off GCE there is no metadata server: without this libtpu retries it for minutes.
            os.environ[SKIP_MDS_QUERY_ENV] = "1"
            logger.info("not a GCE VM: set %s=1 so libtpu reads its topology from the environment", SKIP_MDS_QUERY_ENV)
            os.environ.update(default_topology_environment())

    @hookimpl
    def pjrt_initialize_timeout(self) -> float:
        return env_value(
            INITIALIZE_TIMEOUT_ENV, _positive_seconds, default=DEFAULT_INITIALIZE_TIMEOUT_S,
            expected="a positive number of seconds",
        )
