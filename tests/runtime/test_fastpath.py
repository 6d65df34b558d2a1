"""The runtime's compiled fast path (runtime/csrc/fastpath.c) and the Python path it stands in for.

The error tests run on both paths in one process: with ``_fastpath.library`` set to None, new
clients and executables build no plans and make every call from Python, as without the library.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pjrt_plugins
import pytest
from pjrt_plugins.errors import PjrtError
from pjrt_plugins.runtime import Client, CompileOptions, _build_fastpath, _executable, _fastpath, _pinning
from pjrt_plugins.runtime._buffer import Buffer
from pjrt_plugins.runtime._cdef import ffi
from pjrt_plugins.runtime._events import ReadyEvents
from runtime_support import ADD_F32_4, CPU_OPTION_SCHEMA, launch_ids, shim_report

RUNTIME_TESTS = Path(__file__).resolve().parent


@pytest.fixture(params=["compiled", "python"])
def runtime_path(request, monkeypatch) -> str:
    """Run the test on the compiled fast path, then on the Python path."""
    if request.param == "python":
        monkeypatch.setattr(_fastpath, "library", None)
    return request.param


def test_an_installed_package_runs_the_compiled_fast_path(cpu_library_path):
    assert _fastpath.library is not None, _fastpath.unavailable_reason
    with Client(cpu_library_path, {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA) as client:
        exe = client.compile(ADD_F32_4)
        x = client.buffer_from_host(np.arange(4, dtype=np.float32))
        [[out]] = exe.execute([[x, x]])
        np.testing.assert_array_equal(out.to_numpy(), [0, 2, 4, 6])
        assert exe._frames[1, 2][0].plan is not None  # the execute went through pjrtp_execute
        assert client._pinnings[0]._plan is not None  # and the read through pjrtp_read_pinned


def test_the_same_results_on_both_paths(runtime_path, cpu_library_path):
    with Client(cpu_library_path, {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA) as client:
        exe = client.compile(ADD_F32_4, CompileOptions(num_replicas=2))
        xs = [client.buffer_from_host(np.full(4, d + 1, np.float32), device=d) for d in range(2)]
        for wait in (True, False, True):
            outputs = exe.execute([[x, x] for x in xs], wait=wait)
            assert [o.to_numpy().tolist() for [o] in outputs] == [[2.0] * 4, [4.0] * 4]
        assert (exe._frames[2, 2][0].plan is not None) == (runtime_path == "compiled")


def _failing_execute_on_two_devices(client: Client) -> tuple[PjrtError, Any, list[Any]]:
    """``(error, executable, arguments)`` of the add on 2 devices, which the shim makes fail;
    checks that the failed execute freed its outputs."""
    exe = client.compile(ADD_F32_4, CompileOptions(num_replicas=2))
    xs = [client.buffer_from_host(np.ones(4, np.float32), device=d) for d in range(2)]
    live = len(client._live_buffers)
    with pytest.raises(PjrtError) as raised:
        exe.execute([[x, x] for x in xs])
    assert len(client._live_buffers) == live  # the outputs were freed, not leaked
    assert not client._calls and not client._handle_calls  # the counted call ended (execute writes it out)
    return raised.value, exe, xs


def test_a_failed_execution_raises_and_releases_its_outputs(runtime_path, build_shim):
    with Client(build_shim(SHIM_FAIL_EXECUTION=True), {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA) as client:
        error, exe, xs = _failing_execute_on_two_devices(client)
        assert error.function == "PJRT_LoadedExecutable_Execute"
        assert error.code_name == "INVALID_ARGUMENT"  # the error the shim's device returned
        outputs = exe.execute([[x, x] for x in xs], wait=False)  # no wait: nothing to report
        assert [o.to_numpy().tolist() for [o] in outputs] == [[2.0] * 4] * 2


def test_ready_events_give_each_event_its_error_from_an_array_or_a_sequence(runtime_path, build_shim):
    """ReadyEvents.errors (pjrtp_finish_ready, or the same calls from Python) on the device-complete
    events of a raw execute that the shim fails on both devices: each event's own error, from the
    frame's C array and from a list (copied into the plan's array, grown from 1 to 2)."""
    with Client(build_shim(SHIM_FAIL_EXECUTION=True), {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA) as client:
        exe = client.compile(ADD_F32_4, CompileOptions(num_replicas=2))
        xs = [client.buffer_from_host(np.ones(4, np.float32), device=d) for d in range(2)]
        exe.execute([[x, x] for x in xs], wait=False)  # makes the frame; no events asked
        frame = exe._frames[2, 2][0]
        for events_as in ("array", "list"):
            frame.args.device_complete_events = frame.events
            assert not frame.execute_fn(frame.args)  # the raw execute: its events are this test's to finish
            frame.args.device_complete_events = ffi.NULL  # as the frame left it (wait=False)
            outputs = [Buffer(client, frame.inner_outputs[d][0]) for d in range(2)]  # freed by the client
            events = frame.events if events_as == "array" else list(frame.events)
            ready = ReadyEvents(client._lib)
            assert (ready.plan is not None) == (runtime_path == "compiled")
            for _ in range(1000):  # None: not ready yet, nothing touched
                errors = ready.errors(events, "PJRT_LoadedExecutable_Execute")
                if errors is not None:
                    break
                time.sleep(0.01)
            assert errors is not None and len(errors) == 2, errors
            assert all(isinstance(e, PjrtError) and e.code_name == "INVALID_ARGUMENT" for e in errors), errors
            assert {e.function for e in errors} == {"PJRT_LoadedExecutable_Execute"}
            del outputs


def test_a_plugin_that_cannot_say_whether_an_execution_is_done_is_waited_for(runtime_path, build_shim, monkeypatch):
    """PJRT_Event_IsReady fails on every event (READINESS_UNKNOWN in C): its error is read and
    destroyed, and the execute waits for the events' callbacks instead, with the right results."""
    statuses: list[int] = []
    execute = _executable._pjrtp_execute
    if runtime_path == "compiled":
        monkeypatch.setattr(_executable, "_pjrtp_execute", lambda plan: statuses.append(execute(plan)) or statuses[-1])
    with Client(build_shim(SHIM_FAIL_EVENT_IS_READY=True), {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA) as client:
        exe = client.compile(ADD_F32_4, CompileOptions(num_replicas=2))
        xs = [client.buffer_from_host(np.full(4, d + 1, np.float32), device=d) for d in range(2)]
        for wait in (True, False, True):
            outputs = exe.execute([[x, x] for x in xs], wait=wait)
            assert [o.to_numpy().tolist() for [o] in outputs] == [[2.0] * 4, [4.0] * 4]
        assert not client._calls and not client._handle_calls
    # In C: IsReady failed (waited for in Python), no events asked (wait=False), IsReady failed.
    unknown, done = _fastpath.READINESS_UNKNOWN, _fastpath.DONE
    assert statuses == ([unknown, done, unknown] if runtime_path == "compiled" else [])


def test_a_failing_event_destroy_is_reported_after_every_event_is_destroyed(runtime_path, build_shim):
    path = build_shim(SHIM_FAIL_EVENT_DESTROY=True)
    with Client(path, {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA) as client:
        error, _, _ = _failing_execute_on_two_devices(client)
        assert error.function == "PJRT_Event_Destroy"
        # The report starts with the client: both events were destroyed, the second not left behind.
        assert shim_report(path).count("completion_destroy;") == 2


def test_delete_buffers_destroys_each_handle_once_and_reports_a_failure_after_all(runtime_path, build_shim):
    """client.delete_buffers (pjrtp_destroy_buffers, or the same calls from Python): a destroy that fails
    does not keep the others alive, the plugin's error is raised, and a second delete destroys nothing."""
    path = build_shim(SHIM_FAIL_BUFFER_DESTROY=True)
    with Client(path, {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA) as client:
        buffers = [client.buffer_from_host(np.full(4, i, np.float32)) for i in range(4)]
        before = shim_report(path).count("buffer_destroy;")
        with pytest.raises(PjrtError) as raised:
            client.delete_buffers(buffers)
        assert raised.value.function == "PJRT_Buffer_Destroy" and raised.value.code_name == "INVALID_ARGUMENT"
        assert shim_report(path).count("buffer_destroy;") - before == 4
        assert all(b.is_deleted for b in buffers) and not client._live_buffers
        client.delete_buffers(buffers + buffers)  # already deleted, listed twice: nothing is destroyed again
        assert shim_report(path).count("buffer_destroy;") - before == 4


def test_delete_buffers_frees_execute_outputs(runtime_path, cpu_library_path):
    with Client(cpu_library_path, {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA) as client:
        exe = client.compile(ADD_F32_4)
        x = client.buffer_from_host(np.arange(4, dtype=np.float32))
        outputs = exe.execute([[x, x]])[0] + exe.execute([[x, x]])[0]
        np.testing.assert_array_equal(outputs[1].to_numpy(), [0, 2, 4, 6])
        live = len(client._live_buffers)
        client.delete_buffers(iter(outputs))  # any iterable
        assert len(client._live_buffers) == live - 2 and all(b.is_deleted for b in outputs)
        with pytest.raises(ValueError, match="deleted"):
            outputs[0].to_numpy()
        np.testing.assert_array_equal(x.to_numpy(), [0, 1, 2, 3])  # the argument is untouched
        client.delete_buffers([])


def test_a_failing_read_names_the_function_and_drops_its_reference(runtime_path, build_shim):
    path = build_shim(SHIM_FAIL_DATA_POINTER=True)
    with Client(path, {"cpu_device_count": 1}, schema=CPU_OPTION_SCHEMA) as client:
        x = client.buffer_from_host(np.ones(4, np.float32))
        assert x.read_plan().mode == "direct"
        for _ in range(2):
            with pytest.raises(PjrtError) as raised:
                x.to_numpy()
            assert raised.value.function == "PJRT_Buffer_OpaqueDeviceMemoryDataPointer"
            assert not client._calls and not client._handle_calls  # the counted call ended (to_numpy writes it out)
        calls = shim_report(path).split(";")
        assert calls.count("hold") == 2 and calls.count("unhold") == 2  # every reference taken was dropped
        x.delete()  # not pinned: it frees


def test_executes_on_many_threads_get_distinct_consecutive_launch_ids(runtime_path, build_shim):
    library = build_shim(SHIM_RECORD_LAUNCH_IDS=True)
    earlier = len(launch_ids(library))  # the shim's report spans the process
    with Client(library, {"cpu_device_count": 1}, schema=CPU_OPTION_SCHEMA) as client:
        exe = client.compile(ADD_F32_4)
        x = client.buffer_from_host(np.ones(4, np.float32))

        def run() -> None:
            for _ in range(25):
                exe.execute([[x, x]])

        threads = [threading.Thread(target=run) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    ids = launch_ids(library)[earlier:]
    assert len(ids) == 100
    assert sorted(ids) == list(range(min(ids), min(ids) + 100))  # none taken twice, none skipped


# -- without the library -------------------------------------------------------------------------


def _package_copy(tmp_path: Path) -> Path:
    """A copy of the installed pjrt_plugins package (without its fast-path library) to import from."""
    source = Path(pjrt_plugins.__file__).parent
    target = tmp_path / "site" / "pjrt_plugins"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.so", "_template"))
    return target.parent


def _run_from(site: Path, cpu_library_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import warnings, numpy as np\n"
        "warnings.simplefilter('always')\n"
        "import pjrt_plugins\n"
        f"assert pjrt_plugins.__file__.startswith({str(site)!r}), pjrt_plugins.__file__\n"
        "from pjrt_plugins.runtime import Client, _fastpath\n"
        "from pjrt_plugins.conform._programs import ADD_F32\n"
        f"with Client({str(cpu_library_path)!r}) as client:\n"
        "    x = client.buffer_from_host(np.ones(4, np.float32))\n"
        "    [[out]] = client.compile(ADD_F32).execute([[x, x]])\n"
        "    print('result', out.to_numpy().tolist(), 'fast', _fastpath.library is not None)\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(site), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120)


def test_without_its_library_the_runtime_warns_once_and_runs_in_python(tmp_path, cpu_library_path):
    site = _package_copy(tmp_path)
    run = _run_from(site, cpu_library_path)
    assert run.returncode == 0, run.stderr
    assert "result [2.0, 2.0, 2.0, 2.0] fast False" in run.stdout
    assert run.stderr.count("RuntimeWarning") == 1
    assert "runs without its compiled fast path" in run.stderr and "is missing" in run.stderr
    assert "pip install --force-reinstall pjrt-plugins" in run.stderr


def test_a_damaged_library_is_never_loaded(tmp_path, cpu_library_path):
    site = _package_copy(tmp_path)
    (site / "pjrt_plugins" / "runtime" / _fastpath.LIBRARY_FILE).write_text("not a library\n")
    run = _run_from(site, cpu_library_path)
    assert run.returncode == 0, run.stderr
    assert "fast False" in run.stdout and "cannot be loaded" in run.stderr


def test_a_library_built_from_other_declarations_is_never_called(tmp_path, cpu_library_path, gcc):
    """A stale build (the declarations changed since): its checksum differs, so no plan is handed to it."""
    site = _package_copy(tmp_path)
    include = tmp_path / "include"
    include.mkdir()
    header = _build_fastpath.header_text()
    assert f"#define PJRTP_DECLARATIONS_CRC {_fastpath.FASTPATH_CRC}UL" in header
    (include / _build_fastpath.HEADER).write_text(header.replace(f"{_fastpath.FASTPATH_CRC}UL", "12345UL"))
    library = site / "pjrt_plugins" / "runtime" / _fastpath.LIBRARY_FILE
    source = Path(_fastpath.__file__).parent / "csrc" / "fastpath.c"
    subprocess.run([gcc, "-shared", "-fPIC", "-O1", f"-I{include}", "-o", str(library), str(source)], check=True)
    _build_fastpath.record_checksum(library)  # as the build does: the file itself is intact
    run = _run_from(site, cpu_library_path)
    assert run.returncode == 0, run.stderr
    assert "fast False" in run.stdout and "a stale build" in run.stderr


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no "])
def test_the_variable_turns_the_fast_path_off_quietly(cpu_library_path, value):
    run = _run_from(Path(pjrt_plugins.__file__).parents[1], cpu_library_path, PJRT_PLUGINS_FASTPATH=value)
    assert run.returncode == 0, run.stderr
    assert "fast False" in run.stdout and "RuntimeWarning" not in run.stderr


@pytest.mark.parametrize("value", ["1", "True", "on", ""])
def test_the_variable_leaves_the_fast_path_on(cpu_library_path, value):
    run = _run_from(Path(pjrt_plugins.__file__).parents[1], cpu_library_path, PJRT_PLUGINS_FASTPATH=value)
    assert run.returncode == 0, run.stderr
    assert "fast True" in run.stdout and "RuntimeWarning" not in run.stderr


def test_a_value_the_variable_cannot_have_warns_and_leaves_the_fast_path_on(cpu_library_path):
    run = _run_from(Path(pjrt_plugins.__file__).parents[1], cpu_library_path, PJRT_PLUGINS_FASTPATH="fast please")
    assert run.returncode == 0, run.stderr
    assert "fast True" in run.stdout
    assert "PJRT_PLUGINS_FASTPATH='fast please' is not a boolean (1/0, true/false, yes/no, on/off)" in run.stderr


# -- a damaged or replaced library: checked before it is opened ------------------------------


def _with_library(tmp_path: Path, library: Path | None = None, *, checksum: bool = True) -> Path:
    """A package copy with ``library`` (default: the installed one) as its fast path, and the
    installed build's checksum file unless ``checksum`` is False."""
    site = _package_copy(tmp_path)
    runtime = site / "pjrt_plugins" / "runtime"
    installed = Path(_fastpath.__file__).with_name(_fastpath.LIBRARY_FILE)
    shutil.copyfile(library or installed, runtime / _fastpath.LIBRARY_FILE)
    recorded = runtime / (_fastpath.LIBRARY_FILE + ".crc32")
    if checksum:
        shutil.copyfile(installed.with_name(installed.name + ".crc32"), recorded)
    elif recorded.exists():
        recorded.unlink()
    return site


def test_an_intact_copy_of_the_library_runs_the_fast_path(tmp_path, cpu_library_path):
    run = _run_from(_with_library(tmp_path), cpu_library_path)
    assert run.returncode == 0, run.stderr
    assert "fast True" in run.stdout and "RuntimeWarning" not in run.stderr


def test_a_library_with_flipped_code_bytes_is_never_opened(tmp_path, cpu_library_path):
    """Its checksum-of-declarations function made into an invalid instruction: calling it (as the
    import did, right after dlopen) killed the process with SIGILL."""
    from elftools.elf.elffile import ELFFile

    installed = Path(_fastpath.__file__).with_name(_fastpath.LIBRARY_FILE)
    data = bytearray(installed.read_bytes())
    with installed.open("rb") as file:
        elf = ELFFile(file)
        symbol = elf.get_section_by_name(".dynsym").get_symbol_by_name("pjrtp_declarations_crc")[0]
        address = symbol["st_value"]
        segment = next(s for s in elf.iter_segments() if s["p_type"] == "PT_LOAD" and s["p_vaddr"] <= address < s["p_vaddr"] + s["p_filesz"])
        offset = address - segment["p_vaddr"] + segment["p_offset"]
    data[offset : offset + 2] = b"\x0f\x0b"  # ud2
    damaged = tmp_path / "damaged.so"
    damaged.write_bytes(bytes(data))
    run = _run_from(_with_library(tmp_path, damaged), cpu_library_path)
    assert run.returncode == 0, f"the process {run.returncode}: {run.stderr[-2000:]}"
    assert "fast False" in run.stdout and run.stderr.count("RuntimeWarning") == 1
    assert "cannot be loaded: it is damaged or was replaced" in run.stderr


def test_a_library_whose_constructor_aborts_is_never_opened(tmp_path, cpu_library_path, gcc):
    """Another file in the library's place, whose constructor aborts: dlopen ran it and the process died."""
    source = tmp_path / "aborts.c"
    source.write_text(
        "#include <stdlib.h>\n"
        "__attribute__((constructor)) static void boom(void) { abort(); }\n"
        "unsigned long pjrtp_declarations_crc(void) { return 0; }\n"
    )
    library = tmp_path / "aborts.so"
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    run = _run_from(_with_library(tmp_path, library), cpu_library_path)
    assert run.returncode == 0, f"the process {run.returncode}: {run.stderr[-2000:]}"
    assert "fast False" in run.stdout and "it is damaged or was replaced" in run.stderr


def test_a_library_without_its_checksum_is_never_opened(tmp_path, cpu_library_path):
    run = _run_from(_with_library(tmp_path, checksum=False), cpu_library_path)
    assert run.returncode == 0, run.stderr
    assert "fast False" in run.stdout and "its build recorded no checksum" in run.stderr


# -- the private functions check their arguments ------------------------------------------------


CALLS_WITH_BAD_ARGUMENTS = r"""
from pjrt_plugins.runtime import Client, _fastpath
from pjrt_plugins.runtime._cdef import ffi
from pjrt_plugins.runtime._events import ReadyEvents
import sys
lib = _fastpath.library
assert lib is not None, _fastpath.unavailable_reason
client = Client(sys.argv[1])
ready = ReadyEvents(client._lib, 2)
events = ffi.new("PJRT_Event*[]", 2)
print("finish_ready NULL plan", lib.pjrtp_finish_ready(ffi.NULL, events, 2))
print("finish_ready NULL events", lib.pjrtp_finish_ready(ready.plan, ffi.NULL, 2))
print("finish_ready huge count", lib.pjrtp_finish_ready(ready.plan, events, 2**62))
print("finish_ready no events", lib.pjrtp_finish_ready(ready.plan, events, 0))
print("execute NULL plan", lib.pjrtp_execute(ffi.NULL))
empty = ffi.new("PJRTP_ExecutePlan*")
print("execute empty plan", lib.pjrtp_execute(empty))
print("read NULL plan", lib.pjrtp_read_pinned(ffi.NULL, ffi.NULL, ffi.NULL, 8) != ffi.NULL)
pinning = client._pinnings.take()
dst = ffi.new("char[]", 8)
print("read NULL buffer", lib.pjrtp_read_pinned(pinning._plan, ffi.NULL, dst, 8) != ffi.NULL, pinning._plan.failed_step)
print("read huge count", lib.pjrtp_read_pinned(pinning._plan, ffi.cast("PJRT_Buffer*", 8), dst, 2**63) != ffi.NULL, pinning._plan.failed_step)
handles, errors = ffi.new("PJRT_Buffer*[]", 2), ffi.new("PJRT_Error*[]", 2)
destroy = _fastpath.destroy_plan(client._destroy_buffer_fn, ffi.new("PJRT_Buffer_Destroy_Args*"))
print("destroy NULL plan", lib.pjrtp_destroy_buffers(ffi.NULL, handles, 2, errors))
print("destroy empty plan", lib.pjrtp_destroy_buffers(ffi.new("PJRTP_DestroyPlan*"), handles, 2, errors))
print("destroy NULL buffers", lib.pjrtp_destroy_buffers(destroy, ffi.NULL, 2, errors))
print("destroy NULL errors", lib.pjrtp_destroy_buffers(destroy, handles, 2, ffi.NULL))
print("destroy huge count", lib.pjrtp_destroy_buffers(destroy, handles, 2**62, errors))
print("destroy NULL handles", lib.pjrtp_destroy_buffers(destroy, handles, 2, errors))
client.close()
print("done")
"""


def test_the_private_functions_refuse_a_null_plan_or_a_huge_count(python_subprocess, cpu_library_path):
    """Passed a NULL plan or 2**62 events (or buffers), pjrtp_* read through NULL or past their arrays: a segfault."""
    result = python_subprocess(CALLS_WITH_BAD_ARGUMENTS.replace("sys.argv[1]", repr(str(cpu_library_path))))
    assert result.returncode == 0, f"the process {result.returncode}: {result.stderr[-2000:]}"
    invalid = _fastpath.INVALID_ARGUMENTS
    for line in ("finish_ready NULL plan", "finish_ready NULL events", "finish_ready huge count", "execute NULL plan",
                 "execute empty plan", "destroy NULL plan", "destroy empty plan", "destroy NULL buffers",
                 "destroy NULL errors", "destroy huge count"):
        assert f"{line} {invalid}\n" in result.stdout, result.stdout
    assert f"finish_ready no events {_fastpath.DONE}\n" in result.stdout
    assert "destroy NULL handles 0\n" in result.stdout  # NULL entries are skipped, none failed
    assert "read NULL plan True\n" in result.stdout
    assert f"read NULL buffer True {_fastpath.STEP_INVALID}\n" in result.stdout
    assert f"read huge count True {_fastpath.STEP_INVALID}\n" in result.stdout
    assert result.stdout.endswith("done\n")


def test_the_status_values_outside_the_declarations_are_the_c_library_s():
    source = (Path(_fastpath.__file__).parent / "csrc" / "fastpath.c").read_text()
    assert f"#define PJRTP_INVALID_ARGUMENTS ({_fastpath.INVALID_ARGUMENTS})" in source
    assert f"#define PJRTP_STEP_NO_DATA {_fastpath.STEP_NO_DATA}" in source
    assert f"#define PJRTP_STEP_INVALID {_fastpath.STEP_INVALID}" in source


def test_the_runtime_suite_passes_on_the_python_path():
    """The execute, wait, thread and buffer tests, rerun with PJRT_PLUGINS_FASTPATH=0."""
    files = ["test_executable.py", "test_waiting.py", "test_threads.py", "test_buffer.py", "test_host_view.py"]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        cwd=RUNTIME_TESTS,
        capture_output=True,
        text=True,
        env={**os.environ, "PJRT_PLUGINS_FASTPATH": "0"},
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout


def test_the_read_target_is_the_array_itself():
    """The direct read writes through cffi's from_buffer without its Python wrapper: the same
    char[] view over the same bytes as ``ffi.from_buffer``."""
    array = np.arange(6, dtype=np.float32)
    fast, wrapped = _pinning._char_buffer(array), ffi.from_buffer(array)
    assert ffi.typeof(fast) is ffi.typeof(wrapped) and len(fast) == len(wrapped) == array.nbytes
    assert int(ffi.cast("uintptr_t", fast)) == int(ffi.cast("uintptr_t", wrapped)) == array.ctypes.data
