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
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from . import _registry
from ._env import env_int
from ._timeouts import seconds_problem
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
#: Seconds a misconfigured process (a rank outside the world size) tries to reach the store to tell the job.
REPORT_TIMEOUT_S = 10.0
#: While a ``get`` waits, it looks this often for a problem another process of the job posted.
JOB_POLL_S = 1.0
#: Seconds the process hosting the store keeps it up after a problem of the job, so the others read it.
HOST_LINGER_S = 2 * JOB_POLL_S + 0.5
#: Seconds torch may take past a bound to report its own timeout before a wait on it is abandoned.
_GRACE_S = 0.5

_env_store: Any = None  # kept for the life of the process: on rank 0 it may host the server
_env_store_lock = threading.Lock()
_client_numbers: dict[str, int] = {}
_client_numbers_lock = threading.Lock()
_checked_in: dict[int, tuple[Any, str]] = {}  # id(store) -> (store, its job prefix): once per process and store
_checked_in_lock = threading.Lock()


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
    if local_world_size > world_size:
        raise DistributedSetupError(
            f"the local world size {local_world_size} (PJRT_LOCAL_PROCESS_COUNT / LOCAL_WORLD_SIZE) is larger than "
            f"the world size {world_size} (WORLD_SIZE, or the process group): a host cannot run more of the job's "
            "processes than the job has. Launch with torchrun, or set both consistently"
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
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise DistributedSetupError(f"{source} must be a finite number of seconds above 0, got {timeout!r}")
    problem = seconds_problem(float(timeout))  # the one rule for time limits, the platform's bound included
    if problem is not None:
        raise DistributedSetupError(f"{source} {problem}, got {timeout!r}")
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

        host, port = os.environ["MASTER_ADDR"].strip(), os.environ["MASTER_PORT"].strip()
        address = f"{host}:{port}"
        logger.debug("connecting to the torch.distributed store at %s (timeout %.0f s)", address, timeout)
        try:
            store = _env_rendezvous(torch.distributed, host, port, timeout)
        except TimeoutError:
            raise DistributedSetupError(
                f"cannot reach the torch.distributed store at {address} within {timeout:g} s"
                f"{_silence(host, port, _hosts_store(), os.environ['WORLD_SIZE'])}. The wait is "
                f"bounded by {STORE_TIMEOUT_ENV} (seconds) or create_client(timeout=...)"
            ) from None
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


def _env_rendezvous(dist: Any, host: str, port: str, timeout: float) -> Any:
    """torch's ``env://`` store, within ``timeout`` seconds (TimeoutError past it).

    torch bounds its own waits loosely: a client retries connecting well past the
    timeout, and a server that accepts connections but never answers blocks it for good.
    So a client first waits here for something to accept a TCP connection at the address
    (nothing of torch runs meanwhile), then lets torch connect on a thread it gives up on
    at the bound. The host (rank 0 without torchrun) waits in torch, which keeps to the bound.
    """
    deadline = time.monotonic() + timeout
    if _hosts_store():
        return next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout)))[0]
    _await_listener(host, port, deadline)
    left = _left(deadline)
    return _within(left + _GRACE_S, lambda: next(dist.rendezvous("env://", timeout=timedelta(seconds=left)))[0])



def _await_listener(host: str, port: str, deadline: float) -> None:
    """Return once something accepts a TCP connection at ``host:port``; TimeoutError at ``deadline``."""
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=max(min(_left(deadline), 2.0), 0.05)):
                return
        except (OSError, ValueError) as exc:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"nothing accepted a connection at {host}:{port}: {exc}") from None
        time.sleep(min(0.2, _left(deadline)))


def _within(timeout: float, work: Callable[[], Any]) -> Any:
    """``work()``'s result, or TimeoutError when it has not returned after ``timeout`` seconds.

    It runs on a daemon thread (torch releases the GIL while it waits on the network); a
    thread that never returns is left behind, blocked reading a socket that never answers,
    and never used. (Only for such a read: a thread left inside torch's connect loop aborts
    the process at exit, which is why a client first waits for a listener itself.)
    """
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="pjrt-plugins-store", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"no answer within {timeout:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _hosts_store() -> bool:
    """Whether this process hosts the ``env://`` store: rank 0, unless torchrun's agent hosts it."""
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").strip().lower() == "true"
    return not agent and os.environ.get("RANK", "").strip() == "0"


