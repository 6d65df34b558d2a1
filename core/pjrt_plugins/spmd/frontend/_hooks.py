"""Autograd hooks on pjrt tensors: an error a hook raises is a Python exception, never a process death.

Why: torch calls autograd's Python hooks inside its engine and, when one raises, throws into C++ with the
Python error still set. The engine unwinds through a stream guard of the ``pjrt`` device, whose destructor
(``exchangeStream``, ``noexcept``) asks torch's Python device guard for its device type; a Python call cannot
run with an error set, so that fails inside the ``noexcept`` function and the process aborts (``terminate
called without an active exception``), for ``KeyboardInterrupt`` as for any error. No Python device guard
avoids it: torch 2.13's ``PythonDeviceGuard`` calls the Python ``type_`` from every method.

So hooks run guarded: an error is kept, and the hook hands torch a result it refuses in C++ (no Python error
set), which unwinds safely. Guarded are the hooks registered on a pjrt tensor (``register_hook``,
``register_post_accumulate_grad_hook``) and, when they receive pjrt gradients, the hooks on autograd's nodes
(``grad_fn.register_hook`` / ``register_prehook``, through which ``nn.Module``'s full backward hooks and pre-hooks
run). ``backward()`` of a pjrt tensor raises the kept error itself, as torch does on the CPU; other entry points
(``torch.autograd.grad``) raise torch's RuntimeError, whose message names the hook's error.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.autograd import function as _autograd_function

from ._torch_device import DEVICE_TYPE

logger = logging.getLogger(__name__)

__all__ = ["guard_hook", "guard_node_hooks", "hook_errors_raised"]

_lock = threading.Lock()
#: Errors raised by hooks, by the marker their refused result carries in torch's message.
_kept: dict[str, BaseException] = {}
_MARKER = "pjrt-hook-error-"
_KEPT_AT_MOST = 16


def _keep(error: BaseException) -> str:
    """Keep ``error`` for ``hook_errors_raised`` and return the marker that finds it again."""
    marker = f"{_MARKER}{id(error)}"
    with _lock:
        _kept[marker] = error
        while len(_kept) > _KEPT_AT_MOST:  # errors no backward() raised (torch.autograd.grad's)
            del _kept[next(iter(_kept))]
    return marker


class _GuardedHook:
    """``hook`` run so that its error unwinds through autograd's C++ without a Python error set."""

    def __init__(self, hook: Callable[..., Any]) -> None:
        self.hook = hook
        self.__name__ = getattr(hook, "__name__", "<hook>")  # torch names the hook in its messages

    def __call__(self, *args: Any) -> Any:
        try:
            return self.hook(*args)
        except BaseException as error:  # noqa: BLE001 - KeyboardInterrupt too: it must reach the caller
            if not self._guards(args):
                raise
            marker = _keep(error)
            self.__name__ = (f"{getattr(self.hook, '__name__', '<hook>')} raised {type(error).__name__}: {error} "
                             f"[{marker}]")
            return self._refused(args)

    def _guards(self, args: tuple[Any, ...]) -> bool:
        return True

    def _refused(self, args: tuple[Any, ...]) -> Any:
        return torch.empty(0, dtype=torch.bool)  # another type than the tensor's: torch refuses it in C++


class _GuardedNodeHook(_GuardedHook):
    """A ``grad_fn`` hook or pre-hook: guarded when pjrt gradients reach it (elsewhere errors pass as torch's)."""

    def _guards(self, args: tuple[Any, ...]) -> bool:
        return any(isinstance(grad, torch.Tensor) and grad.device.type == DEVICE_TYPE
                   for grads in args if isinstance(grads, tuple) for grad in grads)

    def _refused(self, args: tuple[Any, ...]) -> Any:
        # One value more than the node's gradients: torch refuses the count in C++.
        return (*args[0], None)


def guard_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` for ``Tensor.register_hook`` or ``register_post_accumulate_grad_hook`` on a pjrt tensor."""
    return _GuardedHook(hook)


_node_hooks_guarded = False


def guard_node_hooks() -> None:
    """Guard every hook registered on an autograd node from now on (idempotent).

    ``grad_fn.register_hook`` and ``register_prehook`` are C++ methods that store the hook through the
    Python ``torch.autograd.function._HookMixin._register_hook``; that is the one place a node's hook
    (a module's backward hooks included) can be wrapped. A hook whose gradients are not pjrt tensors
    behaves as before, errors included.
    """
    global _node_hooks_guarded
    with _lock:
        if _node_hooks_guarded:
            return
        mixin = getattr(_autograd_function, "_HookMixin", None)
        register = getattr(mixin, "_register_hook", None)
        if register is None:
            logger.warning("torch.autograd.function._HookMixin._register_hook is gone from this torch: an error "
                           "raised by a module's or grad_fn's backward hook on pjrt tensors aborts the process")
            return

        def _register_hook(backward_hooks: Any, hook: Any) -> Any:
            if callable(hook) and not isinstance(hook, _GuardedHook):
                hook = _GuardedNodeHook(hook)
            return register(backward_hooks, hook)

        mixin._register_hook = staticmethod(_register_hook)  # type: ignore[union-attr]
        _node_hooks_guarded = True


@contextlib.contextmanager
def hook_errors_raised() -> Iterator[None]:
    """Around ``backward()``: torch's RuntimeError for a guarded hook's refused result becomes the hook's error."""
    try:
        yield
    except RuntimeError as exc:
        message = str(exc)
        if _MARKER not in message:
            raise
        marker = _MARKER + message.split(_MARKER, 1)[1].split("]", 1)[0]
        with _lock:
            error = _kept.pop(marker, None)
        if error is None:
            raise
        raise error from None


guard_node_hooks()
