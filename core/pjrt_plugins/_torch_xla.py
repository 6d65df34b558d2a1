"""PyTorch/XLA interoperability: adapt torch_xla-style plugins, and check our side of its contract.

Never imports torch or torch_xla; everything here works on objects handed to it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from importlib.metadata import Distribution
from typing import Any, cast

from ._plugin import DevicePlugin
from ._marker import hookimpl

#: PyTorch/XLA's own distribution (its normalized name).
TORCH_XLA_DISTRIBUTION = "torch-xla"

# The methods PyTorch/XLA 2.9's loader and runtime call on an entry point's object,
# with the types it expects back (None: returns nothing).
TORCH_XLA_METHODS: tuple[tuple[str, tuple[Any, ...], tuple[type, ...]], ...] = (
    ("library_path", (), (str,)),
    ("client_create_options", (), (dict,)),
    ("requires_xla_coordinator", (), (bool,)),
    ("configure_single_process", (), (type(None),)),
    ("configure_multiprocess", (0, 1), (type(None),)),
    ("physical_chip_count", (), (int,)),
    ("host_index", (), (int,)),
)

_OPTION_VALUE_TYPES = (str, int, float, bool)


def normalize_distribution_name(name: str) -> str:
    """PEP 503 normalization: ``Torch_XLA`` and ``torch-xla`` are the same project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_name(dist: Distribution | None) -> str | None:
    """The distribution's normalized name, cheaply (from the .dist-info folder when possible)."""
    if dist is None:
        return None
    # PathDistribution knows its name from the folder name without reading METADATA.
    fast = getattr(dist, "_normalized_name", None)
    if isinstance(fast, str) and fast:
        return normalize_distribution_name(fast)
    name = dist.metadata["Name"]
    return normalize_distribution_name(name) if name else None


def torch_xla_name_problem(entry_name: str) -> str | None:
    """Why PyTorch/XLA cannot select a plugin whose ``torch_xla.plugins`` entry point is ``entry_name``, with the fix.

    torch_xla 2.9 takes the device type from ``PJRT_DEVICE`` up to the first ``_``
    (``xr.device_type()``) and looks its plugin up under that: ``PJRT_DEVICE=MY_CPU``
    means device type ``MY``, and ``plugins.default()`` raises ``KeyError: 'MY'``.
    A ``-`` survives (``MY-CPU`` works). ``None`` when the name is fine. ``conform``
    fails such a name.
    """
    if "_" not in entry_name:
        return None
    return (
        f"PyTorch/XLA reads PJRT_DEVICE={entry_name.upper()} as device type {entry_name.split('_')[0].upper()!r} "
        f"(it cuts at the first '_'), so its runtime cannot find this plugin; name the entry point "
        f"{entry_name.replace('_', '-')!r} instead (pjrt-plugins accepts either spelling)"
    )


