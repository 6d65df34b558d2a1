"""Threads: close() and delete() never free a client, buffer or executable under a call on another thread.

Each case runs in its own interpreter, since a use after free kills the process. The shim
plugin built with SHIM_CHECK_LIFETIMES aborts on any call made with a handle that was already
destroyed, and sleeps inside the call so that the close or delete on the main thread lands
during it: without the runtime's call counting, every case below aborts.
"""

from __future__ import annotations

import pytest

# The child runs each scenario on a fresh client: start WORK on a thread, wait until it sleeps
# inside the plugin, run FINISH on this thread meanwhile, then report what happened.
CHILD = r"""
import sys, threading, time
import cffi
import numpy as np
from pjrt_plugins.errors import ClientClosedError
from pjrt_plugins.runtime import Client
from pjrt_plugins.conform._programs import ADD_F32

shim_path, scenarios = sys.argv[1], sys.argv[2:]
ffi = cffi.FFI()
ffi.cdef("int shim_calls_entered(void); void shim_set_sleep_ms(int ms);")
shim = ffi.dlopen(shim_path, ffi.RTLD_NOW | ffi.RTLD_NODELETE)

for scenario in scenarios:
    print("scenario", scenario, flush=True)
    client = Client(shim_path)
    exe = client.compile(ADD_F32)
    a = client.buffer_from_host(np.ones(4, np.float32))
    b = client.buffer_from_host(np.arange(4, dtype=np.float32))
    big = client.buffer_from_host(np.arange(1 << 17, dtype=np.float32))  # 512 KiB: read through ToHostBuffer
    work, finish, victim = {
        "close-during-upload": (lambda: client.buffer_from_host(np.ones(4, np.float32)).shape, client.close, None),
        "close-during-execute": (lambda: len(exe.execute([[a, b]])[0]), client.close, None),
        "close-during-read": (lambda: float(big.to_numpy()[-1]), client.close, None),
        "close-during-compile": (lambda: type(client.compile(ADD_F32)).__name__, client.close, None),
        "delete-during-read": (lambda: float(big.to_numpy()[-1]), big.delete, big),
        "delete-argument-during-execute": (lambda: exe.execute([[a, b]])[0][0].to_numpy().tolist(), a.delete, a),
        "delete-executable-during-execute": (lambda: exe.execute([[a, b]])[0][0].to_numpy().tolist(), exe.delete, exe),
        "delete-batch-with-argument-during-execute": (lambda: exe.execute([[a, b]])[0][0].to_numpy().tolist(),
                                                      lambda: client.delete_buffers([big, a]), a),
    }[scenario]
    outcome = {}

    def call():
        try:
            outcome["value"] = work()
        except Exception as exc:
            outcome["error"] = repr(exc)

    entered = shim.shim_calls_entered()
    shim.shim_set_sleep_ms(250)
    thread = threading.Thread(target=call)
    thread.start()
    while shim.shim_calls_entered() == entered:  # until the call sleeps inside the plugin
        time.sleep(0.001)
    started = time.monotonic()
    finish()
    waited = time.monotonic() - started
    shim.shim_set_sleep_ms(0)
    thread.join()
    print("outcome", outcome)
    print("finish waited for the call", waited > 0.1)
    if victim is None:
        print("client closed", client.closed, "live", len(client._live_buffers) + len(client._live_executables))
        try:
            client.buffer_from_host(np.ones(4, np.float32))
        except ClientClosedError:
            print("later call refused")
    else:
        registry = client._live_buffers if victim is not exe else client._live_executables
        print("freed after the call", id(victim) not in registry)
        if scenario.startswith("delete-batch"):  # the buffer no call used went at once, in the batch
            print("batch freed the unused one", id(big) not in registry)
        try:
            exe.execute([[a, b]]) if victim is not big else big.to_numpy()
        except ValueError as exc:
            print("later call refused:", exc)
        client.close()
    print("done", scenario, flush=True)
"""

RESULTS = {
    "close-during-upload": "(4,)",
    "close-during-execute": "1",
    "close-during-read": "131071.0",
    "close-during-compile": "'Executable'",
    "delete-during-read": "131071.0",
    "delete-argument-during-execute": "[1.0, 2.0, 3.0, 4.0]",
    "delete-executable-during-execute": "[1.0, 2.0, 3.0, 4.0]",
    "delete-batch-with-argument-during-execute": "[1.0, 2.0, 3.0, 4.0]",
}


@pytest.fixture(scope="module")
def lifetime_shim(build_shim):
    return build_shim(SHIM_CHECK_LIFETIMES=True)


def run_scenarios(python_subprocess, shim, scenarios: list[str]) -> dict[str, str]:
    """Run the child on ``scenarios``; returns each scenario's report. A use after free fails here."""
    code = CHILD.replace("sys.argv[1], sys.argv[2:]", f"{str(shim)!r}, {scenarios!r}")
    result = python_subprocess(code, timeout=120)
    assert "use after free" not in result.stderr, result.stdout + result.stderr[-2000:]
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    reports = {}
    for part in result.stdout.split("scenario ")[1:]:
        name, _, body = part.partition("\n")
        assert f"done {name}" in body, body
        reports[name] = body
    assert sorted(reports) == sorted(scenarios), result.stdout
    for name, body in reports.items():
        assert f"outcome {{'value': {RESULTS[name]}}}" in body, (name, body)  # the call completed
    return reports


