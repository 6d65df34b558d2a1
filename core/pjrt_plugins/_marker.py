"""``@pjrt_plugins.hookimpl`` without importing pluggy, so `import pjrt_plugins` stays cheap.

It marks a function exactly as ``pluggy.HookimplMarker("pjrt_plugins")`` does (same
attribute, same options; a test pins the two together). pluggy itself is imported
when a plugin's hook manager is first built. Never import pluggy here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, overload

PROJECT_NAME = "pjrt_plugins"
#: The attribute pluggy's PluginManager reads a hook implementation's options from.
IMPL_ATTRIBUTE = PROJECT_NAME + "_impl"
#: The hooks of pjrt_plugins.hookspecs, known without importing it (a test keeps the two equal;
#: a name missing here only costs a look into hookspecs, never a wrong answer).
HOOK_NAMES = frozenset(
    {
        "pjrt_library_path",
        "pjrt_library_missing_hint",
        "pjrt_client_option_schema",
        "pjrt_client_create_options",
        "pjrt_check_client_options",
        "pjrt_client_create_environment",
        "pjrt_stall_timeout",
        "pjrt_local_process_rank",
        "pjrt_local_world_size",
        "pjrt_host_index",
        "pjrt_dense_gather_factor",
        "pjrt_rng_default",
        "pjrt_physical_chip_count",
        "pjrt_configure_single_process",
        "pjrt_configure_multiprocess",
        "pjrt_requires_coordinator",
        "pjrt_priority",
        "pjrt_unavailable_reason",
        "pjrt_preflight",
        "pjrt_initialize_timeout",
    }
)

_F = TypeVar("_F", bound=Callable[..., Any])


class HookimplMarker:
    """Decorator marking a method as a hook implementation (pluggy's options, pluggy's attribute)."""

    @overload
    def __call__(
        self,
        function: _F,
        *,
        hookwrapper: bool = ...,
        optionalhook: bool = ...,
        tryfirst: bool = ...,
        trylast: bool = ...,
        specname: str | None = ...,
        wrapper: bool = ...,
    ) -> _F: ...

    @overload
    def __call__(
        self,
        function: None = ...,
        *,
        hookwrapper: bool = ...,
        optionalhook: bool = ...,
        tryfirst: bool = ...,
        trylast: bool = ...,
        specname: str | None = ...,
        wrapper: bool = ...,
    ) -> Callable[[_F], _F]: ...

    def __call__(
        self,
        function: _F | None = None,
        *,
        hookwrapper: bool = False,
        optionalhook: bool = False,
        tryfirst: bool = False,
        trylast: bool = False,
        specname: str | None = None,
        wrapper: bool = False,
    ) -> _F | Callable[[_F], _F]:
        options = {
            "wrapper": wrapper,
            "hookwrapper": hookwrapper,
            "optionalhook": optionalhook,
            "tryfirst": tryfirst,
            "trylast": trylast,
            "specname": specname,
        }

        def mark(func: _F) -> _F:
            setattr(func, IMPL_ATTRIBUTE, dict(options))
            return func

        return mark if function is None else mark(function)


#: Decorate a backend's ``pjrt_*`` methods with this to implement a hook.
hookimpl = HookimplMarker()
