"""Waiting for an execution: Ctrl-C interrupts it, a bound ends it, a stall is reported, every run has its launch id.

A real long program on the real CPU plugin for Ctrl-C and the bound (in a child process: the
execution goes on in the plugin after the caller gives up), and the shim plugin for a stall
(its executions run for real, but their device-complete events never fire, as when the
devices deadlock inside a plugin: no real plugin deadlocks on demand) and for launch ids.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from runtime_support import ADD_F32_4, CPU_OPTION_SCHEMA, launch_ids, shim_report, spmd_square_and_sum

from pjrt_plugins import ExecutionStuckError
from pjrt_plugins.runtime import Client, CompileOptions

HERE = Path(__file__).resolve().parent
#: Iterations of runtime_support.busy_dot_loop: minutes of work, far longer than any bound below.
FOREVER = 10**9


def long_execute_child(library: Path, setup: str, handler: str) -> str:
    """Source of a child that starts a long execute() after ``setup`` and reports through ``handler``."""
    return f"""
import json, sys, time
import numpy as np
sys.path.insert(0, {str(HERE)!r})
from runtime_support import CPU_OPTION_SCHEMA, busy_dot_loop
from pjrt_plugins import ExecutionStuckError
from pjrt_plugins.runtime import Client
client = Client({str(library)!r}, {{"cpu_device_count": 1}}, schema=CPU_OPTION_SCHEMA)
exe = client.compile(busy_dot_loop({FOREVER}))
x = client.buffer_from_host(np.eye(32, dtype=np.float32))
{setup}
print("executing", flush=True)
start = time.monotonic()
try:
    exe.execute([[x]])
    print("completed", flush=True)
{handler}
"""


def test_ctrl_c_interrupts_a_long_execute(cpu_library_path):
    handler = """except KeyboardInterrupt:
    print(json.dumps({"interrupted_after": time.monotonic() - start}), flush=True)"""
    child = subprocess.Popen(
        [sys.executable, "-c", long_execute_child(cpu_library_path, "", handler)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "executing"
        time.sleep(1.0)
        child.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate()
        pytest.fail(f"the child did not exit within 60 s of Ctrl-C; it printed {out!r}, stderr {err[-2000:]!r}")
    report = json.loads(out.strip().splitlines()[-1])
    assert time.monotonic() - sent < 10 and report["interrupted_after"] < 10, (out, err)
    assert child.returncode == 0, err[-2000:]


def test_ctrl_c_between_the_launch_and_the_wait_does_not_hang_the_exit(cpu_library_path):
    # A Ctrl-C lands where Python happens to be: here right after the plugin accepted the
    # execution, before the wait owns its events (forced by raising it from the first step after
    # the launch). The exit must not wait for the plugin's threads, which still run the program.
    setup = """import pjrt_plugins.runtime._executable as executable_module
def ctrl_c_lands_here(*args, **kwargs):
    raise KeyboardInterrupt