def test_close_waits_for_calls_running_on_other_threads(python_subprocess, lifetime_shim):
    """close() during an upload, an execute, a large read or a compile waits for it, then frees
    everything (the executable that compile returns too); later calls raise ClientClosedError."""
    reports = run_scenarios(python_subprocess, lifetime_shim, ["close-during-upload", "close-during-execute",
                                                               "close-during-read", "close-during-compile"])
    for name, body in reports.items():
        assert "finish waited for the call True" in body, (name, body)
        assert "client closed True live 0" in body, (name, body)
        assert "later call refused" in body, (name, body)


def test_delete_frees_once_the_calls_using_it_end(python_subprocess, lifetime_shim):
    """delete() of a buffer being read or passed to an execute, or of the executing executable, and
    client.delete_buffers() of a batch holding such an argument, return at once; the call completes and frees it on its way out; later use raises ValueError."""
    reports = run_scenarios(python_subprocess, lifetime_shim, ["delete-during-read", "delete-argument-during-execute",
                                                               "delete-executable-during-execute",
                                                               "delete-batch-with-argument-during-execute"])
    for name, body in reports.items():
        assert "finish waited for the call False" in body, (name, body)
        assert "freed after the call True" in body, (name, body)
        assert "later call refused:" in body and "has been deleted" in body, (name, body)
    assert "batch freed the unused one True" in reports["delete-batch-with-argument-during-execute"]


STRESS = r"""
import threading, time, sys
import numpy as np
from pjrt_plugins.runtime import Client
from pjrt_plugins.conform._programs import ADD_F32

library = sys.argv[1]
current, stop = {}, threading.Event()

def worker(job):
    while not stop.is_set():
        objects = current.get("objects")
        if objects is None:
            time.sleep(0.0001)
            continue
        client, exe, a, b, big = objects
        try:
            if job == "execute":
                exe.execute([[a, b]])
            elif job == "read":
                big.to_numpy()  # through PJRT_Buffer_ToHostBuffer
                a.to_numpy()  # the direct read of a small buffer (the dispatch hot path)
            else:
                client.buffer_from_host(np.ones(4, np.float32))
        except (ValueError, RuntimeError):  # deleted / closed: the clean failures
            pass

threads = [threading.Thread(target=worker, args=(job,)) for job in ("execute", "execute", "read", "upload")]
for thread in threads:
    thread.start()
shared = Client(library)
shared_exe = shared.compile(ADD_F32)
for attempt in range(40):
    closing = attempt % 4 == 3
    client = Client(library) if closing else shared
    exe = client.compile(ADD_F32) if closing else shared_exe
    small = np.ones(4, np.float32)
    objects = (client, exe, client.buffer_from_host(small), client.buffer_from_host(small),
               client.buffer_from_host(np.ones(1 << 17, np.float32)))
    current["objects"] = objects
    time.sleep(0.0003 * (attempt % 7))
    if closing:
        client.close()
    else:
        objects[2 + attempt % 3].delete()
stop.set()
for thread in threads:
    thread.join()
shared.close()
print("ok")
"""


def test_threads_racing_close_and_delete_on_the_real_cpu_plugin(python_subprocess, cpu_library_path):
    """Three threads execute, read and upload while the main thread deletes their buffers and closes
    their clients (without the counted calls of _inflight, this crashed within a few attempts)."""
    result = python_subprocess(STRESS.replace("sys.argv[1]", repr(str(cpu_library_path))), timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("ok")


CONCURRENT = r"""
import sys, threading
import numpy as np
from pjrt_plugins.runtime import Client
from pjrt_plugins.conform._programs import ADD_F32

sys.setswitchinterval(1e-6)  # hand the GIL over between almost every two bytecodes
client = Client(sys.argv[1])
exe = client.compile(ADD_F32)
THREADS, ROUNDS = 6, 400
wrong, failed = [], []

def worker(t):
    try:
        a = client.buffer_from_host(np.full(4, t, np.float32))
        b = client.buffer_from_host(np.arange(4, dtype=np.float32) * 100)
        expected = np.arange(4, dtype=np.float32) * 100 + t
        for r in range(ROUNDS):
            [[out]] = exe.execute([[a, b]], wait=r % 2 == 0)
            got = out.to_numpy()
            if not np.array_equal(got, expected):
                wrong.append((t, r, got.tolist()))
    except BaseException as exc:
        failed.append(repr(exc))

threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
client.close()
print("wrong", len(wrong), wrong[:3], "failed", failed[:3])
"""


def test_concurrent_executes_of_one_executable_stay_correct(python_subprocess, cpu_library_path):
    """Six threads execute one executable at once, each with its own inputs, and read every output:
    each result is its own thread's (the reused argument frames are never shared by two executes)."""
    result = python_subprocess(CONCURRENT.replace("sys.argv[1]", repr(str(cpu_library_path))), timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("wrong 0 [] failed []"), result.stdout[-2000:]
