"""Autograd hooks on pjrt tensors: an error a hook raises is a Python exception, never a process death.

Why: torch calls a tensor's hooks inside autograd's engine and, when one raises, throws into C++ with the
Python error still set. The engine unwinds through a stream guard of the ``pjrt`` device, whose destructor
calls torch's Python device guard; with an error set that call fails inside a ``noexcept`` function and the
process aborts (``terminate called without an active exception``), for ``KeyboardInterrupt`` as for any
error. So each hook registered on a pjrt tensor runs guarded: an error is kept, and the hook hands torch a
result it refuses in C++ (no Python error set), which unwinds safely. ``backward()`` of a pjrt tensor raises
the kept error itself, as torch does on the CPU; other entry points (``torch.autograd.grad``) raise torch's
RuntimeError, whose message names the hook's error.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["guard_hook", "hook_errors_raised"]

_lock = threading.Lock()
#: Errors raised by hooks, by the marker their refused result carries in torch's message.
_kept: dict[str, BaseException] = {}
_MARKER = "pjrt-hook-error-"
_KEPT_AT_MOST = 16


class _GuardedHook:
    """``hook`` run so that its error unwinds through autograd's C++ without a Python error set."""

    def __init__(self, hook: Callable[..., Any]) -> None:
        self.hook = hook
        self.__name__ = getattr(hook, "__name__", "<hook>")  # torch names the hook in its messages

    def __call__(self, *args: Any) -> Any:
        try:
            return self.hook(*args)
        except BaseException as error:  # noqa: BLE001 - KeyboardInterrupt too: it must reach the caller
            marker = f"{_MARKER}{id(error)}"
            with _lock:
                _kept[marker] = error
                while len(_kept) > _KEPT_AT_MOST:  # errors no backward() raised (torch.autograd.grad's)
                    del _kept[next(iter(_kept))]
            self.__name__ = (f"{getattr(self.hook, '__name__', '<hook>')} raised {type(error).__name__}: {error} "
                             f"[{marker}]")
            return torch.empty(0, dtype=torch.bool)  # another type than the tensor's: torch refuses it in C++


def guard_hook(hook: Callable[..., Any]) -> Callable[..., Any]:
    """``hook`` for ``Tensor.register_hook`` or ``register_post_accumulate_grad_hook`` on a pjrt tensor."""
    return _GuardedHook(hook)


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
