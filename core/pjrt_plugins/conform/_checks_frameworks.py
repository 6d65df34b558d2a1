"""Checks through the real consumers of a PJRT plugin: XLA's C++ client (jaxlib), JAX and torch_xla.

Our runtime gates every slot, so a plugin can pass every other check and still crash
JAX and torch_xla: their shared C++ client (``PjRtCApiClient``) calls some slots without
a NULL check. These checks list those slots, then drive the library through each
framework in a process of its own (``_framework_probe.py``); a crash there is a FAIL
that names the step and the NULL slots it calls.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from .._child_process import EventChild, child_environment, describe_exit, output_tail, python_command
from .._client_setup import checked_create_options
from . import _checks_buffers  # noqa: F401 - the checks these require are declared first
from ._context import Context
from ._framework import Fail, Skip, check
from ._framework_probe import PROBE_MARK, TORCH_XLA_PYTHON_ENV

#: Slots XLA's C++ client calls without a NULL check, by the step that calls them. Traced
#: through jaxlib 0.10.2 and torch_xla 2.9 (devices listed, an array moved there and back,
#: jax.jit, an array moved between devices). A slot that cannot be honoured must answer
#: UNIMPLEMENTED rather than be NULL.
XLA_CLIENT_SLOTS: dict[str, tuple[str, ...]] = {
    "load": ("PJRT_Plugin_Initialize", "PJRT_Error_Destroy", "PJRT_Error_Message", "PJRT_Error_GetCode"),
    "create": (
        "PJRT_Client_Create",
        "PJRT_Client_Destroy",
        "PJRT_Client_TopologyDescription",
        "PJRT_TopologyDescription_PlatformName",
        "PJRT_TopologyDescription_PlatformVersion",
        "PJRT_TopologyDescription_Attributes",
        "PJRT_TopologyDescription_Serialize",  # torch_xla
        "PJRT_Client_PlatformName",
        "PJRT_Client_PlatformVersion",
        "PJRT_Client_Devices",
        "PJRT_Client_AddressableDevices",
        "PJRT_Client_AddressableMemories",
        "PJRT_Client_LookupDevice",
        "PJRT_Plugin_Attributes",
        "PJRT_Device_GetDescription",
        "PJRT_Device_IsAddressable",
        "PJRT_Device_LocalHardwareId",
        "PJRT_Device_AddressableMemories",
        "PJRT_Device_DefaultMemory",
        "PJRT_DeviceDescription_Id",
        "PJRT_DeviceDescription_ProcessIndex",
        "PJRT_DeviceDescription_Attributes",
        "PJRT_DeviceDescription_Kind",
        "PJRT_DeviceDescription_DebugString",
        "PJRT_DeviceDescription_ToString",
        "PJRT_Memory_Kind",
        "PJRT_Memory_AddressableByDevices",
    ),
    "upload": (
        "PJRT_Client_BufferFromHostBuffer",
        "PJRT_Event_OnReady",
        "PJRT_Event_Destroy",
        "PJRT_Buffer_Device",
        "PJRT_Buffer_Memory",
        "PJRT_Buffer_IsOnCpu",
        "PJRT_Buffer_ElementType",
        "PJRT_Buffer_Dimensions",
        "PJRT_Buffer_UnpaddedDimensions",  # torch_xla
        "PJRT_Buffer_DynamicDimensionIndices",
        "PJRT_Buffer_IsDeleted",
    ),
    "download": ("PJRT_Buffer_ToHostBuffer", "PJRT_Buffer_Destroy"),
    # Not driven by the probes, but reached as soon as a user does more: jax.jit asks every device
    # for memory statistics before it compiles, and jax.device_put between devices copies.
    "compile": ("PJRT_Device_MemoryStats", "PJRT_Client_Compile"),
    "copy": ("PJRT_Buffer_CopyToMemory",),
}
#: What each probe step does, for messages.
STEPS: dict[str | None, str | None] = {
    "load": "loading and initializing the library",
    "create": "creating the client (its constructor also lists devices, memories and the topology)",
    "devices": "listing the devices",
    "upload": "putting an array on a device",
    "download": "reading the array back",
    "compile": "compiling (jax.jit)",
    "copy": "moving an array to another device",
}
_PROBE = Path(__file__).with_name("_framework_probe.py")
_PROBE_MODULE = "pjrt_plugins.conform._framework_probe"


def null_slots(ctx: Context, steps: tuple[str, ...] = tuple(XLA_CLIENT_SLOTS)) -> list[str]:
    """The slots XLA's C++ client calls in ``steps`` that this library leaves NULL (or beyond its table)."""
    library = ctx.library
    return [name for step in steps for name in XLA_CLIENT_SLOTS[step] if not library.has_function(name)]


@check("frameworks.slots", "every function XLA's C++ client (JAX, torch_xla) calls unchecked is present",
       requires=("abi.version",))
def check_slots(ctx: Context) -> str:
    missing = null_slots(ctx)
    if missing:
        raise Fail(
            f"NULL: {', '.join(missing)}. JAX and torch_xla call {'these' if len(missing) > 1 else 'this'} without a "
            "NULL check and crash (SIGSEGV); fill every slot, returning an UNIMPLEMENTED error where the "
            "plugin has nothing better"
        )
    return f"all {sum(len(v) for v in XLA_CLIENT_SLOTS.values())} present"


@check("frameworks.xla_client", "XLA's C++ client (jaxlib make_c_api_client) creates a client and lists the devices",
       requires=("client.devices",))
