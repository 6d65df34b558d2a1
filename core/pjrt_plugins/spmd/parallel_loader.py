"""Data loaders that upload batches on a background thread, sharded (PyTorch/XLA's
``torch_xla.distributed.parallel_loader``: ``MpDeviceLoader``, ``ParallelLoader``).

Port: ``from torch_xla.distributed.parallel_loader import MpDeviceLoader`` becomes
``from pjrt_plugins.spmd.parallel_loader import MpDeviceLoader``. Uploading is the frontend's
``send_cpu_data_to_device``; this module only runs it ahead of the training loop.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from .frontend import InputSharding, check_input_sharding, check_torch_device, loaded_engine, send_cpu_data_to_device

logger = logging.getLogger(__name__)

__all__ = ["MpDeviceLoader", "ParallelLoader", "PerDeviceLoader"]

#: Put in the queue after the last batch (or after the error that stopped loading).
_END = object()


class PerDeviceLoader:
    """The iterator :meth:`ParallelLoader.per_device_loader` returns: batches already on the device.

    As in PyTorch/XLA, taking a batch first runs the pending step (``xs.sync()``, every
    ``batches_per_execution`` batches), so a training loop over it needs no ``sync()`` of its own.
    """

    def __init__(self, loader: ParallelLoader, device: torch.device) -> None:
        self._loader = loader
        self._device = device
        self._sync_after = loader.batches_per_execution - 1
        self._yielded = 0

    def __iter__(self) -> PerDeviceLoader:
        return self

    def __next__(self) -> Any:
        return self.next()

    def __len__(self) -> int:
        return self._loader.per_device_samples()

    def __del__(self) -> None:
        # An abandoned loop (a break) must not leave the loading thread waiting for a reader.
        loader = getattr(self, "_loader", None)
        if loader is not None:
            loader.close(wait=False)

    def next(self) -> Any:
        if self._yielded >= self._sync_after:
            self._yielded = 0
            _sync()
        else:
            self._yielded += 1
        item = self._loader.next_item(self._device)
        if item is _END:
            _sync()
            raise StopIteration
        return item


class ParallelLoader:
    """Wraps a DataLoader (any iterable of batches) and uploads its batches to ``pjrt`` on a background thread.

    ``devices`` lists the target devices; here that is ``["pjrt:0"]`` (or ``[xs.device()]``),
    the one device that stands for all of the plugin's devices. ``input_sharding`` is one
    :class:`~pjrt_plugins.spmd.ShardingSpec` (applied to every tensor of a batch whose rank
    it fits; the others are replicated) or a dict of them keyed like a dict batch. Each device
    receives only its shard. A batch that does not fit its specs raises
    :class:`~pjrt_plugins.errors.InputShardingError` from the loop, before any of it is uploaded.

    ``device_prefetch_size`` batches are uploaded ahead of the loop, by
    ``host_to_device_transfer_threads`` threads; batches keep their order.
    ``loader_prefetch_size`` and ``batchdim`` are accepted for ported code (the prefetch
    depth is ``device_prefetch_size``).

    Example::

        train = ParallelLoader(cpu_loader, [xs.device()], input_sharding=xs.ShardingSpec(mesh, ("data", None)))
        for x, y in train.per_device_loader(xs.device()):
            ...
    """

    def __init__(
        self,
        cpu_loader: Iterable[Any],
        devices: Sequence[Any],
        batchdim: int = 0,
        batches_per_execution: int = 1,
        loader_prefetch_size: int = 16,
        device_prefetch_size: int = 8,
        host_to_device_transfer_threads: int = 1,
        input_sharding: InputSharding = None,
    ) -> None:
        self._devices = [torch.device(d) for d in devices]
        if len(self._devices) != 1:
            raise ValueError(
                f"ParallelLoader got devices {[str(d) for d in self._devices]}; give the one virtual device, "
                "[xs.device()], which stands for all the plugin's devices"
            )
        for device in self._devices:
            check_torch_device(device)
        for name, value in (("batches_per_execution", batches_per_execution),
                            ("device_prefetch_size", device_prefetch_size),
                            ("host_to_device_transfer_threads", host_to_device_transfer_threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        check_input_sharding(input_sharding)  # a wrong spec or mesh fails here, before any upload
        self._cpu_loader = cpu_loader
        self._batchdim = batchdim
        self._batches_per_execution = batches_per_execution
        self._loader_prefetch_size = loader_prefetch_size
        self._input_sharding = input_sharding
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=device_prefetch_size)
        self._done = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=host_to_device_transfer_threads, thread_name_prefix="pjrt-upload")
        self._thread = threading.Thread(target=self._loader_worker, name="pjrt-loader", daemon=True)
        self._thread.start()

    @property
    def batches_per_execution(self) -> int:
        return self._batches_per_execution

    def per_device_loader(self, device: Any) -> PerDeviceLoader:
        """The iterator of uploaded batches for ``device`` (the virtual device)."""
        device = torch.device(device)
        check_torch_device(device)
        return PerDeviceLoader(self, self._devices[0])

    def per_device_samples(self) -> int:
        return len(self._cpu_loader) // len(self._devices)  # type: ignore[arg-type]

    def next_item(self, device: torch.device) -> Any:
        """The next uploaded batch, or the end marker; re-raises an error of the loading threads."""
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)  # later calls see the end too
            return _END
        if isinstance(item, BaseException):
            self._queue.put(_END)
            raise item
        try:
            return item.result()
        except BaseException:
            self.close()
            raise

    def close(self, wait: bool = True) -> None:
        """Stop loading and uploading; the iterator then ends. ``wait``: until the threads have stopped."""
        self._done.set()
        while True:  # unblock the loader thread if it waits on a full queue
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if wait and self._thread is not threading.current_thread():
            self._thread.join(timeout=60)
        self._pool.shutdown(wait=wait, cancel_futures=True)
        try:
            self._queue.put_nowait(_END)
        except queue.Full:  # pragma: no cover (emptied above; the loader thread has stopped)
            pass

    def _put(self, item: Any) -> bool:
        """Queue ``item`` unless the loader was closed; False once it is."""
        while not self._done.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _loader_worker(self) -> None:
        try:
            for batch in self._cpu_loader:
                if self._done.is_set():
                    return
                future: Future[Any] = self._pool.submit(self._upload, batch)
                if not self._put(future):
                    return
        except BaseException as error:  # surfaces in the training loop, not in this thread
            logger.debug("loading stopped: %r", error)
            self._put(error)
            return
        self._put(_END)

    def _upload(self, batch: Any) -> Any:
        with torch.no_grad():
            if type(batch) is torch.Tensor:  # a batch that is one tensor stays one (not a one-item list)
                return send_cpu_data_to_device(batch, self._devices[0], self._input_sharding)[0]
            return send_cpu_data_to_device(batch, self._devices[0], self._input_sharding)


class MpDeviceLoader:
    """Iterate a DataLoader with its batches already on ``device``, uploaded ahead on a background thread.

    PyTorch/XLA's ``MpDeviceLoader``: each ``iter()`` starts a :class:`ParallelLoader` with
    ``kwargs`` (``input_sharding=...``, ``device_prefetch_size=...``, ...). Taking a batch runs the
    previous step (``xs.sync()``).

    Example (8 devices, a dict batch)::

        mesh = xs.Mesh(range(8), (8,), ("data",))
        loader = MpDeviceLoader(dataloader, xs.device(), input_sharding={
            "input_ids": xs.ShardingSpec(mesh, ("data", None)),
            "labels": xs.ShardingSpec(mesh, ("data",)),
        })
        for batch in loader:
            loss = model(batch["input_ids"], batch["labels"]); loss.backward(); opt.step()
    """

    def __init__(self, loader: Iterable[Any], device: Any, **kwargs: Any) -> None:
        self._loader = loader
        self._device = device
        self._parallel_loader_kwargs = kwargs
        self._parallel_loader: ParallelLoader | None = None

    def __iter__(self) -> Iterator[Any]:
        if self._parallel_loader is not None:
            self._parallel_loader.close()
            self._parallel_loader = None
        self._parallel_loader = ParallelLoader(self._loader, [self._device], **self._parallel_loader_kwargs)
        return self._parallel_loader.per_device_loader(self._device)

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]


def _sync() -> None:
    """``xs.sync()`` when anything can be pending (the engine is loaded by the first operator)."""
    engine = loaded_engine()
    if engine is not None:
        engine.sync()
