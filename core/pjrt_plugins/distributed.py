"""Multi-process PJRT clients: the plugin's key-value store carried by torch.distributed's store.

Under ``torchrun`` the processes of a job already share a ``TCPStore`` (``MASTER_ADDR`` /
``MASTER_PORT``); this module lends it to the plugin. It never runs a store or a launcher of
its own, and never imports torch until a multi-process client actually needs the store.

Typical use, in every process of a ``torchrun --nproc-per-node N`` job::

    from pjrt_plugins import distributed
    client = distributed.create_client("stub_neuron")
    client.addressable_devices  # this process's own devices; client.devices lists the job's
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import _registry
from ._env import env_int
from .errors import DistributedSetupError, PjrtError

if TYPE_CHECKING:  # pragma: no cover
    from ._plugin import DevicePlugin
    from .runtime import Client

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_STORE_TIMEOUT_S",
    "KEY_NAMESPACE",
    "ProcessInfo",
    "STORE_TIMEOUT_ENV",
    "TorchStoreKV",
    "create_client",
    "default_store",
    "describe_store",
    "process_info",
    "store_timeout",
]

#: Seconds allowed to reach the store (and for every peer to join it), and for a ``get`` whose
#: plugin gives no timeout, unless ``STORE_TIMEOUT_ENV`` or a ``timeout`` argument says otherwise.
DEFAULT_STORE_TIMEOUT_S = 300.0
#: Environment variable overriding :data:`DEFAULT_STORE_TIMEOUT_S` (seconds, a positive number).
STORE_TIMEOUT_ENV = "PJRT_PLUGINS_STORE_TIMEOUT"
#: Every key a plugin writes lands under ``KEY_NAMESPACE/<plugin>/<client number>/``.
KEY_NAMESPACE = "pjrt_plugins"
#: A blocking ``get`` waits in slices this long and logs a warning after each one,
#: so a job that hangs on a missing peer says which key it waits for.
WAIT_SLICE_S = 30.0
#: The torchrun variables an ``env://`` store needs.
STORE_ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")

_env_store: Any = None  # kept for the life of the process: on rank 0 it may host the server
_env_store_lock = threading.Lock()
_client_numbers: dict[str, int] = {}
_client_numbers_lock = threading.Lock()


# -- where this process stands ---------------------------------------------------------


@dataclass(frozen=True)
class ProcessInfo:
    """This process's place in the job.

    ``rank`` / ``world_size`` count every process of the job (torch.distributed's
    values when its process group is initialized, else ``RANK`` / ``WORLD_SIZE``);
    ``local_rank`` / ``local_world_size`` / ``host_index`` come from the plugin's hooks
    (``PJRT_LOCAL_PROCESS_RANK`` over ``LOCAL_RANK``, ``PJRT_LOCAL_PROCESS_COUNT`` over
    ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, unless the backend knows better).
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    host_index: int

    @property
    def is_multiprocess(self) -> bool:
        return self.world_size > 1


