"""Checks of a registered plugin's Python side: it loads, its hooks answer with the right types,
its option schema and default options are valid, and PyTorch/XLA's method contract holds.

Hooks that write the environment run inside :func:`preserved_environment`, so the
C API checks that follow see the process as a user's would.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from numbers import Real
from typing import Any

import pjrt_plugins

from .._plugin import RNG_ALGORITHMS
from .._registry import plugin_record
from .._torch_xla import TorchXlaStylePlugin, torch_xla_contract_problems, torch_xla_name_problem
from ..errors import PluginUnavailableError
from ..options import validate_options
from ._context import Context, preserved_environment
from ._framework import Fail, check, describe

#: The hook contract says the preflight "must return within a second".
PREFLIGHT_BUDGET_S = 1.0


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _library_path_ok(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        return f"returned {type(value).__name__}, expected str, os.PathLike or None"
    if not os.path.isabs(os.fspath(value)):
        return f"returned the relative path {os.fspath(value)!r}; return an absolute path"
    return None


def _int_at_least(low: int) -> tuple[str, Any]:
    return f"an int >= {low}", lambda v: None if _is_int(v) and v >= low else f"returned {describe(v)}"


#: hook -> (what it must return, the test). A test returns a problem or None.
HOOK_EXPECTATIONS: dict[str, tuple[str, Any]] = {
    "pjrt_library_path": ("an absolute path or None", _library_path_ok),
    "pjrt_library_missing_hint": (
        "a str or None",
        lambda v: None if v is None or isinstance(v, str) else f"returned {describe(v)}",
    ),
    "pjrt_client_option_schema": (
        "a mapping or None",
        lambda v: None if v is None or isinstance(v, Mapping) else f"returned {type(v).__name__}",
    ),
    "pjrt_client_create_options": (
        "a dict",
        lambda v: None if isinstance(v, dict) else f"returned {type(v).__name__}",
    ),
    "pjrt_local_process_rank": _int_at_least(0),
    "pjrt_local_world_size": _int_at_least(1),
    "pjrt_host_index": _int_at_least(0),
    "pjrt_dense_gather_factor": _int_at_least(0),
    "pjrt_rng_default": (
        f"one of {', '.join(RNG_ALGORITHMS)}",
        lambda v: None if isinstance(v, str) and v.strip().lower() in RNG_ALGORITHMS else f"returned {describe(v)}",
    ),
    "pjrt_physical_chip_count": _int_at_least(0),
    "pjrt_requires_coordinator": ("a bool", lambda v: None if isinstance(v, bool) else f"returned {describe(v)}"),
    "pjrt_priority": ("an int", lambda v: None if _is_int(v) else f"returned {describe(v)}"),
    "pjrt_unavailable_reason": (
        "a str or None",
        lambda v: None if v is None or isinstance(v, str) else f"returned {describe(v)}",
    ),
    "pjrt_initialize_timeout": (
        "a number of seconds > 0",
        lambda v: None if isinstance(v, Real) and not isinstance(v, bool) and float(v) > 0 else f"returned {describe(v)}",
    ),
}


@check("python.load", "the plugin loads from its entry point", python=True)
def check_load(ctx: Context) -> str:
    plugin = ctx.plugin  # PluginLoadError (with the original exception as its cause) fails the check
    if not isinstance(plugin, pjrt_plugins.DevicePlugin):
        raise Fail(f"the registry holds {type(plugin).__name__}, not a DevicePlugin")
    record = next((r for r in pjrt_plugins.plugin_records() if r.name == plugin.name), None)
    origin = record.origin if record is not None else "registered at run time"
    wrapped = getattr(plugin, "wrapped", None)
    kind = type(wrapped if wrapped is not None else plugin).__qualname__
    version = f" {plugin.distribution_version}" if plugin.distribution_version else ""
    return f"{kind} from {plugin.distribution or 'no distribution'}{version} ({origin})"


@check("python.hooks", "every hook answers with the right type", requires=("python.load",), python=True)
def check_hooks(ctx: Context) -> str:
    hook = ctx.plugin.hook
    problems = []
    with preserved_environment():
        for name, (expected, test) in HOOK_EXPECTATIONS.items():
            try:
                value = getattr(hook, name)()
            except Exception as exc:  # noqa: BLE001 - a raising hook is the finding
                problems.append(f"{name}() raised {type(exc).__name__}: {exc}")
                continue
            problem = test(value)
            if problem:
                problems.append(f"{name}() {problem}; it must return {expected}")
    if problems:
        raise Fail("; ".join(problems))
    return f"{len(HOOK_EXPECTATIONS)} hooks answered with the right types"


@check("python.option_schema", "the create-option schema is valid", requires=("python.load",), python=True)
def check_option_schema(ctx: Context) -> str:
    try:
        schema = ctx.plugin.option_schema()
    except TypeError as exc:
        raise Fail(f"pjrt_client_option_schema: {exc}") from None
    if schema is None:
        return "no schema: option names are not checked and types are inferred from values"
    listing = ", ".join(f"{name}: {kind.name.lower()}" for name, kind in sorted(schema.items()))
    return f"{len(schema)} option{'s' if len(schema) != 1 else ''} ({listing or 'none'})"


@check(
    "python.create_options",
    "the default create options pass the schema and the value check",
    requires=("python.option_schema",),
    python=True,
)
def check_create_options(ctx: Context) -> str:
    plugin = ctx.plugin
    label = f"plugin {plugin.name!r}"
    with preserved_environment():
        options = plugin.client_create_options()
        schema = plugin.option_schema()
        merged = {**options, **ctx.target.options}
        try:
            validate_options(options, schema, plugin=label)
        except (TypeError, ValueError) as exc:
            raise Fail(f"the plugin's own default options are refused by its schema: {exc}") from None
        try:
            validate_options(merged, schema, plugin=label)
            plugin.hook.pjrt_check_client_options(options=dict(merged))
        except (TypeError, ValueError) as exc:
            if ctx.target.options:
                raise Fail(f"the options given with -o are refused: {exc}") from None
            raise Fail(f"the plugin's own default options are refused by pjrt_check_client_options: {exc}") from None
    return "defaults " + (", ".join(f"{k}={v!r}" for k, v in sorted(options.items())) or "(none)")


@check(
    "python.torch_xla",
    "PyTorch/XLA's DevicePlugin method contract holds, and PJRT_DEVICE can select the entry point",
    requires=("python.load",),
    python=True,
)
def check_torch_xla(ctx: Context) -> str:
    plugin = ctx.plugin
    if isinstance(plugin, TorchXlaStylePlugin):
        raise Fail(
            f"the entry point gives a plain {type(plugin.wrapped).__qualname__}, not a DevicePlugin subclass: "
            "`import torch_xla` crashes on it (TypeError: _register_pjrt_plugin(): incompatible function "
            "arguments). Subclass pjrt_plugins.DevicePlugin"
        )
    unavailable = plugin.unavailable_reason()
    with preserved_environment():
        problems = torch_xla_contract_problems(plugin, call_configure=True)
    if unavailable is not None:
        # PyTorch/XLA would meet the same refusal, and only when this device is selected: not a defect.
        problems = [p for p in problems if not p.startswith(f"library_path() raised {PluginUnavailableError.__name__}")]
    entry_name = plugin_record(ctx.target.plugin or "").entry_name  # the spelling torch_xla registers
    name_problem = torch_xla_name_problem(entry_name) if entry_name else None
    if name_problem is not None:
        problems.insert(0, f"entry point {entry_name!r}: {name_problem}")
    if problems:
        raise Fail("; ".join(problems))
    return (
        "library_path, client_create_options, requires_xla_coordinator, configure_*, physical_chip_count, "
        "host_index; the entry point's name is one PJRT_DEVICE can select"
    )


@check("python.preflight", "the preflight answers quickly and refuses only with PluginUnavailableError",
       requires=("python.load",), python=True)
def check_preflight(ctx: Context) -> str:
    plugin = ctx.plugin
    started = time.monotonic()
    with preserved_environment():
        try:
            plugin.preflight()
            verdict = "passes"
        except PluginUnavailableError as exc:
            verdict = f"refuses (expected without the hardware): {exc}"
    elapsed = time.monotonic() - started
    slow = f"; slow: {elapsed:.2f} s, the hook contract asks for under {PREFLIGHT_BUDGET_S:g} s" if elapsed > PREFLIGHT_BUDGET_S else ""
    return f"{verdict}{slow}"

