"""CheckpointManager: numbered checkpoints of a training run in one directory, saved every N steps.

PyTorch/XLA's manager API over torch.distributed.checkpoint with the SPMD planners: asynchronous
saves from a host snapshot, the last K kept, any tracked step restored, a checkpoint on SIGTERM.
A checkpoint counts only once its marker file is written, after all its data: a process killed
while saving leaves a directory that is ignored (with a warning), never half a checkpoint.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import posixpath
import signal
import threading
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from fsspec.core import url_to_fs
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.utils._pytree import tree_leaves

from ...errors import CheckpointError
from ._planners import SPMDLoadPlanner, SPMDSavePlanner
from ._tiles import is_pjrt, prepare, snapshot_state_dict

logger = logging.getLogger(__name__)

__all__ = ["CheckpointManager"]

#: The marker file in each checkpoint directory: JSON ``{"step": int, "ts": ISO time}``, written last.
_MANAGER_METADATA_FILE = ".manager_metadata"


@dataclass(frozen=True)
class _CheckpointMetadata:
    step: int
    ts: datetime


# -- preemption: the first SIGTERM asks for a checkpoint ---------------------------------------

_preempted = threading.Event()
_sigterm_lock = threading.Lock()
_sigterm_previous: Any = None
_sigterm_installed = False


def _on_sigterm(signum: int, frame: Any) -> None:
    if _preempted.is_set():  # asked twice: stop as the process would have without us
        signal.signal(signal.SIGTERM, _sigterm_previous if _sigterm_previous is not None else signal.SIG_DFL)
        signal.raise_signal(signal.SIGTERM)
        return
    _preempted.set()
    logger.warning("SIGTERM received: the CheckpointManager saves at the next step (a second SIGTERM stops at once)")


def _watch_sigterm() -> bool:
    """Catch SIGTERM as a preemption notice (once per process); False where signals cannot be set (not the
    main thread)."""
    global _sigterm_previous, _sigterm_installed
    with _sigterm_lock:
        if _sigterm_installed:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        _sigterm_previous = signal.signal(signal.SIGTERM, _on_sigterm)
        _sigterm_installed = True
        return True


def _quiet_single_process_notice() -> None:
    """Silence dcp's warning that it saves and loads in a single process: without a process group that is
    what the manager means (a filter, not ``catch_warnings``: saves run on a background thread)."""
    warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled, unavailable or uninitialized, "
                            r"assuming the intent is to (save|load) in a single process", category=UserWarning)


def _positive(name: str, value: Any, *, zero_ok: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero_ok else 1):
        raise ValueError(f"{name} must be an integer {'>= 0' if zero_ok else '> 0'}, got {value!r}")
    return value


class CheckpointManager:
    """Take and track numbered checkpoints of a training run under ``path`` (PyTorch/XLA's CheckpointManager).

    Each checkpoint is a ``torch.distributed.checkpoint`` directory ``path/<step>``, written
    with :class:`SPMDSavePlanner` (each distinct tile once, no whole sharded tensor on a host)
    and read back with :class:`SPMDLoadPlanner` (into any mesh and sharding). Call
    :meth:`save` or :meth:`save_async` every step: they save when ``step`` is a multiple of
    ``save_interval`` (or ``force=True``, or after a SIGTERM), and keep the ``max_to_keep``
    newest (0: all). ``path`` is a local directory or an fsspec URL.

    Without a process group (one process owning the whole mesh, the usual case for the
    ``pjrt`` device) no ``torch.distributed`` setup is needed (and dcp's warning that it works
    in a single process is silenced). With one (``dist`` initialized),
    every process of the group must make the same calls; each writes the tiles its devices hold,
    a tile several processes hold is written once, rank 0 writes the marker and deletes old
    checkpoints, and ``path`` must be storage every process sees.

    ``chkpt_on_preemption`` (default, as in PyTorch/XLA): the first SIGTERM the process receives
    is a request: the next :meth:`save` or :meth:`save_async` saves whatever the step and
    :meth:`reached_preemption` turns True, so the loop can stop; a second SIGTERM stops the
    process at once. Set it to False to leave SIGTERM alone.

    Example::

        mgr = CheckpointManager("runs/exp1", save_interval=100, max_to_keep=3)
        if mgr.all_steps():                     # resume
            step = max(mgr.all_steps())
            prime_optimizer(optim)
            state = {"model": model.state_dict(), "optim": optim.state_dict()}
            mgr.restore(step, state)
            model.load_state_dict(state["model"]); optim.load_state_dict(state["optim"])
        for step in range(start, steps):
            ...train...
            mgr.save_async(step, {"model": model.state_dict(), "optim": optim.state_dict()})
        mgr.join()
    """

    def __init__(
        self,
        path: str | os.PathLike,
        save_interval: int,
        max_to_keep: int | None = 0,
        max_pending_async: int | None = 1,
        num_of_threads: int | None = 1,
        process_group: dist.ProcessGroup | None = None,
        chkpt_on_preemption: bool = True,
    ) -> None:
        """``max_pending_async``: how many asynchronous saves may wait or run before ``save_async`` blocks;
        ``num_of_threads``: threads writing each checkpoint's files; ``process_group``: the group that
        saves together (default: a new group of all processes when ``torch.distributed`` is initialized)."""
        self.save_interval = _positive("save_interval", save_interval)
        self.max_to_keep = _positive("max_to_keep", 0 if max_to_keep is None else max_to_keep, zero_ok=True)
        pending = _positive("max_pending_async", 1 if max_pending_async is None else max_pending_async)
        self.num_of_threads = _positive("num_of_threads", 1 if num_of_threads is None else num_of_threads)
        self.chkpt_on_preemption = bool(chkpt_on_preemption)
        self.base_path = os.fspath(path)
        self._fs, self._root = url_to_fs(self.base_path)
        self._root = self._root.rstrip("/") or "/"
        distributed = dist.is_available() and dist.is_initialized()
        if process_group is not None and not distributed:
            raise CheckpointError("a process_group was given but torch.distributed is not initialized")
        self.pg: dist.ProcessGroup | None = (process_group or dist.new_group()) if distributed else None
        if self.pg is None:
            _quiet_single_process_notice()
        self._preemption_pg = None
        if self.chkpt_on_preemption and self.pg is not None and dist.get_world_size(self.pg) > 1:
            # Every process must agree on the step; asked on a group of its own (saves may use self.pg meanwhile).
            self._preemption_pg = dist.new_group(backend="gloo")
        if self.chkpt_on_preemption and not _watch_sigterm():
            logger.warning("CheckpointManager made outside the main thread cannot catch SIGTERM: "
                           "no checkpoint on preemption")
            self.chkpt_on_preemption = False

        self._async_worker_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pjrt-checkpoint")
        self._async_sem = threading.Semaphore(pending)
        self._async_futures: list[tuple[int, Future]] = []
        self._save_mutex = threading.Lock()  # one checkpoint written at a time
        self._tracked_lock = threading.Lock()  # the background writer and the caller both read the tracked list
        self._tracked_chkpts = self._load_tracked_chkpts()

    # -- where checkpoints are ----------------------------------------------------------------

    def _get_path(self, step: int) -> str:
        """The checkpoint directory of ``step`` as the filesystem object names it (no protocol)."""
        return posixpath.join(self._root, str(step))

    def _url(self, step: int) -> str:
        """The checkpoint directory of ``step`` with its protocol (``file:///...``, ``gs://...``), for dcp."""
        return str(self._fs.unstrip_protocol(self._get_path(step)))

    def _is_rank0(self) -> bool:
        return self.pg is None or dist.get_rank(self.pg) == 0

    def _load_tracked_chkpts(self) -> deque[_CheckpointMetadata]:
        """The complete checkpoints under the base path, oldest first; warns about the incomplete ones."""
        found: list[_CheckpointMetadata] = []
        invalid: list[str] = []
        if not self._fs.exists(self._root):
            self._fs.makedirs(self._root, exist_ok=True)
            return deque()
        if not self._fs.isdir(self._root):
            raise CheckpointError(f"{self.base_path} is a file; give the CheckpointManager a directory")
        for entry in self._fs.ls(self._root, detail=True):
            if entry.get("type") != "directory":
                continue
            name = entry["name"].rstrip("/")
            try:
                with self._fs.open(posixpath.join(name, _MANAGER_METADATA_FILE), "r") as f:
                    record = json.load(f)
                meta = _CheckpointMetadata(int(record["step"]), datetime.fromisoformat(record["ts"]))
                if posixpath.basename(name) != str(meta.step):
                    raise ValueError(f"directory {name} holds step {meta.step}")
            except (OSError, ValueError, KeyError, TypeError):
                invalid.append(name)
                continue
            found.append(meta)
        if invalid:
            logger.warning("ignoring %d incomplete or foreign checkpoint director%s under %s: %s", len(invalid),
                           "y" if len(invalid) == 1 else "ies", self.base_path, sorted(invalid))
        return deque(sorted(found, key=lambda m: m.ts))

    def _delete_chkpt_at_step(self, step: int) -> None:
        with self._tracked_lock:
            self._tracked_chkpts = deque(m for m in self._tracked_chkpts if m.step != step)
        if not self._is_rank0():
            return
        path = self._get_path(step)
        marker = posixpath.join(path, _MANAGER_METADATA_FILE)
        if self._fs.exists(marker):
            self._fs.rm(marker)  # first: a deletion cut short leaves an ignored directory, not a broken checkpoint
        if self._fs.exists(path):
            self._fs.rm(path, recursive=True)

    def _release_oldest_checkpoints(self) -> None:
        """Delete the oldest checkpoints (by time taken, not step) until at most ``max_to_keep`` remain."""
        if self.max_to_keep > 0:
            while len(self._tracked_chkpts) > self.max_to_keep:
                with self._tracked_lock:
                    oldest = self._tracked_chkpts[0].step
                self._delete_chkpt_at_step(oldest)

    def _write_marker(self, path: str, meta: _CheckpointMetadata) -> None:
        marker = posixpath.join(path, _MANAGER_METADATA_FILE)
        partial = marker + ".partial"
        with self._fs.open(partial, "w") as f:
            json.dump({"step": meta.step, "ts": meta.ts.isoformat()}, f)
        self._fs.mv(partial, marker)

    # -- saving --------------------------------------------------------------------------------

    def _save(self, step: int, state_dict: Any) -> None:
        """Write one checkpoint (the caller made the state dict's values ready) and track it."""
        with self._save_mutex:
            path = self._get_path(step)
            self._delete_chkpt_at_step(step)
            dcp.save(
                state_dict,
                storage_writer=FsspecWriter(self._url(step), thread_count=self.num_of_threads, per_thread_copy_ahead=0),
                planner=SPMDSavePlanner(),
                process_group=self.pg,
                no_dist=self.pg is None,
            )
            meta = _CheckpointMetadata(step=step, ts=datetime.now(timezone.utc))
            if self._is_rank0():
                self._write_marker(path, meta)
            with self._tracked_lock:
                self._tracked_chkpts.append(meta)
            self._release_oldest_checkpoints()
            logger.info("saved checkpoint of step %d to %s", step, path)

    def _raise_failed_saves(self) -> None:
        """Re-raise the first asynchronous save that failed since the last call (and forget finished ones)."""
        failed = None
        still = []
        for step, future in self._async_futures:
            if not future.done():
                still.append((step, future))
            elif failed is None and future.exception() is not None:
                failed = (step, future.exception())
        self._async_futures = still
        if failed is not None:
            step, error = failed
            raise CheckpointError(f"the asynchronous save of step {step} failed: {error}") from error

    def should_save(self, step: int) -> bool:
        """True if ``step`` is a multiple of ``save_interval``, or a preemption was noticed."""
        preempted = self.chkpt_on_preemption and self.reached_preemption(step)
        if preempted:
            logger.warning("preemption noticed at step %d: taking a checkpoint", step)
        return step % self.save_interval == 0 or preempted

    def save(self, step: int, state_dict: Any, force: bool | None = False) -> bool:
        """Save ``state_dict`` now if :meth:`should_save` (or ``force``); returns whether it saved.

        Training waits until the checkpoint is written; see :meth:`save_async`.
        """
        if not (self.should_save(step) or force):
            return False
        self._raise_failed_saves()
        self._wait_for_data(state_dict)
        self._save(step, state_dict)
        return True

    def save_async(self, step: int, state_dict: Any, force: bool | None = False) -> bool:
        """Like :meth:`save`, but written on a background thread while training goes on; returns whether it saves.

        The values are copied to the host first (each distinct tile once), so later steps
        cannot change what is written. Blocks while ``max_pending_async`` saves are pending;
        an error of a background save is raised by the next call (or :meth:`join`).
        """
        if not (self.should_save(step) or force):
            return False
        self._raise_failed_saves()
        snapshot = snapshot_state_dict(state_dict)
        self._async_sem.acquire()
        try:
            future = self._async_worker_pool.submit(self._save, step, snapshot)
        except BaseException:
            self._async_sem.release()
            raise
        future.add_done_callback(functools.partial(self._async_done, step))
        self._async_futures.append((step, future))
        return True

    def _async_done(self, step: int, future: Future) -> None:
        self._async_sem.release()
        error = future.exception()
        if error is not None:
            logger.error("the asynchronous save of step %d failed: %s", step, error)

    @staticmethod
    def _wait_for_data(state_dict: Any) -> None:
        prepare([v for v in tree_leaves(state_dict) if is_pjrt(v)])

    def join(self) -> None:
        """Wait for the pending asynchronous saves; raises :class:`CheckpointError` if one failed."""
        wait([future for _, future in self._async_futures])
        self._raise_failed_saves()

    # -- restoring and listing -------------------------------------------------------------------

    def restore(self, step: int, state_dict: Any) -> None:
        """Load the checkpoint of ``step`` into ``state_dict``, in place (tensors keep their device and sharding).

        Then call ``model.load_state_dict`` / ``optimizer.load_state_dict`` for the values
        that are not tensors. Raises :class:`CheckpointError` for an untracked step and
        :class:`CheckpointMismatchError` when the checkpoint does not fit ``state_dict``.
        """
        tracked = self.all_steps()
        if step not in tracked:
            raise CheckpointError(
                f"cannot restore step {step}: the checkpoints under {self.base_path} are of steps {tracked}"
                if tracked else f"cannot restore step {step}: there is no complete checkpoint under {self.base_path}")
        try:
            dcp.load(
                state_dict,
                storage_reader=FsspecReader(self._url(step)),
                planner=SPMDLoadPlanner(),
                process_group=self.pg,
                no_dist=self.pg is None,
            )
        except dcp.CheckpointException as error:
            ours = [exc for exc, _ in error.failures.values() if isinstance(exc, CheckpointError)]
            if ours:
                raise ours[0] from error
            raise

    def all_steps(self) -> list[int]:
        """The steps of the tracked (complete) checkpoints, ascending; ``max(all_steps())`` is the latest."""
        with self._tracked_lock:
            return sorted(m.step for m in self._tracked_chkpts)

    def reached_preemption(self, step: int) -> bool:
        """True once a SIGTERM was received (by any process of the group), from that step on."""
        if not self.chkpt_on_preemption:
            raise CheckpointError("preemption detection is off: create the CheckpointManager with "
                                  "chkpt_on_preemption=True")
        if self._preemption_pg is None:
            return _preempted.is_set()
        flag = torch.tensor([1 if _preempted.is_set() else 0])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._preemption_pg)
        return bool(flag.item())
