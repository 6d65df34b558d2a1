"""A plugin that reports success with an answer that cannot be used gets a PjrtError naming the
function, never a crash: the shim (shim_plugin.c) lies one way per build, over the real CPU plugin.

Each case runs in a child process on both paths (the compiled fast path and the Python one), so
a regression shows as the child's signal in a failed assertion instead of ending the test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

#: The child: ``lie(client)`` must raise PjrtError; it prints the message, then closes the client.
CHILD = """
import sys, numpy as np
from pjrt_plugins.errors import PjrtError
from pjrt_plugins.runtime import Client, _fastpath
from pjrt_plugins.conform._programs import ADD_F32

def lie(client):
{body}

client = Client(sys.argv[1], {{"cpu_device_count": 2}}, schema={{"cpu_device_count": int}}, plugin_name="liar")
live = len(client._live_buffers)
try:
    lie(client)
except PjrtError as exc:
    print("PjrtError:", exc.function, "|", exc.message, "|", exc.hint)
else:
    print("no error")
print("leaked", len(client._live_buffers) - live, "fast", _fastpath.library is not None)
client.close()
print("closed")
"""

CASES = {
    "null_data_pointer": (
        "SHIM_NULL_DATA_POINTER",
        "    client.buffer_from_host(np.arange(4, dtype=np.float32)).to_numpy()",
        "PJRT_Buffer_OpaqueDeviceMemoryDataPointer reported success but gave NULL as the address of the buffer's 16 bytes",
    ),
    "null_data_pointer_view": (
        "SHIM_NULL_DATA_POINTER",
        "    client.buffer_from_host(np.arange(4, dtype=np.float32)).host_view()",
        "gave NULL as the address of the buffer's 16 bytes",
    ),
    "null_output": (
        "SHIM_NULL_OUTPUT",
        "    x = client.buffer_from_host(np.ones(4, np.float32))\n"
        "    client.compile(ADD_F32).execute([[x, x]])",
        "PJRT_LoadedExecutable_Execute reported success but returned no output 0 for device 0 (NULL)",
    ),
    "null_output_no_wait": (
        "SHIM_NULL_OUTPUT",
        "    x = client.buffer_from_host(np.ones(4, np.float32))\n"
        "    client.compile(ADD_F32).execute([[x, x]], wait=False)",
        "returned no output 0 for device 0 (NULL)",
    ),
    "null_executable": (
        "SHIM_NULL_EXECUTABLE",
        "    client.compile(ADD_F32)",
        "PJRT_Client_Compile reported success but returned no executable",
    ),
    "null_ready_event": (
        "SHIM_NULL_READY_EVENT",
        "    client.buffer_from_host(np.ones(4, np.float32)).is_ready",
        "PJRT_Buffer_ReadyEvent reported success but returned no event",
    ),
    "devices_at_null": (
        "SHIM_LYING_LISTS",
        "    client.devices",
        "PJRT_Client_Devices reported success but gave 2 devices at address NULL",
    ),
    "a_negative_device_count": (
        "SHIM_LYING_LISTS",
        "    client.addressable_devices",
        f"PJRT_Client_AddressableDevices reported success but gave {2**64 - 1} devices, more than any plugin has",
    ),
    "a_null_device": (
        "SHIM_LYING_LISTS",
        "    client.lookup_device(0)",
        "PJRT_Client_LookupDevice reported success but gave a NULL device",
    ),
    "a_null_memory_in_a_list": (
        "SHIM_LYING_LISTS",
        "    client.lookup_addressable_device(0).memories",
        "PJRT_Device_AddressableMemories reported success but gave a NULL memory",
    ),
}


@pytest.mark.parametrize("path", ["compiled", "python"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_plugin_that_lies_gets_an_error_naming_the_function_not_a_crash(build_shim, case, path):
    switch, body, message = CASES[case]
    library = build_shim(**{switch: True})
    env = {**os.environ, "PJRT_PLUGINS_FASTPATH": "1" if path == "compiled" else "0"}
    code = CHILD.format(body=textwrap.indent(textwrap.dedent(body), "    ") if not body.startswith("    ") else body)
    run = subprocess.run([sys.executable, "-c", code, str(library)], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, f"the child {run.returncode}: {run.stderr[-3000:]}"
    assert "PjrtError:" in run.stdout and message in run.stdout, run.stdout + run.stderr[-2000:]
    assert "a bug in the plugin 'liar'" in run.stdout or "a bug in the plugin" in run.stdout
    assert f"leaked 0 fast {path == 'compiled'}" in run.stdout, run.stdout
    assert run.stdout.rstrip().endswith("closed")