def check_xla_client(ctx: Context) -> str:
    if importlib.util.find_spec("jaxlib") is None:
        raise Skip("jaxlib is not installed here (`pip install jaxlib` to run this check)")
    result = run_probe(ctx, "xla_client", sys.executable)
    expected = len(ctx.client.devices)
    if result["devices"] != expected:
        raise Fail(f"XLA's C++ client sees {result['devices']} devices, pjrt-plugins sees {expected}")
    return f"platform {result['platform']!r}, {result['devices']} devices: {', '.join(result['described'])}"


@check("frameworks.jax", "JAX lists the devices and round-trips an array (jax.device_put)",
       requires=("frameworks.xla_client", "buffers.float32"))
def check_jax(ctx: Context) -> str:
    if importlib.util.find_spec("jax") is None:
        raise Skip("jax is not installed here (`pip install jax` to run this check)")
    result = run_probe(ctx, "jax", sys.executable)
    return f"{result['devices']} devices ({', '.join(result['described'])}); an f32[3,4] array came back equal"


@check("frameworks.torch_xla", "torch_xla creates the client, counts the devices and round-trips a tensor",
       requires=("client.devices", "buffers.float32"))
def check_torch_xla(ctx: Context) -> str:
    python = torch_xla_python()
    if python is None:
        raise Skip(
            f"torch_xla is not installed here; install it, or set {TORCH_XLA_PYTHON_ENV} to the python of an "
            "environment that has it"
        )
    result = run_probe(ctx, "torch_xla", python)
    expected = len(ctx.client.devices)
    if result["devices"] != expected:
        raise Fail(f"torch_xla counts {result['devices']} devices, pjrt-plugins sees {expected}")
    return f"{result['devices']} devices; an f32[3,4] tensor came back equal"


def torch_xla_python() -> str | None:
    """This interpreter if it has torch_xla, else the one named by PJRT_PLUGINS_TORCH_XLA_PYTHON, else ``None``."""
    if importlib.util.find_spec("torch_xla") is not None:
        return sys.executable
    other = os.environ.get(TORCH_XLA_PYTHON_ENV, "").strip()
    return other or None


def run_probe(ctx: Context, framework: str, python: str) -> dict[str, Any]:
    """Run ``_framework_probe.py framework`` on the plugin's library; its result, or a Fail naming what broke."""
    request = {"library_path": ctx.library_path, "options": probe_options(ctx)}
    # Both start isolated (-I). Our own interpreter gets exactly our import path; another one
    # (torch_xla's environment) keeps its own.
    if python == sys.executable:
        command, env = python_command(_PROBE_MODULE, framework), child_environment()
    else:
        command, env = [python, "-I", str(_PROBE), framework], dict(os.environ)
    env.pop("JAX_PLATFORMS", None)
    env.pop("PJRT_DEVICE", None)
    label = {"xla_client": "XLA's C++ client", "jax": "JAX", "torch_xla": "torch_xla"}[framework]
    timeout = ctx.target.timeout
    try:
        child = EventChild(_PROBE_MODULE, framework, mark=PROBE_MARK, stdin=json.dumps(request).encode(),
                           command=command, environ=env)
    except OSError as exc:
        raise Skip(f"cannot start {python}: {exc}") from None
    try:
        events = list(child.events(timeout, total=timeout))
        returncode = child.wait(timeout=10)
        output = child.stderr_text()
    finally:
        child.close()
    steps = [str(e["phase"]) for e in events if "phase" in e]
    step = steps[-1] if steps else None
    if child.timed_out:
        raise Fail(f"{label} did not finish {STEPS.get(step, step or 'starting')} within {timeout:g} s")
    for event in events:
        result = event.get("result")
        if isinstance(result, dict):
            return result
    errors = [str(e["error"]) for e in events if "error" in e]
    if errors and step is None:  # the framework itself did not import: nothing was asked of the plugin
        raise Skip(f"{label} cannot be used with {python}: {errors[-1]}")
    if errors:
        raise Fail(f"{label} failed {STEPS.get(step, step)}: {errors[-1]}")
    raise Fail(_crash_message(ctx, label, step, returncode, output))


def probe_options(ctx: Context) -> dict[str, Any]:
    """The create options the frameworks get: the plugin's hooks (checked) over --option values, or the options given."""
    if not ctx.has_python:
        return dict(ctx.target.options)
    options, _ = checked_create_options(ctx.plugin, ctx.target.options)
    return options


def _crash_message(ctx: Context, label: str, step: str | None, returncode: int, output: str) -> str:
    doing = STEPS.get(step, step) if step else "importing the framework"
    message = f"the {label} process {describe_exit(returncode)} while {doing}"
    reached = list(XLA_CLIENT_SLOTS)[: list(XLA_CLIENT_SLOTS).index(_slot_step(step)) + 1]
    missing = null_slots(ctx, tuple(reached))
    if missing:
        message += f"; it calls {', '.join(missing)} there, which the plugin leaves NULL"
    elif returncode < 0:
        message += "; no slot it calls there is NULL, so the crash is inside one of the plugin's functions"
    return message + output_tail(output, lines=4)


def _slot_step(step: str | None) -> str:
    """The XLA_CLIENT_SLOTS step a probe step belongs to (listing devices is part of client creation)."""
    if step == "devices":
        return "create"
    return step if step in XLA_CLIENT_SLOTS else "load"
