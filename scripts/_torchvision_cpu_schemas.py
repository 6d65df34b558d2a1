"""Lets the development environment import torchvision (and through it timm and transformers) beside the CPU torch.

Why: the only torchvision wheel on PyPI for torch 2.13.0 (0.28.0) is a CUDA build. Its C operator library
links against libtorch_cuda and libcudart, so it cannot load beside torch's CPU build; torchvision then
skips the operators it guards, but ``torchvision._meta_registrations`` registers fake kernels for
``torchvision::nms`` and ``torchvision::qnms`` unguarded, and ``import torchvision`` fails with
``operator torchvision::nms does not exist``. transformers imports torchvision whenever it and Pillow are
installed, and timm always does, so both fail as well.

What: ``scripts/setup`` copies this module into the virtual environment with a ``.pth`` line that calls
:func:`install`. That puts a finder on ``sys.meta_path`` which acts once, when torchvision is first
imported (so no other start-up pays for torch): if torchvision's ``_C`` library does not load, it defines
the schemas of those two operators (as torchvision's C++ source declares them) with no kernel. Everything
the models need (torchvision's pure-Python layers, transforms, ``FrozenBatchNorm2d``) then works; calling
``torchvision.ops.nms`` (or any other of its C operators) raises torchvision's own "Couldn't load custom
C++ ops" error. Where a torchvision build whose operators load is installed, nothing is defined.

Not part of the pjrt-plugins distribution: a development and CI environment helper only.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

#: The operators torchvision registers fake kernels for without checking that its C library loaded.
SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)

_library = None  # the torch.library.Library holding the definitions (kept alive for the process)


def _operator_library_loads() -> bool:
    """Whether torchvision's own ``_C`` library loads here (then it defines its operators itself)."""
    import torch

    spec = importlib.machinery.PathFinder.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return True  # no torchvision: nothing to prepare
    for folder in spec.submodule_search_locations:
        for path in Path(folder).glob("_C*.so"):
            try:
                torch.ops.load_library(str(path))
            except (ImportError, OSError):
                return False
            return True
    return False


def define_missing_schemas() -> None:
    """Define ``torchvision::nms`` and ``torchvision::qnms`` when torchvision's C library cannot."""
    global _library
    if _library is not None or _operator_library_loads():
        return
    import torch

    _library = torch.library.Library("torchvision", "FRAGMENT")
    for schema in SCHEMAS:
        _library.define(schema)


class _BeforeTorchvision(importlib.abc.MetaPathFinder):
    """Runs :func:`define_missing_schemas` when ``import torchvision`` starts, then steps aside."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "torchvision":
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            define_missing_schemas()
        return None  # the regular finders import it


def install() -> None:
    """Put the finder in front of the regular ones (from the ``.pth`` line; idempotent)."""
    if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())