@functools.lru_cache(maxsize=1)
def torch_xla_own_entry_points() -> frozenset[str] | None:
    """The ``torch_xla.plugins`` names torch_xla's own distribution publishes (2.9: neuron, tpu, xpu).

    ``None`` when torch_xla is not installed. Metadata only; nothing is imported.
    """
    try:
        dist = importlib.metadata.distribution(TORCH_XLA_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    return frozenset(ep.name.lower() for ep in dist.entry_points if ep.group == "torch_xla.plugins")


def torch_xla_name_note(entry_name: str, distribution: str | None = None) -> str | None:
    """What PyTorch/XLA does with a plugin published as entry point ``entry_name``, when that is not the obvious.

    The ``_`` problem above, always; and, when torch_xla is installed, ``cpu``, which
    torch_xla 2.9 always runs on its built-in CPU client (it never asks a plugin for
    ``PJRT_DEVICE=CPU``), and a name torch_xla's own distribution also publishes
    (``tpu``, ``neuron``, ``xpu``): ``import torch_xla`` registers both, and the one it
    registers last, the later distribution on ``sys.path`` (within one site-packages
    directory, in no set order), is the one it uses.
    """
    problem = torch_xla_name_problem(entry_name)
    if problem is not None:
        return problem
    name = entry_name.lower()
    own = torch_xla_own_entry_points()
    if own is None:
        return None
    if name == "cpu":
        return "PyTorch/XLA runs PJRT_DEVICE=CPU on its own built-in CPU client and never asks a plugin named cpu"
    if name in own and distribution != TORCH_XLA_DISTRIBUTION:
        return (
            f"PyTorch/XLA publishes its own {name!r} entry point too; with both installed, PJRT_DEVICE={name.upper()} "
            "there uses the one torch_xla registers last (the later distribution on sys.path; within one "
            "site-packages directory, in no set order)"
        )
    return None


def is_torch_xla_distribution(dist: Distribution | None) -> bool:
    return distribution_name(dist) == TORCH_XLA_DISTRIBUTION


def looks_like_torch_xla_plugin(obj: object) -> bool:
    """A PyTorch/XLA-style plugin: any object with a callable ``library_path``."""
    return callable(getattr(obj, "library_path", None))


class TorchXlaStylePlugin(DevicePlugin):
    """A DevicePlugin that answers the hooks by calling a torch_xla-style object's methods.

    Methods the wrapped object lacks, or that raise ``NotImplementedError``
    (as torch_xla's base class does), fall back to the core defaults.
    """

    def __init__(self, wrapped: object) -> None:
        super().__init__()
        self.wrapped = wrapped

    def _forward(self, method: str, *args: Any) -> Any:
        bound = getattr(self.wrapped, method, None)
        if not callable(bound):
            return None
        try:
            return bound(*args)
        except NotImplementedError:
            return None

    @hookimpl
    def pjrt_library_path(self) -> Any:
        return self._forward("library_path")

    @hookimpl
    def pjrt_client_create_options(self) -> Any:
        return self._forward("client_create_options")

    @hookimpl
    def pjrt_requires_coordinator(self) -> Any:
        return self._forward("requires_xla_coordinator")

    @hookimpl
    def pjrt_configure_single_process(self) -> None:
        self._forward("configure_single_process")

    @hookimpl
    def pjrt_configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        self._forward("configure_multiprocess", local_rank, local_world_size)

    @hookimpl
    def pjrt_physical_chip_count(self) -> Any:
        return self._forward("physical_chip_count")

    @hookimpl
    def pjrt_host_index(self) -> Any:
        return self._forward("host_index")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} wrapping {type(self.wrapped).__qualname__}>"


def torch_xla_contract_problems(obj: object, *, call_configure: bool = False) -> list[str]:
    """What PyTorch/XLA's loader would trip over on ``obj``; empty when it complies.

    Calls the methods PyTorch/XLA calls and checks the types of their answers.
    ``library_path()`` may raise when the plugin is unavailable here; that is
    reported too, since PyTorch/XLA would fail the same way when selected. The
    configure methods change process state (environment variables), so they are
    only called when ``call_configure`` is true.
    """
    problems: list[str] = []
    for method, args, expected in TORCH_XLA_METHODS:
        bound = getattr(obj, method, None)
        if not callable(bound):
            problems.append(f"{method}() is missing")
            continue
        if method.startswith("configure_") and not call_configure:
            continue
        try:
            value = bound(*args)
        except Exception as exc:  # report, do not crash the checker
            problems.append(f"{method}() raised {type(exc).__name__}: {exc}")
            continue
        if not isinstance(value, expected) or (expected == (int,) and isinstance(value, bool)):
            names = " or ".join("None" if t is type(None) else t.__name__ for t in expected)
            problems.append(f"{method}() returned {type(value).__name__} {value!r}, expected {names}")
        elif method == "client_create_options":
            problems.extend(_option_problems(cast("dict[object, object]", value)))
    return problems


def _option_problems(options: dict[object, object]) -> list[str]:
    problems = []
    for key, value in options.items():
        if not isinstance(key, str):
            problems.append(f"client_create_options() key {key!r} is not a str")
        elif isinstance(value, (list, tuple)):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                problems.append(f"client_create_options()[{key!r}] is a list with non-int items")
        elif not isinstance(value, _OPTION_VALUE_TYPES):
            problems.append(
                f"client_create_options()[{key!r}] is {type(value).__name__}; use str, int, float, bool or list[int]"
            )
    return problems