def _silence(host: str, port: str, hosting: bool, world_size: str) -> str:
    """Why a store did not answer, as far as a plain TCP connection can tell (to follow "within N s")."""
    if hosting:
        return (
            f", or not every one of the job's {world_size} processes joined it: this process (rank 0) hosts it. "
            "Check that every process was started, with the same MASTER_ADDR and MASTER_PORT"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=2.0):
            pass
    except (OSError, ValueError):
        return (
            ": nothing accepted a connection there. Check that rank 0 (or torchrun's agent) is running, that "
            "MASTER_ADDR/MASTER_PORT name its host and port, and that the port is open between hosts"
        )
    return (
        ": something accepts connections on that port but never answered as a torch.distributed store. Another "
        "program may hold MASTER_PORT: choose a free port (torchrun --master-port)"
    )


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

    def __init__(
        self,
        store: Any,
        *,
        prefix: str = "",
        default_timeout: float | None = None,
        max_timeout: float | None = None,
    ) -> None:
        for method in ("get", "set", "wait", "check"):
            if not callable(getattr(store, method, None)):
                raise TypeError(f"store must be a torch.distributed Store; {type(store).__name__} has no {method}()")
        self.store = store
        self.prefix = prefix
        self.default_timeout = store_timeout(default_timeout)
        #: When set, no ``get`` waits longer, whatever the plugin asks (an explicit bound the user gave).
        self.max_timeout = None if max_timeout is None else store_timeout(max_timeout)
        #: When set (a ``time.monotonic()`` value), no ``get`` waits past it (set while a client is created).
        self.deadline: float | None = None
        #: The job's check-in prefix, when this process checked in: a waiting ``get`` raises a problem posted there.
        self.job_prefix: str | None = None
        self.address = describe_store(store)
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"<TorchStoreKV {self.address} prefix={self.prefix!r}>"

    def _connection(self) -> Any:
        store = getattr(self._local, "store", None)
        if store is None:
            _refuse_dead_server(self.store, self.address)  # torch would retry a refused connect until its timeout
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
        if _is_network_error(exc) or isinstance(exc, ConnectionError):
            return ConnectionError(
                f"the torch.distributed store ({self.address}) failed during {op} of key {self.prefix + key!r}: "
                f"{_first_line(exc)}. Did the process hosting it (rank 0, or torchrun's agent on node rank 0) exit?"
            )
        return exc

    def get(self, key: str, timeout_ms: int) -> bytes:
        """Wait up to ``timeout_ms`` (the store default if not positive) for ``key``; TimeoutError names it."""
        full_key = self.prefix + key
        timeout = timeout_ms / 1000.0 if timeout_ms > 0 else self.default_timeout
        bound = ""
        if self.max_timeout is not None and self.max_timeout < timeout:
            timeout, bound = self.max_timeout, f" (bounded by {STORE_TIMEOUT_ENV} or create_client(timeout=...))"
        if self.deadline is not None and self.deadline - time.monotonic() < timeout:
            timeout = max(self.deadline - time.monotonic(), 0.001)
            bound = f" (what was left of the {STORE_TIMEOUT_ENV} bound on creating the client)"
        try:
            store = self._connection()
        except Exception as exc:
            raise self._failure("get", key, exc) from exc
        start = time.monotonic()
        deadline = start + timeout
        warn_at = start + WAIT_SLICE_S
        # While the job's check-in key is known, look for a problem another process posted between waits.
        slice_s = WAIT_SLICE_S if self.job_prefix is None else min(WAIT_SLICE_S, JOB_POLL_S)
        logger.debug("kv get %r: waiting up to %.3f s", full_key, timeout)
        while True:
            remaining = deadline - time.monotonic()
            try:
                store.wait([full_key], timedelta(seconds=max(min(remaining, slice_s), 0.001)))
                break
            except Exception as exc:
                if not _is_timeout(exc):
                    raise self._failure("get", key, exc) from exc
                if self.job_prefix is not None:
                    _check_job(store, self.job_prefix, self.address)
                waited = time.monotonic() - start
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"no value under key {key!r} (stored as {full_key!r} in the {self.address}) after "
                        f"{waited:.1f} s{bound}: the process that should publish it has not done so. Check that every "
                        f"process of the job is running and creates its client for the same plugin in the same order"
                    ) from None
                if time.monotonic() >= warn_at:
                    warn_at += WAIT_SLICE_S
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


def _refuse_dead_server(store: Any, address: str) -> None:
    """ConnectionError at once when nothing listens where ``store``'s server was (its host process exited)."""
    seen = 0
    while hasattr(store, "underlying_store") and seen < 16:
        store, seen = store.underlying_store, seen + 1
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if host is None or port is None:
        return
    try:
        with socket.create_connection((host, int(port)), timeout=5.0):
            return
    except ConnectionRefusedError:
        raise ConnectionError("it refuses connections") from None
    except (OSError, ValueError):
        return  # unreachable for another reason: torch's own connect reports it