def _initialized_torch_distributed() -> Any:
    """``torch.distributed`` if this process already initialized its default process group, else None.

    Never imports torch: a process that has not imported it has no process group.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    try:
        return dist if dist.is_available() and dist.is_initialized() else None
    except Exception:  # noqa: BLE001 - a half-imported torch is "no process group"
        return None


def process_info(plugin: DevicePlugin | str | None = None) -> ProcessInfo:
    """Ranks and sizes of this process for ``plugin`` (default: the default plugin).

    Raises :class:`~pjrt_plugins.errors.DistributedSetupError` when the values
    contradict each other (a rank outside the world size).
    """
    plugin = _resolve_plugin(plugin)
    local_rank = plugin.local_process_rank()
    local_world_size = plugin.local_world_size()
    dist = _initialized_torch_distributed()
    if dist is not None:
        rank, world_size = int(dist.get_rank()), int(dist.get_world_size())
    else:
        rank = env_int("RANK", default=local_rank)
        world_size = env_int("WORLD_SIZE", default=local_world_size)
    if local_world_size < 1 or not 0 <= local_rank < local_world_size:
        raise DistributedSetupError(
            f"local rank {local_rank} is outside the local world size {local_world_size} "
            "(PJRT_LOCAL_PROCESS_RANK / LOCAL_RANK and PJRT_LOCAL_PROCESS_COUNT / LOCAL_WORLD_SIZE)"
        )
    if world_size < 1 or not 0 <= rank < world_size:
        raise DistributedSetupError(
            f"rank {rank} is outside the world size {world_size} (RANK / WORLD_SIZE, or the process group); "
            "launch with torchrun or set both consistently"
        )
    return ProcessInfo(rank, world_size, local_rank, local_world_size, plugin.host_index())


# -- the store -------------------------------------------------------------------------


def store_timeout(timeout: float | None = None) -> float:
    """``timeout`` if given, else ``$PJRT_PLUGINS_STORE_TIMEOUT``, else :data:`DEFAULT_STORE_TIMEOUT_S`.

    Raises :class:`~pjrt_plugins.errors.DistributedSetupError` for a value that is not a
    finite positive number of seconds (naming the variable when it came from there).
    """
    source = "the timeout argument"
    if timeout is None:
        raw = os.environ.get(STORE_TIMEOUT_ENV, "").strip()
        if not raw:
            return DEFAULT_STORE_TIMEOUT_S
        source = f"{STORE_TIMEOUT_ENV}={raw!r}"
        try:
            timeout = float(raw)
        except ValueError:
            timeout = math.nan
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise DistributedSetupError(f"{source} must be a finite number of seconds > 0, got {timeout!r}")
    return float(timeout)


def default_store(timeout: float | None = None) -> Any:
    """torch.distributed's store for this job.

    The default process group's store when ``torch.distributed.init_process_group``
    has run; otherwise the ``env://`` store of ``MASTER_ADDR`` / ``MASTER_PORT``
    (under torchrun a client of the agent's ``TCPStore``; without torchrun rank 0
    hosts it and waits there for every process of the job), created once per process.
    ``timeout`` (default: :func:`store_timeout`) bounds reaching it.
    """
    global _env_store
    timeout = store_timeout(timeout)
    dist = _initialized_torch_distributed()
    if dist is not None:
        return dist.distributed_c10d._get_default_store()
    with _env_store_lock:
        if _env_store is not None:
            return _env_store
        missing = [name for name in STORE_ENV_VARS if not os.environ.get(name, "").strip()]
        if missing:
            raise DistributedSetupError(
                f"no torch.distributed store to carry the PJRT key-value exchange: {', '.join(missing)} "
                "not set. Launch with torchrun (it sets MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE), call "
                "torch.distributed.init_process_group() first, or pass store= explicitly"
            )
        import torch.distributed  # lazy: only a multi-process client needs torch

        address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        logger.debug("connecting to the torch.distributed store at %s (timeout %.0f s)", address, timeout)
        try:
            store, _rank, _world = next(torch.distributed.rendezvous("env://", timeout=timedelta(seconds=timeout)))
        except Exception as exc:
            raise DistributedSetupError(
                f"cannot reach the torch.distributed store at {address} within {timeout:g} s, or not every one "
                f"of the job's {os.environ['WORLD_SIZE']} processes joined it: {type(exc).__name__}: "
                f"{_first_line(exc)}. Check that every process was started, that MASTER_ADDR/MASTER_PORT name the "
                "host and port of rank 0 (torchrun --master-addr/--master-port) and that the port is open between "
                f"hosts. The wait is bounded by {STORE_TIMEOUT_ENV} (seconds) or create_client(timeout=...)"
            ) from exc
        _env_store = store
        return store


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's text (torch appends C++ stack traces), without its final period."""
    text = str(exc).strip()
    return text.splitlines()[0].rstrip(".") if text else type(exc).__name__


def describe_store(store: Any) -> str:
    """``"TCPStore at host:port"`` (looking through PrefixStores), else the store's type."""
    seen = 0
    while hasattr(store, "underlying_store") and seen < 16:
        store, seen = store.underlying_store, seen + 1
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if host is not None and port is not None:
        return f"{type(store).__name__} at {host}:{port}"
    return type(store).__name__


def _is_timeout(exc: BaseException) -> bool:
    """A store wait that ran out of time (torch raises DistStoreError 'wait timeout ...')."""
    if isinstance(exc, TimeoutError):
        return True
    dist = sys.modules.get("torch.distributed")
    store_error = getattr(dist, "DistStoreError", None)
    return store_error is not None and isinstance(exc, store_error) and "timeout" in str(exc).lower()


