"""Exception types users can catch; each message says what went wrong and what to do.

Nothing here imports the runtime or torch.
"""

from __future__ import annotations


class PjrtPluginsError(Exception):
    """Base class of every error raised by pjrt_plugins."""


class PluginNotFoundError(PjrtPluginsError, LookupError):
    """No plugin is registered under the requested name."""


class PluginLoadError(PjrtPluginsError):
    """An installed plugin failed to import or construct.

    ``__cause__`` is the original exception.
    """


class PluginUnavailableError(PjrtPluginsError):
    """The plugin is installed but cannot run here (no hardware, no library)."""


class PluginConfigurationError(PjrtPluginsError, ValueError):
    """A setting meant for a plugin (an environment variable, an option) is malformed.

    Unlike "no hardware here", this is the user's evident intent gone wrong: default
    selection stops with this error, naming the variable, instead of quietly choosing
    another plugin.
    """


class LibraryLoadError(PjrtPluginsError, OSError):
    """A PJRT shared library could not be opened or is not a PJRT plugin."""


class ApiVersionError(LibraryLoadError):
    """The library speaks a PJRT C API version we cannot talk to."""


class UnsupportedFunctionError(PjrtPluginsError, NotImplementedError):
    """The plugin does not provide a C API function we need.

    ``function`` names it, ``plugin_version`` is the plugin's ``(major, minor)`` and
    ``added_in`` the version that added the function (each None where unknown).
    """

    function: str | None = None
    plugin_version: tuple[int, int] | None = None
    added_in: tuple[int, int] | None = None


class UnsupportedExtensionError(PjrtPluginsError, NotImplementedError):
    """The plugin does not provide a PJRT C API extension (profiler, memory descriptions, ...).

    ``extension`` is its name as ``Library.extensions`` lists it (``"Profiler"``).
    """

    extension: str = ""


class PjrtError(PjrtPluginsError):
    """An error returned by the plugin through ``PJRT_Error``.

    ``code`` is the absl status code (an int, 0-16) and ``code_name`` its name,
    for example ``"INVALID_ARGUMENT"``; ``message`` is the plugin's own text.
    """

    CODE_NAMES = (
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    )

    def __init__(self, code: int, message: str, *, function: str | None = None, hint: str | None = None):
        self.code = int(code)
        self.code_name = self.CODE_NAMES[self.code] if 0 <= self.code < len(self.CODE_NAMES) else f"CODE_{self.code}"
        self.message = message
        self.function = function
        self.hint = hint
        text = f"{self.code_name}: {message}"
        if function:
            text = f"{function} failed with {text}"
        if hint:
            text = f"{text}\nHint: {hint}"
        super().__init__(text)


class PluginWarning(UserWarning):
    """A plugin was skipped, shadowed or refused during discovery (the others keep working)."""


class LoweringError(PjrtPluginsError):
    """A torch graph could not be turned into StableHLO (bad arguments, inconsistent metadata)."""


class UnsupportedOpError(LoweringError, NotImplementedError):
    """A torch operator has no StableHLO lowering and no decomposition into lowered operators.

    ``op`` is the operator's name, for example ``"aten.cholesky.default"``.
    """

    def __init__(self, op: str, message: str | None = None):
        self.op = op
        super().__init__(
            message
            or f"operator {op} has no lowering to StableHLO on the pjrt device. Compute it on the CPU "
            "(move the tensors with .cpu()), or enable the counted CPU fallback with "
            "pjrt_plugins.spmd.set_cpu_fallback(True)."
        )


class DataDependentShapeError(UnsupportedOpError):
    """An operator whose output shape depends on tensor values (``nonzero``, boolean masks) with the CPU fallback off."""


class CpuFallbackWarning(UserWarning):
    """An operator without a lowering ran on the CPU because the fallback was enabled."""


class ShardingError(PjrtPluginsError, ValueError, AssertionError):
    """A mesh, partition spec or sharding string is invalid, or does not fit the tensor or devices.

    A ``ValueError``; also an ``AssertionError``, which is what PyTorch/XLA raises for a bad mesh
    or partition spec, so ported code that catches that still does.
    """


class ShardingConflictError(ShardingError, RuntimeError):
    """A tensor already carries a different, non-replicated sharding; clear it with ``clear_sharding`` first.

    Also a ``RuntimeError``, what PyTorch/XLA raises when a tensor is re-marked.
    """