executable_module.Executable._execute_errors = ctrl_c_lands_here"""
    # The program's thread may still be initializing the plugin's statics (oneDNN's gemm kernels)
    # when the process exits, which registers their destructors late: they must not run first.
    handler = """except KeyboardInterrupt:
    print(json.dumps({"unsettled": len(client._unsettled_executions)}), flush=True)
    sys.exit(3)"""
    try:
        result = subprocess.run([sys.executable, "-c", long_execute_child(cpu_library_path, setup, handler)],
                                capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the process did not exit within 60 s after the interrupted launch: {exc.stderr!r}")
    assert result.returncode == 3, (result.returncode, result.stderr[-2000:])  # the exit status is kept
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"unsettled": 1}
    assert "leaving the PJRT client" in result.stderr and "exiting without running the plugins' exit handlers" in (
        result.stderr
    ), result.stderr[-2000:]


def test_execute_timeout_bounds_the_wait(cpu_library_path):
    handler = """except ExecutionStuckError as exc:
    print(json.dumps({"program": exc.program, "devices": exc.devices, "reason": exc.reason,
                      "waited": exc.waited, "message": str(exc), "outputs_kept": len(client._live_buffers)}))"""
    code = long_execute_child(cpu_library_path, "client.execute_timeout = 0.5", handler)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["program"] == "busy_dot" and report["devices"] == [0] and report["reason"] == "timeout"
    assert 0.5 <= report["waited"] < 10
    assert "'busy_dot' did not complete on device(s) [0]" in report["message"]
    assert "execute_timeout of 0.5 s" in report["message"]
    assert report["outputs_kept"] == 1  # the input; the execution's output was released


@pytest.fixture(scope="module")
def stuck_client(build_shim):
    """An 8-device client on the shim whose executions never report completion."""
    client = Client(build_shim(SHIM_STUCK_EXECUTE=True), {"cpu_device_count": 8}, schema=CPU_OPTION_SCHEMA)
    yield client
    client.close()


def test_an_execution_that_uses_no_cpu_is_reported_stuck(stuck_client, build_shim):
    exe = stuck_client.compile(spmd_square_and_sum(8, 16), CompileOptions(num_partitions=8, use_spmd_partitioning=True))
    x = np.arange(16, dtype=np.float32)
    shards = [[stuck_client.buffer_from_host(x[2 * i : 2 * i + 2], device=d)] for i, d in enumerate(exe.addressable_devices)]
    stuck_client.stall_timeout = 1.0
    start = time.monotonic()
    with pytest.raises(ExecutionStuckError) as caught:
        exe.execute(shards)
    waited = time.monotonic() - start
    error = caught.value
    assert error.reason == "stalled" and error.devices == list(range(8)) and error.program == "conform_spmd"
    assert 1.0 <= error.waited <= waited < 15
    assert "used no CPU for the last 1 s" in str(error) and "restart the process" in str(error)
    assert isinstance(error, TimeoutError)
    assert shim_report(build_shim(SHIM_STUCK_EXECUTE=True)).count("on_ready;") == 8
    assert len(stuck_client._unsettled_executions) == 1
    # Closing does not wait for the plugin (its threads may never come back): it returns at once.
    stuck_client.stall_timeout = None
    start = time.monotonic()
    stuck_client.close()
    assert time.monotonic() - start < 5


def test_each_execution_gets_its_own_launch_id(build_shim):
    library = build_shim(SHIM_RECORD_LAUNCH_IDS=True)
    earlier = len(launch_ids(library))  # the shim's report spans the process
    with Client(library, {"cpu_device_count": 1}, schema=CPU_OPTION_SCHEMA) as client:
        exe = client.compile(ADD_F32_4)
        x = client.buffer_from_host(np.ones(4, np.float32))
        for _ in range(3):
            exe.execute([[x, x]])
    ids = launch_ids(library)[earlier:]
    assert len(ids) == 3 and ids[1] == ids[0] + 1 and ids[2] == ids[1] + 1


def test_a_plugin_without_event_callbacks_still_executes(build_shim):
    """Without PJRT_Event_OnReady the wait falls back to PJRT_Event_Await (not interruptible)."""
    with Client(build_shim(SHIM_NULL_SLOT="PJRT_Event_OnReady"), {"cpu_device_count": 1}, schema=CPU_OPTION_SCHEMA) as client:
        assert not client.library.has_function("PJRT_Event_OnReady")
        exe = client.compile(ADD_F32_4)
        x = client.buffer_from_host(np.arange(4, dtype=np.float32))
        [[out]] = exe.execute([[x, x]])
        np.testing.assert_array_equal(out.to_numpy(), [0, 2, 4, 6])


# -- time limits are checked where they are given ------------------------------------------------


@pytest.mark.parametrize(
    "value, error, message",
    [
        (float("nan"), ValueError, "must be a finite number of seconds above 0, got nan"),
        (float("inf"), ValueError, "must be a finite number of seconds above 0, got inf"),
        (1e308, ValueError, "must be at most 9223372036 seconds"),
        (-1, ValueError, "must be a finite number of seconds above 0, got -1"),
        (0, ValueError, "must be a finite number of seconds above 0, got 0"),
        ("10", TypeError, "must be a number of seconds, got str '10'; use None for no limit"),
        (True, TypeError, "must be a number of seconds, got bool True"),
    ],
)
def test_a_time_limit_that_cannot_be_kept_is_refused_where_it_is_given(client8, cpu_library_path, value, error, message):
    """nan or 1e308 as execute_timeout made a never-ending program hang; '10' failed deep inside the wait."""
    from pjrt_plugins.runtime import load_library

    for name in ("execute_timeout", "stall_timeout"):
        with pytest.raises(error, match=f"Client.{name} {message}"):
            setattr(client8, name, value)
        assert getattr(client8, name) is None  # left as it was
    with pytest.raises(error, match=message):
        load_library(cpu_library_path, timeout=value)
    with pytest.raises(error, match=message):
        client8.library.initialize(timeout=value)
    with pytest.raises(error, match=message):
        Client(cpu_library_path, initialize_timeout=value)
    with pytest.raises(error, match=message):
        client8.close(timeout=value)
    assert not client8.closed


def test_a_time_limit_may_be_any_real_number_of_seconds(client8):
    client8.execute_timeout = 5  # an int
    client8.stall_timeout = np.float64(2.5)
    assert (client8.execute_timeout, client8.stall_timeout) == (5.0, 2.5)
    client8.execute_timeout = client8.stall_timeout = None
