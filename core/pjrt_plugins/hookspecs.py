"""The DevicePlugin contract: every hook a backend may implement, as pluggy specs.

This module is the vendor's reference page. It declares hooks only; the core's
defaults live in ``_defaults.py`` and backends override just what differs.

Each backend gets its own :class:`pluggy.PluginManager`, so a hook call for one
device never sees another backend's answers. Within that manager the core
defaults are registered first (``trylast``), then the backend, then any site or
user overrides: the newest registration answers first, and for the
``firstresult`` hooks returning ``None`` means "no opinion, ask the next one".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import pluggy

from ._marker import PROJECT_NAME, hookimpl  # noqa: F401 - hookimpl: decorate a backend's methods with it

hookspec = pluggy.HookspecMarker(PROJECT_NAME)


@hookspec(firstresult=True)
def pjrt_library_path() -> str | os.PathLike[str] | None:
    """Absolute path of the PJRT C API shared library (it exports ``GetPjrtApi``).

    Called when a client is first created, never at import. Resolve the path
    cheaply (look inside your installed package, honour an environment override)
    and do not open the library. Return ``None`` if it cannot be found: the core
    then reports the plugin as unavailable, with :func:`pjrt_library_missing_hint`.
    An override that names no file is a setting the user got wrong: raise
    :class:`pjrt_plugins.PluginConfigurationError` (``find_library`` does).
    """


@hookspec(firstresult=True)
def pjrt_library_missing_hint() -> str | None:
    """What to do when the library is missing: the package to install, the variable to set.

    The core owns what follows from a missing library, so a backend states only this.
    When :func:`pjrt_library_path` returns ``None`` (or a path with no file behind it),
    the plugin is unavailable with ``"its PJRT library could not be found; <hint>"``
    (default selection skips it, ``pjrt-plugins list`` and ``doctor`` show why), and
    creating a client raises :class:`pjrt_plugins.PluginUnavailableError` with the same
    text before any other hook runs: :func:`pjrt_unavailable_reason` and
    :func:`pjrt_preflight` may assume the library is there.
    For example ``"run `pip install xla-cpu-pjrt` or set PJRT_CPU_LIBRARY_PATH"``.
    Default: ``None`` (the core says to reinstall the plugin's distribution).
    """


@hookspec(firstresult=True)
def pjrt_client_option_schema() -> Mapping[str, Any] | None:
    """The create options the library understands, as ``{name: type}``.

    Types are ``str``, ``int``, ``float``, ``bool`` or ``list[int]`` (or a
    :class:`pjrt_plugins.OptionType`). Options are checked against this schema in
    Python before ``PJRT_Client_Create``: an unknown name raises ``ValueError``
    listing the known ones and a wrong type raises ``TypeError``. This matters
    because some plugins abort the whole process on a mistyped option and
    silently ignore unknown ones. ``None`` (the default) means "no schema": types
    are inferred from the Python values and names are not checked.
    """


@hookspec(firstresult=True)
def pjrt_client_create_options() -> dict[str, Any] | None:
    """Options passed to ``PJRT_Client_Create`` as ``PJRT_NamedValue``s.

    Called after the configure hooks, just before the client is created, so it
    may depend on the rank and world size. Options given by the caller of
    ``create_client`` are laid over this dict. Default: ``{}``.
    """


@hookspec
def pjrt_check_client_options(options: Mapping[str, Any]) -> None:
    """Check the values of the create options just before ``PJRT_Client_Create``.

    ``options`` are the merged options (the backend's with the caller's laid
    over them), already checked against the schema for names and types. Raise
    ``ValueError`` saying what is wrong and how to fix it for a value the library
    would mishandle: the CPU plugin makes a client with no devices for
    ``cpu_device_count=0`` and never finishes creating one with 100000. Every
    implementation runs.
    """


@hookspec(firstresult=True)
def pjrt_client_create_environment(options: Mapping[str, Any]) -> Mapping[str, str] | None:
    """Environment variables the library reads while it creates its client.

    They are set only for the duration of ``PJRT_Client_Create`` and then restored, for
    libraries that take some settings from the environment alone (XLA reads
    ``XLA_FLAGS`` and ``PJRT_NPROC`` there). ``options`` are the merged create options.
    A value replaces the process's own for that call, so build on what the user set:
    the CPU backend appends its XLA flags to the user's ``XLA_FLAGS`` and leaves out any
    flag the user gave. Default: ``{}``.
    """


@hookspec(firstresult=True)
def pjrt_stall_timeout() -> float | None:
    """Seconds an execution may wait while the process uses no CPU at all before it is declared stuck.

    Only for libraries whose devices are host threads, where a running execution
    always uses CPU: a wait that sees none for this long is a deadlock inside the
    library, and :class:`pjrt_plugins.ExecutionStuckError` (naming the program and its
    devices) is raised instead of waiting forever. Becomes the client's
    ``stall_timeout``. Default: ``None`` (no such check; right for accelerators,
    whose host thread idles while the device computes).
    """


@hookspec(firstresult=True)
def pjrt_local_process_rank() -> int | None:
    """This process's rank among the processes on this host.

    Default: ``PJRT_LOCAL_PROCESS_RANK``, then ``LOCAL_RANK`` (set by torchrun),
    then 0.
    """


@hookspec(firstresult=True)
def pjrt_local_world_size() -> int | None:
    """How many processes share this host's devices.

    Default: ``PJRT_LOCAL_PROCESS_COUNT``, then ``LOCAL_WORLD_SIZE`` (set by
    torchrun), then 1.
    """


@hookspec(firstresult=True)
def pjrt_host_index() -> int | None:
    """Index of this host among all hosts (PJRT only knows processes).

    Default: ``GROUP_RANK`` (torchrun's node rank), then 0.
    """


@hookspec(firstresult=True)
def pjrt_dense_gather_factor() -> int | None:
    """When gathers stay dense (one-hot / matmul form) instead of sparse.

    A gather stays dense unless the gathered dimension exceeds ``factor * 10``.
    Return ``0`` for "always sparse", which is the default: most devices gather
    sparsely. TPU and Neuron return 8192. When a backend uses dense gathers the
    environment variable ``XLA_DENSE_GATHER_FACTOR`` overrides its factor.
    """


@hookspec(firstresult=True)
def pjrt_rng_default() -> str | None:
    """The RNG algorithm for random ops: ``"default"``, ``"three_fry"`` or ``"philox"``.

    Default: ``"default"`` (the device's own choice); GPUs historically use
    ``"three_fry"``. The environment variable ``XLA_RNG_BIT_GENERATOR`` overrides
    any backend.
    """


@hookspec(firstresult=True)
def pjrt_physical_chip_count() -> int | None:
    """Number of physical chips on this host (the process count torchrun expects).

    Must be cheap and must not open the library. ``0`` means no hardware is
    present here, which makes the plugin unavailable for default selection.
    Default: 1.
    """


@hookspec
def pjrt_configure_single_process() -> None:
    """Set up this process to use every local device, before the client exists.

    Every implementation runs (backend and overrides); typically they set
    environment variables the library reads.
    """


@hookspec
def pjrt_configure_multiprocess(local_rank: int, local_world_size: int) -> None:
    """Assign this process its share of the host's devices, before the client exists.

    Called instead of :func:`pjrt_configure_single_process` when the local world
    size is above 1 (torchrun). Each process should get a different device:
    never leave every process on device 0. Every implementation runs.
    """


@hookspec(firstresult=True)
def pjrt_requires_coordinator() -> bool | None:
    """Whether the client needs a key-value store shared by all processes.

    When true, ``pjrt_plugins.distributed`` supplies the KV callbacks from
    torch.distributed's store. Default: ``False``.
    """


@hookspec(firstresult=True)
def pjrt_priority() -> int | None:
    """Rank among available plugins when no ``PJRT_DEVICE`` is set; highest wins.

    Default: 0. Reference values: tpu 300, gpu 200, cpu 0, stub_neuron -100.
    """


@hookspec(firstresult=True)
def pjrt_unavailable_reason() -> str | None:
    """Why the plugin cannot run here, with what to do, or ``None`` if it can.

    Must be cheap: no library is opened. Called only when the library is there (the
    core reports a missing one, see :func:`pjrt_library_missing_hint`); after it, the
    core reports a physical chip count of 0. A setting the user got wrong is
    not a reason: raise :class:`pjrt_plugins.PluginConfigurationError` naming it
    (``find_library``, ``env_int``, ``env_bool`` and ``env_value`` do), so that
    default selection reports it instead of choosing another plugin.
    """


@hookspec
def pjrt_preflight() -> None:
    """Last check before the library is initialized; raise to stop client creation.

    Raise :class:`pjrt_plugins.PluginUnavailableError` with the reason and the
    fix. Use it when initializing without hardware would block or crash (libtpu
    hangs for minutes off a TPU VM). Runs after the configure hooks and after the
    core found the library (a missing one stops creation first, see
    :func:`pjrt_library_missing_hint`). Must return within a second. Every
    implementation runs.
    """


@hookspec(firstresult=True)
def pjrt_initialize_timeout() -> float | None:
    """Seconds to wait for ``PJRT_Plugin_Initialize`` before giving up. Default: 60."""