class ManualShardingError(ShardingError, RuntimeError):
    """A tensor is used inside or outside a manual-sharding region where it cannot be: a collective or
    ``disable_manual_sharding`` on a tensor that is not a value of a region, or ``enable_manual_sharding``
    on one that already is.

    Also a ``RuntimeError``, what PyTorch/XLA raises for a tensor that is not manual-sharded.
    """


class InputShardingError(ShardingError, RuntimeError):
    """A loaded batch does not fit the loader's ``input_sharding`` (a key without a spec, a spec of another
    rank, a batch size the devices do not divide); raised before any of the batch is uploaded.

    Also a ``RuntimeError``, as PyTorch/XLA's loaders raise for a batch size that does not divide.
    """


class PlacementError(ShardingError):
    """DTensor placements or a DeviceMesh that do not fit the tensor, the mesh or the virtual device
    (a ``Shard(dim)`` past the tensor's rank, one placement too many, a mesh over other devices)."""


class UnsupportedPlacementError(ShardingError, NotImplementedError):
    """A DTensor placement an XLA sharding cannot express (``Partial``, ``_StridedShard``).

    Both a ``ValueError`` and a ``NotImplementedError``: PyTorch/XLA raises the first when converting
    placements and the second in ``redistribute``, and ported code catches either.
    """


class SpmdDisabledError(PjrtPluginsError, RuntimeError):
    """A sharding API was used while SPMD is off (``XLA_USE_SPMD=0`` or ``use_spmd(False)``)."""


class VirtualDeviceError(PjrtPluginsError, RuntimeError):
    """A tensor is not on the pjrt virtual device where one is needed, or belongs to a replaced one."""


class PluginTimeoutError(PluginUnavailableError, TimeoutError):
    """A plugin did not return in time from opening (dlopen, ``GetPjrtApi``), initializing or
    creating a client; the call is left running on a daemon thread (a plugin cannot be interrupted)."""


class PluginInitializeTimeoutError(PluginTimeoutError):
    """``PJRT_Plugin_Initialize`` did not return in time (the plugin may wait for hardware)."""


class CompileCacheWarning(UserWarning):
    """The compile cache directory was refused (others could write it): programs are compiled instead."""


class ClientClosedError(PjrtPluginsError, RuntimeError):
    """A runtime Client (or the client of a device, buffer or executable) has been closed."""


class DistributedSetupError(PjrtPluginsError, RuntimeError):
    """This process cannot join its multi-process job: no torch.distributed store, or inconsistent ranks.

    Raised by :mod:`pjrt_plugins.distributed` before any client is created; the message
    names the missing or unreachable setting (``MASTER_ADDR``, ``MASTER_PORT``, ...).
    """


class HostViewUnavailableError(PjrtPluginsError, NotImplementedError):
    """``Buffer.host_view()`` on a buffer the host cannot read in place (device memory, a tiled layout,
    or a plugin without the external-reference functions); use ``to_numpy()`` instead."""


class BufferViewedError(PjrtPluginsError, BufferError):
    """A buffer, or the client owning it, was to be freed while host views of it (``Buffer.host_view()``)
    are alive; drop the views (every numpy array made from them) first."""


class ExecutionStuckError(PjrtPluginsError, TimeoutError):
    """A program's execution did not complete: its wait passed ``Executable.execute``'s ``timeout``, or
    (for plugins whose devices are host threads) the process used no CPU for ``stall_timeout`` seconds.

    ``program`` is the executable's name, ``devices`` the ids of the devices whose part had not
    completed, ``waited`` the seconds waited and ``reason`` ``"timeout"`` or ``"stalled"``. The
    execution is still in the plugin, which cannot cancel it: its outputs were released, and the
    client is no longer destroyed by ``close()`` (that would wait forever for its threads).
    """

    def __init__(self, message: str, *, program: str, devices: list[int], waited: float, reason: str):
        self.program = program
        self.devices = devices
        self.waited = waited
        self.reason = reason
        super().__init__(message)


class CheckpointError(PjrtPluginsError, RuntimeError):
    """A checkpoint could not be saved or restored (``pjrt_plugins.spmd.distributed_checkpoint``).

    Raised for a step the checkpoint manager does not track, a save that failed in the
    background (re-raised by the next call, ``__cause__`` is the original error), and as the
    base of :class:`CheckpointMismatchError`.
    """


class CheckpointMismatchError(CheckpointError, ValueError):
    """A checkpoint does not fit the state dict it is loaded into: a missing key, another shape,
    a tensor where the checkpoint holds an object (or the reverse), or a checkpoint of another model."""
