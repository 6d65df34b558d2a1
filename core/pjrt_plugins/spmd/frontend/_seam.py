"""The one lazy seam of ``pjrt_plugins.spmd``: the engine (``_engine``, and with it jaxlib) loads on first use,
and so do DTensor placements (``_placements``, and with it ``torch.distributed.tensor``).

Why: ``import pjrt_plugins.spmd`` registers the device and lets users make, move and mark tensors; that
must stay light. The engine (tracing, lowering with jaxlib's MLIR bindings, compiling) is needed only
once an operator runs, and importing it costs about half a second; torch's DTensor package, which
``XLAShardedTensor.placements`` and ``.redistribute`` need, costs two to three seconds. Every other import
of the package is at the top of its module; code of the light half reaches them only through
:func:`engine` and :func:`placements`.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

__all__ = ["engine", "loaded_engine", "placements"]

_ENGINE_MODULE = f"{__package__}._engine"
_engine: ModuleType | None = None
_PLACEMENTS_MODULE = f"{__package__}._placements"
_placements: ModuleType | None = None


def engine() -> ModuleType:
    """The engine module (``pjrt_plugins.spmd.frontend._engine``), imported on the first call."""
    global _engine
    if _engine is None:
        try:
            _engine = importlib.import_module(_ENGINE_MODULE)
        except ModuleNotFoundError as exc:
            if exc.name is None or not exc.name.startswith("jaxlib"):
                raise
            raise ImportError(
                "running operators on the pjrt device needs jaxlib, which is not installed; install the SPMD "
                "extra: pip install 'pjrt-plugins[spmd]'") from exc
    return _engine


def loaded_engine() -> ModuleType | None:
    """The engine module if something imported it already, else None (never imports it)."""
    return _engine if _engine is not None else sys.modules.get(_ENGINE_MODULE)


def placements() -> ModuleType:
    """The DTensor placements module (``pjrt_plugins.spmd.frontend._placements``), imported on the first call."""
    global _placements
    if _placements is None:
        _placements = importlib.import_module(_PLACEMENTS_MODULE)
    return _placements
