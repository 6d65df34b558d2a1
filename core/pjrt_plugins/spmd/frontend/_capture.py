"""``capture_step``: a step function traced until two calls in a row record the same program, then replayed
without running its Python (the engine's ``_replay``), as ``torch.cuda.graphs`` replays a captured step.

Why: a traced training step spends tens of milliseconds in Python (the model, autograd, the optimizer) to
arrive at the program it ran the step before; jax users jit the whole step once. Replaying reads the
current buffers of the tensors the step reads and writes its results into the tensors it updates, so a
loop over ``step(batch)`` behaves as the traced loop did, minus the Python.
"""

from __future__ import annotations

import functools
import logging
import numbers
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils import _pytree as pytree

from ..trace import NotReplayable, Recording, ReplayMiss, record_call, replay, sync, watch_call
from ..transport import TensorData
from .tensor import XLAShardedTensor, wrap

logger = logging.getLogger(__name__)

__all__ = ["CapturedStep", "capture_step"]

#: Calls traced without two in a row agreeing before the step is given up as one that changes every call.
MAX_TRACED_CALLS = 8
#: Argument signatures kept per captured step; past it they are forgotten (a Python argument that changes every
#: call, such as a step number, makes a new signature each call, which nothing replays).
MAX_SIGNATURES = 32


class _Entry:
    """What one argument signature has reached: the last traced call's recording, and the replayable one."""

    __slots__ = ("last", "ready", "traced", "outputs", "optimizers")

    def __init__(self) -> None:
        self.last: Recording | None = None
        self.ready: Recording | None = None
        self.traced = 0
        #: The recorded call's output structure, and per leaf the index of its result or ``("constant", value)``.
        self.outputs: Any = None
        #: The optimizers the recorded call stepped, with their hyperparameters then (checked before each replay).
        self.optimizers: tuple[tuple[weakref.ref[torch.optim.Optimizer], tuple], ...] = ()