def _is_network_error(exc: BaseException) -> bool:
    dist = sys.modules.get("torch.distributed")
    network_error = getattr(dist, "DistNetworkError", None)
    return network_error is not None and isinstance(exc, network_error)


class TorchStoreKV:
    """The ``kv_store`` protocol of :class:`pjrt_plugins.runtime.Client` over a torch.distributed store.

    Every key is stored as ``prefix + key``. Each thread gets its own connection
    (``store.clone()``): a TCPStore client serves one request at a time, so a
    ``get`` blocked on one thread would otherwise hold up a ``put`` on another
    until it timed out. Failures are Python exceptions (``TimeoutError``,
    ``ConnectionError``); the runtime turns them into the plugin's errors.
    """

    def __init__(self, store: Any, *, prefix: str = "", default_timeout: float | None = None) -> None:
        for method in ("get", "set", "wait", "check"):
            if not callable(getattr(store, method, None)):
                raise TypeError(f"store must be a torch.distributed Store; {type(store).__name__} has no {method}()")
        self.store = store
        self.prefix = prefix
        self.default_timeout = store_timeout(default_timeout)
        self.address = describe_store(store)
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"<TorchStoreKV {self.address} prefix={self.prefix!r}>"

    def _connection(self) -> Any:
        store = getattr(self._local, "store", None)
        if store is None:
            try:
                store = self.store.clone()
            except Exception as exc:
                if _is_network_error(exc):  # the server is unreachable: that is the error to report
                    raise
                # A store without clone() (a Python subclass) is shared between threads, with the risk above.
                logger.debug("%s cannot be cloned (%s); sharing one connection between threads", self.address, exc)
                store = self.store
            self._local.store = store
        return store

    def _failure(self, op: str, key: str, exc: BaseException) -> BaseException:
        if _is_network_error(exc):
            return ConnectionError(
                f"the torch.distributed store ({self.address}) failed during {op} of key {self.prefix + key!r}: "
                f"{_first_line(exc)}. Did the process hosting it (torchrun's agent on node rank 0) exit?"
            )
        return exc

    def get(self, key: str, timeout_ms: int) -> bytes:
        """Wait up to ``timeout_ms`` (the store default if not positive) for ``key``; TimeoutError names it."""
        full_key = self.prefix + key
        timeout = timeout_ms / 1000.0 if timeout_ms > 0 else self.default_timeout
        try:
            store = self._connection()
        except Exception as exc:
            raise self._failure("get", key, exc) from exc
        start = time.monotonic()
        deadline = start + timeout
        logger.debug("kv get %r: waiting up to %.3f s", full_key, timeout)
        while True:
            remaining = deadline - time.monotonic()
            try:
                store.wait([full_key], timedelta(seconds=max(min(remaining, WAIT_SLICE_S), 0.001)))
                break
            except Exception as exc:
                if not _is_timeout(exc):
                    raise self._failure("get", key, exc) from exc
                waited = time.monotonic() - start
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"no value under key {key!r} (stored as {full_key!r} in the {self.address}) after "
                        f"{waited:.1f} s: the process that should publish it has not done so. Check that every "
                        f"process of the job is running and creates its client for the same plugin in the same order"
                    ) from None
                logger.warning(
                    "still waiting for key %r in the %s after %.0f s (gives up after %.0f s)",
                    full_key, self.address, waited, timeout,
                )
        try:
            value = store.get(full_key)
        except Exception as exc:
            raise self._failure("get", key, exc) from exc
        logger.debug("kv get %r: %d bytes after %.3f s", full_key, len(value), time.monotonic() - start)
        return bytes(value)

    def try_get(self, key: str) -> bytes | None:
        """The value under ``key`` now, or ``None``."""
        full_key = self.prefix + key
        try:
            store = self._connection()
            if not store.check([full_key]):
                logger.debug("kv try_get %r: absent", full_key)
                return None
            value = store.get(full_key)
        except Exception as exc:
            raise self._failure("try_get", key, exc) from exc
        logger.debug("kv try_get %r: %d bytes", full_key, len(value))
        return bytes(value)

    def put(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key`` (visible to every process of the job)."""
        full_key = self.prefix + key
        try:
            self._connection().set(full_key, bytes(value))
        except Exception as exc:
            raise self._failure("put", key, exc) from exc
        logger.debug("kv put %r: %d bytes", full_key, len(value))


# -- clients ---------------------------------------------------------------------------


def _resolve_plugin(plugin: DevicePlugin | str | None) -> DevicePlugin:
    if plugin is None:
        return _registry.default_plugin()
    if isinstance(plugin, str):
        return _registry.get_plugin(plugin)
    return plugin


def _next_namespace(plugin_name: str) -> str:
    """``pjrt_plugins/<plugin>/<n>/`` for this process's n-th client of the plugin (0, 1, ...)."""
    with _client_numbers_lock:
        number = _client_numbers.get(plugin_name, 0)
        _client_numbers[plugin_name] = number + 1
    return f"{KEY_NAMESPACE}/{plugin_name}/{number}/"


def create_client(
    plugin: DevicePlugin | str | None = None,
    options: Mapping[str, Any] | None = None,
    *,
    store: Any = None,
    namespace: str | None = None,
    timeout: float | None = None,
    configure: bool = True,
) -> Client:
    """Create ``plugin``'s client for this process of a multi-process job.

    ``plugin`` is a DevicePlugin, a registered name, or ``None`` for the default
    plugin. In a job of more than one process (``WORLD_SIZE`` > 1, or an initialized
    process group), when the plugin needs a coordinator or its option schema has
    ``num_nodes``, its KV callbacks are carried by ``store`` (default:
    :func:`default_store`) under the keys ``pjrt_plugins/<plugin>/<n>/...``, where
    ``n`` counts this process's clients of that plugin, so every process must create
    its clients in the same order. Other plugins (cpu) get independent clients.

    The options ``node_id`` (global rank) and ``num_nodes`` (world size) are added
    when the plugin's schema has them and ``options`` does not set them. As with
    :meth:`DevicePlugin.create_client`, ``configure_multiprocess`` runs first
    (``configure=True``), so each process gets its own device.

    ``timeout`` (seconds; default ``$PJRT_PLUGINS_STORE_TIMEOUT``, else 300) bounds
    reaching the store (without torchrun, rank 0 waits that long for every process to
    join) and any ``get`` for which the plugin gives no timeout of its own. A peer that
    never joins is a :class:`~pjrt_plugins.errors.DistributedSetupError`; one that never
    publishes its key makes the plugin's ``get`` fail with ``DEADLINE_EXCEEDED`` (a
    :class:`~pjrt_plugins.PjrtError` naming the key), never a hang.
    """
    timeout = store_timeout(timeout)
    plugin = _resolve_plugin(plugin)
    name = plugin.name or type(plugin).__name__.lower()
    info = process_info(plugin)
    merged = dict(options or {})
    schema = plugin.option_schema() or {}
    for option, value in (("node_id", info.rank), ("num_nodes", info.world_size)):
        if option in schema and option not in merged:
            merged[option] = value

    kv: TorchStoreKV | None = None
    if store is not None or (info.is_multiprocess and (plugin.requires_coordinator() or "num_nodes" in schema)):
        prefix = namespace if namespace is not None else _next_namespace(name)
        base = store if store is not None else default_store(timeout)
        kv = TorchStoreKV(base, prefix=prefix, default_timeout=timeout)
        logger.info(
            "plugin %s: rank %d of %d (host %d, local rank %d of %d), KV keys under %r in the %s",
            name, info.rank, info.world_size, info.host_index, info.local_rank, info.local_world_size,
            prefix, kv.address,
        )
    else:
        logger.info(
            "plugin %s: rank %d of %d (host %d, local rank %d of %d), independent client (no KV store)",
            name, info.rank, info.world_size, info.host_index, info.local_rank, info.local_world_size,
        )
    try:
        return plugin.create_client(merged, configure=configure, kv_store=kv)
    except PjrtError as error:
        if kv is None or error.hint is not None or error.code_name != "DEADLINE_EXCEEDED":
            raise
        hint = (
            f"a peer did not publish its key in time. Check that all {info.world_size} processes are running "
            f"and create their {name!r} client with pjrt_plugins.distributed in the same order, and that they share "
            f"one store ({kv.address}); enable logging for {__name__} (DEBUG) to see every key read and written."
        )
        raise PjrtError(error.code, error.message, function=error.function, hint=hint).with_traceback(
            error.__traceback__
        ) from None