# -- the job's processes check in ------------------------------------------------------


def _job_prefix() -> str:
    """Where this job's processes check in: per torchrun run id and restart, so a restarted job starts afresh."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "").strip() or "none"
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "").strip() or "0"
    return f"{KEY_NAMESPACE}/job/{run}/{restart}/"


def _job_failure(store: Any, prefix: str, message: str) -> DistributedSetupError:
    """Post ``message`` where the job's other processes look (best effort) and return it as the error to raise."""
    try:
        store.compare_set(prefix + "error", "", message)  # the first problem found stays
    except Exception as exc:  # noqa: BLE001 - the error below is what matters
        logger.debug("could not post the job error: %s", _first_line(exc))
    return DistributedSetupError(message)


def _check_in(store: Any, info: ProcessInfo, address: str) -> str:
    """Record this process in the job's store; returns the job's key prefix.

    Raises :class:`~pjrt_plugins.errors.DistributedSetupError` when this process's world
    size differs from the one the job's first process recorded, when its rank is already
    held by another process (two processes told one ``RANK``, or a process of another job
    on the same ``MASTER_PORT``), when more processes than ``WORLD_SIZE`` joined, or when
    another process of the job already found such a problem. The problem is posted for
    the job's other processes, which raise it too (:func:`_check_job`).
    """
    with _checked_in_lock:
        if id(store) in _checked_in:
            return _checked_in[id(store)][1]
        prefix = _job_prefix()
        me = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        try:
            _refuse_dead_server(store, address)  # fails at once, without torch's retries, when its host has exited
            _check_job(store, prefix, address)
            told = store.compare_set(prefix + "world_size", "", str(info.world_size)).decode()
            if told != str(info.world_size):
                raise _job_failure(store, prefix, (
                    f"rank {info.rank} was told WORLD_SIZE={info.world_size}, but the job using the store at {address} "
                    f"was started with WORLD_SIZE={told}: every process of a job must be told the same world size "
                    "(or a process of another job uses the same MASTER_ADDR:MASTER_PORT)"
                ))
            holder = store.compare_set(prefix + f"rank/{info.rank}", "", me).decode()
            if holder != me:
                raise _job_failure(store, prefix, (
                    f"rank {info.rank} of the job using the store at {address} is taken twice: by process {holder} "
                    f"(host:pid) and by process {me}. Two processes were told RANK={info.rank}, or a process of "
                    "another job uses the same MASTER_ADDR:MASTER_PORT; give each job its own port"
                ))
            joined = int(store.add(prefix + "joined", 1))
            if joined > info.world_size:
                raise _job_failure(store, prefix, (
                    f"{joined} processes joined the job using the store at {address}, which was told "
                    f"WORLD_SIZE={info.world_size}: start exactly WORLD_SIZE processes, each with its own RANK"
                ))
        except DistributedSetupError:
            raise
        except Exception as exc:
            why = f"{type(exc).__name__}: {_first_line(exc)}"
            if isinstance(exc, ConnectionError):
                why = f"{exc}, so the process hosting it (rank 0, or torchrun's agent on node rank 0) has exited"
            raise DistributedSetupError(f"cannot check in with the torch.distributed store at {address}: {why}") from exc
        _checked_in[id(store)] = (store, prefix)
        return prefix


def _posted_problem(store: Any, prefix: str, address: str) -> DistributedSetupError | None:
    """The problem another process of the job posted, if any (None too when the store cannot be read)."""
    try:
        if not store.check([prefix + "error"]):
            return None
        problem = bytes(store.get(prefix + "error")).decode("utf-8", "replace")
    except Exception as exc:  # noqa: BLE001 - the caller's own store operations report a broken store
        logger.debug("cannot read the job's posted problem: %s", _first_line(exc))
        return None
    return DistributedSetupError(f"the job using the store at {address} is misconfigured: {problem}")


def _check_job(store: Any, prefix: str, address: str) -> None:
    """Raise the problem another process of the job posted, if any."""
    problem = _posted_problem(store, prefix, address)
    if problem is not None:
        raise problem


def _keep_the_store_up() -> None:
    """In the process hosting the job's store, before it raises a problem of the job: keep the store up a moment.

    The job's other processes read a posted problem between waits (every :data:`JOB_POLL_S`);
    were the host to exit at once, they would see only a store that went away.
    """
    if _hosts_store():
        time.sleep(HOST_LINGER_S)


