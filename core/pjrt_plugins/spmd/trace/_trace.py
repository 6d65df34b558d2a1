"""The pending trace: recorded entries, the prefix tree they walk, and the values tensors hold in it.

Recording keeps, per op, one small hashable *entry*: ``(op id, argument keys, keyword keys)``
where a tensor is the position of its value in the trace and a constant is tagged with its
type (``1``, ``1.0`` and ``True`` are equal in Python, their keys are not). Inputs are
``(INPUT, shape, dtype, sharding token)``. Consecutive entries walk a prefix tree of
:class:`Step`s that remember each op's output shapes, so an op seen before in the same place
needs no shape inference, and the step a trace ends on names its whole sequence: with the
live outputs, the sharding pins, the lowering options and the plugin, it is the key of the
compiled program. The torch.fx graph is built from the entries only when that key misses.

Data structures only: recording is ``_record``, running is ``_materialize``.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ..sharding import OpSharding
from ..transport import TensorData

__all__ = ["GETITEM", "INPUT", "LazyValue", "Step", "Trace", "TraceInput"]

#: Entry kind of a graph input; operators are numbered from 1.
INPUT = 0
#: Entry kind of one result of a multi-output operator: ``(GETITEM, op position, i)``.
GETITEM = -1


class LazyValue:
    """What ``TensorData.lazy`` holds: a value of a pending trace (``index``: its entry), and the base if it is a view.

    ``view`` says how a new view was derived from ``base``: a chain of one link ``((view op, its arguments
    after the tensor),)``; the TensorData made for it keeps that link (``TensorData.view_of``) so that an
    in-place op on the view can be written back into the base, and a write into the base reaches the view.
    ``keep_sharding`` is the layout a tensor updated in place had before: its new value is pinned to it,
    so state that lives across steps (parameters, optimizer buffers) keeps one layout and a repeated step
    compiles once.
    """

    __slots__ = ("trace", "index", "base", "view", "keep_sharding")

    def __init__(self, trace: Trace, index: int) -> None:
        self.trace = trace
        self.index = index
        self.base: weakref.ref[TensorData] | None = None
        self.view: Any = None
        self.keep_sharding: OpSharding | None = None

    @property
    def spec(self) -> tuple[str, tuple[int, ...], torch.dtype]:
        """The output spec of this value's entry: ``("T", shape, dtype)``."""
        spec: tuple[str, tuple[int, ...], torch.dtype] = self.trace.outs[self.index]
        return spec


class TraceInput:
    """A graph input: the device buffers its entry stands for, fixed at record time, and their value on the host
    once a host computation gathered it (``host``; ``_host_compute``: a value read every step is gathered once)."""

    __slots__ = ("buffers", "generation", "sharding", "shape", "dtype", "mesh", "data_id", "source", "host")

    def __init__(self, data: TensorData) -> None:
        assert data.buffers is not None and data.sharding is not None
        self.data_id = data.id  # which tensor data it was read from (see _donation)
        self.source = weakref.ref(data)  # and that data itself, where a replayed step reads it again (_replay)
        self.buffers = data.buffers  # never changed in place: a state change replaces the list
        self.generation = data.generation
        self.sharding = data.sharding
        self.shape = data.shape
        self.dtype = data.dtype
        self.mesh = data.mark[0] if data.mark is not None else None  # names the Shardy mesh's axes
        self.host: torch.Tensor | None = None


class Step:
    """A node of the prefix tree of recorded entries: the entry leading here and its output spec.

    What depends only on the entry and its place is made once, on the miss, and shared by every trace
    that passes here: the entry itself (a trace keeps the step's, so the equal tuples just built to find
    the step die at once and leave nothing for the cyclic GC), the entries of a multi-output op's results
    (``items``) and a view op's links to its base (``links``, see ``_record.view_links``).
    """

    __slots__ = ("next", "out", "entry", "items", "links")

    def __init__(self, out: Any, entry: tuple | None = None) -> None:
        self.next: dict[tuple, Step] = {}
        self.out = out
        self.entry = entry
        self.items: list[tuple] | None = None
        self.links: Any = None


class Trace:
    """One pending trace: its entries (with output specs), inputs, run-time scalars and the tensors it feeds."""

    __slots__ = ("entries", "outs", "cursor", "inputs", "input_ids", "scalars", "rng", "values", "pins", "ops",
                 "error", "done", "carried")

    def __init__(self, root: Step) -> None:
        self.entries: list[tuple] = []
        self.outs: list[Any] = []  # per entry: its output spec (see _output_specs.out_spec)
        self.cursor = root
        self.inputs: list[TraceInput] = []  # in entry order, which is the module's argument order
        self.input_ids: dict[tuple[int, int], int] = {}  # (data id, version) -> entry index
        #: Values of the run-time scalars (ScalarSlot index -> value), passed as one float64 input.
        self.scalars: list[float] = []
        #: The RNG key ``(seed, offset)`` of each random op, drawn when it was recorded (a run-time input).
        self.rng: list[tuple[int, int]] = []
        #: Weak references to every TensorData whose lazy value lives in this trace.
        self.values: list[weakref.ref[TensorData]] = []
        self.pins: dict[int, OpSharding] = {}  # entry index -> sharding constraint (mark_sharding)
        self.ops = 0
        self.error: BaseException | None = None
        self.done = False
        #: How many entries it took over from a trace that ran in part (``_split``): those may be dead by now.
        self.carried = 0
