"""The engine's state in one object (:data:`ENGINE`): the pending trace, its lock, and every cache of the engine.

Why one object: the caches depend on each other (an entry names an operator by its number in
``ops_by_id``, a compiled program is found through the prefix tree), so they are kept, and reset,
together. ``ENGINE.reset()`` forgets all of them; pending work is then discarded.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ...errors import VirtualDeviceError
from ..execution import PROGRAMS, ProgramCache
from ..sharding import OpSharding
from ._trace import Step, Trace

if TYPE_CHECKING:  # annotations only: _op_info reads this module
    from ._op_info import OpInfo

__all__ = ["ENGINE", "MAX_STEPS", "EngineState"]

#: Prefix-tree nodes kept before the tree starts over (a few hundred bytes each).
MAX_STEPS = 250_000


class EngineState:
    """The pending trace and the engine's caches (see the module docstring).

    - ``lock``: held while recording and materializing (re-entrant: a decomposition records ops).
    - ``trace``: the pending :class:`Trace`, or None; ``root`` / ``steps``: the prefix tree of entries.
    - ``op_infos`` / ``ops_by_id``: what the tracer knows of each operator, by ``id(op)`` and by number.
    - ``spec_tokens`` / ``spec_tokens_by_id``: small ints standing for shardings in entries.
    - ``meta_cache`` / ``decomposition_specs``: output specs by operator and argument specs.
    - ``last_scalars``: the last run-time scalars and their buffers (reused while they do not change).
    - ``realign_positions``: per program key, the inputs its executable wants laid out otherwise.
    - ``last_timings``: where the last materialization's time went.
    - ``host_reads``: how many pending values that read device data were read on the host without a program.
    - ``programs``: the execution layer's compile cache.
    """

    __slots__ = ("lock", "trace", "root", "steps", "op_infos", "ops_by_id", "spec_tokens",
                 "spec_tokens_by_id", "meta_cache", "decomposition_specs", "last_scalars", "realign_positions",
                 "last_timings", "host_reads", "programs")

    def __init__(self, programs: ProgramCache) -> None:
        self.lock = threading.RLock()
        self.programs = programs
        self.trace: Trace | None = None
        self.host_reads = 0
        self._forget()

    def _forget(self) -> None:
        self.root = Step(None)
        self.steps = 0
        self.op_infos: dict[int, OpInfo] = {}
        self.ops_by_id: list[OpInfo | None] = [None]
        self.spec_tokens: dict[OpSharding, int] = {}
        self.spec_tokens_by_id: dict[int, tuple[OpSharding, int]] = {}
        self.meta_cache: dict[Any, Any] = {}
        self.decomposition_specs: dict[Any, Any] = {}
        self.last_scalars: tuple[tuple[float, ...], int, list[Any]] | None = None
        self.realign_positions: dict[str, list[int]] = {}
        self.last_timings: dict[str, float] = {"key": 0.0, "execute": 0.0, "after": 0.0}

    def current_trace(self) -> Trace:
        """The pending trace, started if there is none (the prefix tree starts over when it grew too big)."""
        trace = self.trace
        if trace is None:
            if self.steps > MAX_STEPS:  # programs found through the old tree stay in the compile cache
                self.root, self.steps = Step(None), 0
            trace = self.trace = Trace(self.root)
        return trace

    def reset(self) -> None:
        """Forget every cache and the compiled programs; the pending trace is discarded (its tensors raise)."""
        with self.lock:
            trace = self.trace
            if trace is not None:
                trace.error = VirtualDeviceError("the engine was reset (ENGINE.reset()) before this pending "
                                                 "computation ran; compute it again")
                self.trace = None
            self._forget()
            self.programs.clear()


#: The engine's state for this process.
ENGINE = EngineState(PROGRAMS)