class CapturedStep:
    """``fn`` made replayable: see :func:`capture_step`. ``replays`` and ``traced_calls`` count how calls ran."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise TypeError(f"capture_step needs a function, got {type(fn).__name__}")
        self.fn = fn
        self.replays = 0
        self.traced_calls = 0
        self._entries: dict[Any, _Entry] = {}
        self._warned: set[str] = set()
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        key, datas = _argument_key(spec, leaves)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= MAX_SIGNATURES:
                self._entries.clear()
                self._warn(f"it was called with more than {MAX_SIGNATURES} argument signatures (shapes, dtypes, "
                           "layouts, constants); a Python argument that changes every call (a step number) is "
                           "recorded anew each call: pass it as a pjrt tensor, or leave it out")
            entry = self._entries[key] = _Entry()
        if entry.ready is not None:
            try:
                _check_optimizers(entry.optimizers)
                made = replay(entry.ready, datas)
            except ReplayMiss as miss:
                logger.info("capture_step %s traces again: %s", _name(self.fn), miss)
                entry.ready = entry.last = None
            else:
                self.replays += 1
                return _results(entry, made)
        return self._traced(entry, args, kwargs, datas)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """As a method decorator: the instance is passed as a constant argument (one recording per instance)."""
        return self if instance is None else functools.partial(self, instance)

    def recapture(self) -> None:
        """Forget the recorded calls: the next calls trace ``fn`` again (after changing what it reads in Python,
        such as a learning rate kept as a Python number)."""
        self._entries.clear()

    def _traced(self, entry: _Entry, args: tuple, kwargs: dict, datas: list[TensorData | None]) -> Any:
        watch = watch_call()
        stepped: list[torch.optim.Optimizer] = []
        hook = register_optimizer_step_pre_hook(lambda optimizer, *_: stepped.append(optimizer))
        try:
            out = self.fn(*args, **kwargs)
        finally:
            hook.remove()
        optimizers = tuple((weakref.ref(o), _hyperparameters(o)) for o in dict.fromkeys(stepped))
        self.traced_calls += 1
        entry.traced += 1
        out_leaves, out_spec = pytree.tree_flatten(out)
        results: list[TensorData] = []
        position: dict[int, int] = {}  # a tensor returned twice is one result
        kinds: list[Any] = []
        for leaf in out_leaves:
            if isinstance(leaf, XLAShardedTensor) and leaf._pjrt_data is not None:
                data = leaf._pjrt_data
                if id(data) not in position:
                    position[id(data)] = len(results)
                    results.append(data)
                kinds.append(position[id(data)])
            elif isinstance(leaf, torch.Tensor):
                self._give_up(entry, "it returns a tensor that is not on the pjrt device")
                sync()
                return out
            else:
                kinds.append(("constant", leaf))
        try:
            recording = record_call(watch, datas, results)
        except NotReplayable as why:
            self._give_up(entry, str(why))
            return out
        outputs = (out_spec, tuple(kinds))
        same = (entry.last is not None and entry.last.signature == recording.signature and entry.outputs == outputs
                and _same_optimizers(entry.optimizers, optimizers))
        entry.last, entry.outputs, entry.optimizers = recording, outputs, optimizers
        if same:
            entry.ready = recording
            logger.info("capture_step %s: recorded after %d traced calls; later calls replay its program",
                        _name(self.fn), entry.traced)
        elif entry.traced >= MAX_TRACED_CALLS:
            self._give_up(entry, f"no two calls in a row of its first {MAX_TRACED_CALLS} traced the same (a Python "
                                 "number or the sequence of ops changes from call to call)")
        return out

    def _give_up(self, entry: _Entry, reason: str) -> None:
        """Keep tracing every call (always correct), and say why once per reason."""
        entry.last = None
        self._warn(reason, stacklevel=5)

    def _warn(self, reason: str, stacklevel: int = 3) -> None:
        if reason not in self._warned:
            self._warned.add(reason)
            warnings.warn(f"capture_step({_name(self.fn)}) cannot replay this step, so it traces every call: "
                          f"{reason}", RuntimeWarning, stacklevel=stacklevel)


def capture_step(fn: Callable[..., Any]) -> CapturedStep:
    """Trace ``fn`` until two calls in a row run the same program, then replay that program without its Python.

    For a training step (forward, ``backward``, ``optimizer.step()``, ``zero_grad``) whose tensors keep their
    shapes and layouts: the first calls run traced (the optimizer makes its state), and once two calls in a row
    record the same ops, Python numbers and tensors, later calls run the recorded program on the current values
    of the tensors it reads (parameters, optimizer state, the batch passed in) and write the results into the
    tensors it updates. Every call starts and ends with what :func:`sync` does (work pending from before the
    call runs first, as its own program). Tensors ``fn`` returns are new tensors each
    call (without autograd history); other returned values are those of the recorded call.

    As with ``torch.cuda.graphs``, what ``fn``'s Python decides is decided once: a Python number it reads keeps
    its recorded value (``AdamW(capturable=True)`` keeps its step count on the device). The hyperparameters of
    the optimizers ``fn`` steps are checked before each replay (a scheduler's new ``lr`` records the step
    again); after changing any other Python value ``fn`` reads, call :meth:`CapturedStep.recapture`.
    A step that reads a device value on the host, runs an op on the CPU fallback, or moves host data that changes
    from call to call to the devices is never replayed: it is traced every call, with a warning saying why. Arguments are pjrt tensors
    (in any pytree) and hashable constants; a new shape, dtype, layout or constant records the step again.

    Example::

        @xs.capture_step
        def train_step(ids, labels):
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        for ids, labels in loader:
            loss = train_step(ids, labels)  # the third call on replays the recorded program
    """
    return CapturedStep(fn)


def _argument_key(spec: Any, leaves: list[Any]) -> tuple[Any, list[TensorData | None]]:
    """The signature calls must share to replay one recording, and the data of the tensor arguments in order."""
    datas: list[TensorData | None] = []
    first: dict[int, int] = {}  # data id -> its first position
    parts: list[Any] = [spec]
    for leaf in leaves:
        if isinstance(leaf, XLAShardedTensor):
            if leaf.requires_grad:
                raise ValueError("capture_step arguments must not require grad: keep trained tensors in a module "
                                 "or optimizer the step reads, and pass the batch (and other inputs) as arguments")
            data = leaf._pjrt_data
            if data is None:
                raise RuntimeError("capture_step cannot run inside torch.compile")
            # the same tensor passed twice is one input of the recording: later calls must pass one tensor too
            same = first.setdefault(id(data), len(datas))
            datas.append(data)
            parts.append((data.shape, data.dtype, data.annotation, same))
        elif isinstance(leaf, torch.Tensor):
            raise TypeError(f"capture_step arguments must be pjrt tensors or constants, got a tensor on "
                            f"{leaf.device}: move it with .to('pjrt')")
        else:
            try:
                hash(leaf)
            except TypeError:
                raise TypeError(f"capture_step arguments must be pjrt tensors or hashable constants, got "
                                f"{type(leaf).__name__}") from None
            parts.append(("constant", type(leaf), leaf))
    return tuple(parts), datas


def _hyperparameters(optimizer: torch.optim.Optimizer) -> tuple:
    """The Python values of ``optimizer``'s parameter groups (lr, betas, weight decay, ...): what a scheduler
    changes between steps, and what a recorded step's program holds as numbers."""
    groups = []
    for group in optimizer.param_groups:
        values = []
        for name, value in sorted(group.items()):
            if isinstance(value, torch.Tensor):
                if value.device.type != "cpu" or value.dim() != 0:
                    continue  # a device tensor is an input of the program, read at every replay
                value = value.item()
            if isinstance(value, (numbers.Number, str, bool, type(None), tuple)):
                values.append((name, value))
        groups.append(tuple(values))
    return tuple(groups)


def _same_optimizers(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x[0]() is y[0]() and x[1] == y[1] for x, y in zip(a, b))


def _check_optimizers(optimizers: tuple) -> None:
    """Refuse a replay once an optimizer the step uses changed a hyperparameter (a scheduler's new lr)."""
    for ref, recorded in optimizers:
        optimizer = ref()
        if optimizer is None:
            raise ReplayMiss("an optimizer the recorded step used was freed")
        if _hyperparameters(optimizer) != recorded:
            raise ReplayMiss(f"a hyperparameter of {type(optimizer).__name__} changed since the step was recorded")


def _results(entry: _Entry, made: list[TensorData | None]) -> Any:
    """The recorded call's output structure, with new tensors on ``made`` and its constants."""
    spec, kinds = entry.outputs
    leaves = [kind[1] if isinstance(kind, tuple) else wrap(made[kind]) for kind in kinds]  # type: ignore[arg-type]
    return pytree.tree_unflatten(leaves, spec)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__