def _tell_the_job(problem: DistributedSetupError, timeout: float) -> None:
    """Best effort: post why this process cannot take part, so the job's other processes stop too.

    Only for a job of several processes started without a process group (``RANK`` /
    ``WORLD_SIZE`` by hand or by torchrun), by a process that does not host the store itself:
    the others would otherwise run on without it. Bounded by :data:`REPORT_TIMEOUT_S`.
    """
    if _initialized_torch_distributed() is not None or any(not os.environ.get(n, "").strip() for n in STORE_ENV_VARS):
        return
    if _hosts_store() or os.environ["WORLD_SIZE"].strip() in ("0", "1"):
        return  # no other process to tell, or its store would be this process's own
    try:
        import torch.distributed as dist

        host, port = os.environ["MASTER_ADDR"].strip(), int(os.environ["MASTER_PORT"])
        limit = min(timeout, REPORT_TIMEOUT_S)
        _await_listener(host, str(port), time.monotonic() + limit)
        client = _within(limit + _GRACE_S, lambda: dist.TCPStore(host, port, None, False, timeout=timedelta(seconds=limit),
                                                                  wait_for_workers=False))
        message = f"a process started with RANK={os.environ['RANK'].strip()} cannot take part: {problem}"
        _within(limit, lambda: _job_failure(client, _job_prefix(), message))
    except Exception as exc:  # noqa: BLE001 - the process's own error is raised anyway
        logger.debug("could not tell the job why this process cannot take part: %s", _first_line(exc))


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
    join) and any ``get`` for which the plugin gives no timeout of its own. When you
    give the bound (the argument or the variable), it bounds the whole creation too:
    reaching the store, then every ``get`` of the plugin, share it, whatever timeout the
    plugin asks for. A peer that never joins is a
    :class:`~pjrt_plugins.errors.DistributedSetupError`; one that never publishes its key
    makes the plugin's ``get`` fail with ``DEADLINE_EXCEEDED`` (a
    :class:`~pjrt_plugins.PjrtError` naming the key), never a hang.

    With the job's own store (``store=None``), each process checks in with the job
    first: a process told another ``WORLD_SIZE``, a second process with the same
    ``RANK`` (or a process of another job on the same ``MASTER_PORT``), or more
    processes than ``WORLD_SIZE`` are a ``DistributedSetupError`` naming the mismatch,
    in that process and, once it is posted in the store, in the job's other processes
    as they create their clients.
    """
    explicit = timeout is not None or bool(os.environ.get(STORE_TIMEOUT_ENV, "").strip())
    timeout = store_timeout(timeout)
    deadline = time.monotonic() + timeout
    plugin = _resolve_plugin(plugin)
    name = plugin.name or type(plugin).__name__.lower()
    try:
        info = process_info(plugin)
    except DistributedSetupError as problem:
        _tell_the_job(problem, timeout)  # the job's other processes must not run on without this one
        raise
    merged = dict(options or {})
    schema = plugin.option_schema() or {}
    for option, value in (("node_id", info.rank), ("num_nodes", info.world_size)):
        if option in schema and option not in merged:
            merged[option] = value

    kv: TorchStoreKV | None = None
    if store is not None or (info.is_multiprocess and (plugin.requires_coordinator() or "num_nodes" in schema)):
        prefix = namespace if namespace is not None else _next_namespace(name)
        if store is None:
            import torch.distributed  # noqa: F401 - imported before the bound starts: loading is not waiting

            deadline = time.monotonic() + timeout
        base = store if store is not None else default_store(timeout)
        kv = TorchStoreKV(base, prefix=prefix, default_timeout=timeout, max_timeout=timeout if explicit else None)
        if store is None and info.is_multiprocess:  # the job's own store (a store you pass is yours to manage)
            try:
                kv.job_prefix = _check_in(base, info, kv.address)
            except DistributedSetupError:
                _keep_the_store_up()
                raise
        if explicit:
            kv.deadline = deadline
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
        client = plugin.create_client(merged, configure=configure, kv_store=kv)
    except PjrtError as error:
        posted = _posted_problem(kv.store, kv.job_prefix, kv.address) if kv is not None and kv.job_prefix else None
        if posted is not None:  # a problem another process posted explains the plugin's failure
            _keep_the_store_up()
            raise posted from error
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
    if kv is not None:
        kv.deadline = None  # later gets (the plugin's own) are bounded one by one again
        if kv.job_prefix is not None:
            try:
                _check_job(kv.store, kv.job_prefix, kv.address)
            except BaseException:
                client.close()
                _keep_the_store_up()
                raise
    return client


def _left(deadline: float) -> float:
    """Seconds until ``deadline`` (a little above zero at least, so a bound is never turned off)."""
    return max(deadline - time.monotonic(), 0.001)
