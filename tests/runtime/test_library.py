"""The loader against real libraries: the CPU plugin, gcc-built broken ones, libtpu, CUDA, the stub."""

from __future__ import annotations

import logging
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _support import package_file, run_on_threads
from runtime_support import ADD_F32_4

from pjrt_plugins import PluginUnavailableError
from pjrt_plugins.runtime import (
    ApiVersionError,
    Client,
    LibraryLoadError,
    PluginInitializeTimeoutError,
    UnsupportedFunctionError,
    load_library,
)
from pjrt_plugins.runtime import _cdef
from pjrt_plugins.runtime._cdef import HEADER_MINOR, MIN_SUPPORTED_MINOR
from pjrt_plugins.runtime._elf import check_shared_library


def test_cpu_plugin_loads_with_version_attributes_and_extensions(cpu_library_path):
    lib = load_library(cpu_library_path)
    assert lib.api_version[0] == 0 and lib.api_version[1] >= MIN_SUPPORTED_MINOR
    assert lib.api_struct_size == 40 + 8 * 118  # the 0.81 table
    attributes = lib.attributes
    assert lib.initialized
    assert isinstance(attributes["xla_version"], int)
    current = attributes["stablehlo_current_version"]
    minimum = attributes["stablehlo_minimum_version"]
    assert len(current) == 3 and all(isinstance(v, int) for v in current)
    assert tuple(minimum) <= tuple(current)
    names = [name for _, name in lib.extensions]
    assert "Layouts" in names and "FFI" in names
    assert all(isinstance(kind, int) for kind, _ in lib.extensions)


def test_a_library_is_loaded_once_per_resolved_path(cpu_library_path, tmp_path):
    link = tmp_path / "alias.so"
    link.symlink_to(cpu_library_path)
    assert load_library(link) is load_library(cpu_library_path)
    assert load_library(str(cpu_library_path)) is load_library(cpu_library_path)


def test_has_function_and_the_error_for_a_function_newer_than_the_plugin(cpu_library_path):
    lib = load_library(cpu_library_path)
    assert lib.has_function("PJRT_Client_Create")
    assert not lib.has_function("PJRT_Event_Create")  # added in 0.89; the CPU plugin is 0.81
    with pytest.raises(UnsupportedFunctionError) as info:
        lib.function("PJRT_Event_Create")
    message = str(info.value)
    assert "PJRT_Event_Create" in message and "0.81" in message and "added in PJRT C API 0.89" in message
    assert info.value.function == "PJRT_Event_Create"
    assert info.value.plugin_version == lib.api_version
    assert info.value.added_in == (0, 89)
    assert isinstance(info.value, NotImplementedError)
    with pytest.raises(KeyError):
        lib.function("PJRT_No_Such_Function")


def test_missing_file(tmp_path):
    with pytest.raises(LibraryLoadError, match="does not exist"):
        load_library(tmp_path / "nope.so")


def test_directory_is_not_a_library(tmp_path):
    with pytest.raises(LibraryLoadError, match="not a regular file"):
        load_library(tmp_path)


def test_non_elf_file_renamed_so(tmp_path):
    fake = tmp_path / "libfake.so"
    fake.write_text("this is a text file, not a shared library\n")
    with pytest.raises(LibraryLoadError, match="not a shared library"):
        load_library(fake)


def test_an_elf_file_with_a_damaged_header(tmp_path):
    fake = tmp_path / "libdamaged.so"
    fake.write_bytes(b"\x7fELF" + b"\0" * 60)
    with pytest.raises(LibraryLoadError, match="damaged ELF header"):
        load_library(fake)


def test_a_truncated_copy_of_the_real_plugin_is_refused_before_dlopen(cpu_library_path, tmp_path, python_subprocess):
    """dlopen would map segments past the end of the file and die of SIGBUS (it does on today's loader)."""
    truncated = tmp_path / "libtruncated.so"
    with open(cpu_library_path, "rb") as whole:
        truncated.write_bytes(whole.read(8 << 20))
    result = python_subprocess(
        "from pjrt_plugins.errors import LibraryLoadError\n"
        "from pjrt_plugins.runtime import load_library\n"
        "try:\n"
        f"    load_library({str(truncated)!r})\n"
        "except LibraryLoadError as exc:\n"
        "    print('refused:', exc)\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused:" in result.stdout and "is truncated or damaged" in result.stdout
    assert f"the file has only {8 << 20} bytes" in result.stdout


@pytest.mark.parametrize(
    "change, match",
    [
        ({4: 1}, "is a 32-bit library"),
        ({16: 2}, "not a shared library \\(type 2\\)"),  # ET_EXEC
        ({18: 40}, "built for another CPU architecture"),  # EM_ARM
    ],
)
def test_an_elf_file_for_another_target_is_refused(cpu_library_path, tmp_path, change, match):
    """The header check alone (never dlopen: these files would crash the loader)."""
    with open(cpu_library_path, "rb") as whole:
        head = bytearray(whole.read(1 << 20))
    for offset, value in change.items():
        head[offset] = value
    library = tmp_path / "libother.so"
    library.write_bytes(bytes(head))
    with pytest.raises(LibraryLoadError, match=match):
        check_shared_library(str(library))


def test_the_real_plugin_passes_the_header_check(cpu_library_path):
    check_shared_library(str(cpu_library_path))


def test_library_without_get_pjrt_api(build_c_library):
    lib = build_c_library("int not_a_plugin(void) { return 1; }\n", name="noapi")
    with pytest.raises(LibraryLoadError, match="does not export GetPjrtApi"):
        load_library(lib)


def test_get_pjrt_api_returning_null(build_shim):
    with pytest.raises(LibraryLoadError, match="returned NULL"):
        load_library(build_shim(SHIM_NULL_API=True))


def test_wrong_major_version(build_shim):
    with pytest.raises(ApiVersionError, match=r"speaks PJRT C API 1\.\d+.*major version 0") as info:
        load_library(build_shim(SHIM_MAJOR=1))
    assert isinstance(info.value, LibraryLoadError)


def test_minor_below_the_oldest_supported(build_shim):
    with pytest.raises(ApiVersionError) as info:
        load_library(build_shim(SHIM_MINOR=40))
    message = str(info.value)
    assert "0.40" in message and f"0.{MIN_SUPPORTED_MINOR}" in message and "rearranged" in message


def test_minor_newer_than_our_header_loads_and_is_logged(build_shim, caplog):
    with caplog.at_level(logging.INFO, logger="pjrt_plugins.runtime._library"):
        lib = load_library(build_shim(SHIM_MINOR=200))
    assert lib.api_version == (0, 200)
    assert f"newer than the 0.{HEADER_MINOR} layout" in caplog.text


def test_table_too_small_for_its_header(build_shim):
    with pytest.raises(LibraryLoadError, match="smaller than its 40-byte header"):
        load_library(build_shim(SHIM_SLOTS=-1))


def test_table_without_error_functions_is_refused(build_shim):
    with pytest.raises(LibraryLoadError, match="cannot report errors.*PJRT_Error_GetCode"):
        load_library(build_shim(SHIM_SLOTS=2))


def test_slot_beyond_a_shrunk_table_is_gated_on_real_calls(build_shim):
    # The table stops before slot 94 (PJRT_Executable_Fingerprint): 0.81 functions beyond it,
    # like PJRT_Memory_Kind_Id (slot 97), must raise instead of reading past the table.
    lib = load_library(build_shim(SHIM_SLOTS=94))
    assert lib.api_struct_size == 40 + 8 * 94
    assert not lib.has_function("PJRT_Executable_Fingerprint")
    with Client(lib) as client:
        exe = client.compile(ADD_F32_4)
        assert exe.fingerprint is None  # "where available"
        x = client.buffer_from_host(np.ones(4, np.float32))
        assert exe.execute([[x, x]])[0][0].to_numpy().tolist() == [2.0] * 4
        with pytest.raises(UnsupportedFunctionError) as info:
            client.memories[0].kind_id
    message = str(info.value)
    assert "PJRT_Memory_Kind_Id" in message and "792 bytes" in message and "needs 824" in message
    assert info.value.plugin_version == lib.api_version


def test_function_added_after_an_older_plugins_version(build_shim):
    # A plugin at 0.72 with the 0.72 table (113 slots) lacks 0.79's GetDeviceAssignment.
    lib = load_library(build_shim(SHIM_MINOR=72, SHIM_SLOTS=113))
    with pytest.raises(UnsupportedFunctionError) as info:
        lib.function("PJRT_LoadedExecutable_GetDeviceAssignment")
    message = str(info.value)
    assert "PJRT C API 0.72" in message and "added in PJRT C API 0.79" in message and "upgrade the plugin" in message
    assert lib.has_function("PJRT_Client_CreateUninitializedBuffer")  # 0.69, inside the table


def test_a_table_overstating_its_size_answers_only_for_its_versions_slots(build_shim):
    """struct_size claims 64 more slots than the table has; after the table lie pointers to data."""
    lib = load_library(build_shim(SHIM_OVERSTATE_TABLE=True))
    assert lib.api_version == (0, 81)  # the real CPU plugin's
    assert lib.api_struct_size >= _cdef.slot_end("PJRT_TopologyDescription_Fingerprint")
    for name in ("PJRT_Client_CreateErrorBuffer", "PJRT_Device_GetAttributes", "PJRT_TopologyDescription_Fingerprint"):
        assert not lib.has_function(name), name
    with pytest.raises(UnsupportedFunctionError, match="more than its version has.*added in PJRT C API 0.82"):
        lib.function("PJRT_Client_CreateErrorBuffer")
    with Client(lib) as client:  # its real functions still work
        x = client.buffer_from_host(np.ones(4, np.float32))
        assert client.compile(ADD_F32_4).execute([[x, x]])[0][0].to_numpy().tolist() == [2.0] * 4


def test_slots_that_do_not_point_into_code_are_never_called(build_shim):
    """The same table claiming the newest version: its slots past the real table point to data."""
    lib = load_library(build_shim(SHIM_OVERSTATE_TABLE=True, SHIM_MINOR=HEADER_MINOR))
    assert not lib.has_function("PJRT_Client_CreateErrorBuffer")
    with pytest.raises(UnsupportedFunctionError, match="does not point into executable code"):
        lib.function("PJRT_Device_GetAttributes")
    assert lib.has_function("PJRT_Client_Compile")


def test_null_slot_is_reported_as_not_implemented(build_shim):
    lib = load_library(build_shim(SHIM_NULL_SLOT="PJRT_Executable_Serialize"))
    with Client(lib) as client:
        exe = client.compile(ADD_F32_4)
        with pytest.raises(UnsupportedFunctionError, match="unset \\(NULL\\).*does not implement it"):
            exe.serialize()


def test_initialize_timeout_then_later_success(build_shim):
    lib = load_library(build_shim(SHIM_INIT_SLEEP_MS=1500))
    with pytest.raises(PluginInitializeTimeoutError, match="did not return within 0.2 s") as info:
        lib.initialize(timeout=0.2)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, PluginUnavailableError)
    assert not lib.initialized
    lib.initialize(timeout=30)  # waits for the same first attempt; never calls Initialize twice
    assert lib.initialized


def test_initialize_runs_once_even_from_many_threads(build_c_library, cpu_library_path, cpu_header_dir):
    # A wrapper plugin that counts PJRT_Plugin_Initialize calls.
    source = textwrap.dedent(
        f"""
        #include <dlfcn.h>
        #include <string.h>
        #include <time.h>
        #include "pjrt_c_api.h"
        static PJRT_Api api; static const PJRT_Api* real; static int calls;
        int initialize_calls(void) {{ return calls; }}
        static PJRT_Error* init(PJRT_Plugin_Initialize_Args* a) {{
          __atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST);
          struct timespec ts = {{0, 100000000}}; nanosleep(&ts, 0);
          return real->PJRT_Plugin_Initialize(a);
        }}
        const PJRT_Api* GetPjrtApi(void) {{
          if (!real) {{
            void* h = dlopen("{cpu_library_path}", RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
            real = ((const PJRT_Api* (*)(void))dlsym(h, "GetPjrtApi"))();
            memcpy(&api, real, real->struct_size);
            api.PJRT_Plugin_Initialize = init;
          }}
          return &api;
        }}
        """
    )
    path = build_c_library(source, f"-I{cpu_header_dir}", name="countinit")
    lib = load_library(path)
    run_on_threads(lambda: lib.initialize(timeout=30), [()] * 6, timeout=None)
    lib.initialize()
    import cffi

    ffi = cffi.FFI()
    ffi.cdef("int initialize_calls(void);")
    assert ffi.dlopen(str(path), ffi.RTLD_NOW | ffi.RTLD_NODELETE).initialize_calls() == 1


def test_extension_chain_with_a_cycle_is_walked_once(build_shim, caplog):
    lib = load_library(build_shim(SHIM_EXT_CYCLE=True))
    with caplog.at_level(logging.WARNING, logger="pjrt_plugins.runtime._library"):
        assert lib.extensions == [(10, "Example"), (1, "Profiler")]
    assert "loops back" in caplog.text


def test_extension_with_a_too_small_struct_size_stops_the_walk(build_shim, caplog):
    lib = load_library(build_shim(SHIM_EXT_BAD_SIZE=True))
    with caplog.at_level(logging.WARNING, logger="pjrt_plugins.runtime._library"):
        assert lib.extensions == []
    assert "struct_size 8" in caplog.text


# -- the other real plugins installed here ---------------------------------------------------


def _libtpu() -> Path:
    path = package_file("libtpu", "libtpu.so")
    if path is None:
        pytest.skip("libtpu is not installed")
    return path


def _cuda_plugin() -> Path:
    for module in ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"):
        path = package_file(module, "xla_cuda_plugin.so")
        if path is not None:
            return path
    pytest.skip("no jax CUDA PJRT plugin wheel is installed")


def test_libtpu_loads_and_reports_its_version_without_initializing():
    # Never initialize libtpu here without TPU_SKIP_MDS_QUERY=1: off a TPU VM it hangs.
    lib = load_library(_libtpu())
    assert lib.api_version[0] == 0 and lib.api_version[1] >= MIN_SUPPORTED_MINOR
    assert lib.has_function("PJRT_Client_Create")
    assert not lib.initialized


def test_libtpu_client_creation_fails_fast_with_its_own_message(python_subprocess):
    path = _libtpu()
    code = textwrap.dedent(
        f"""
        import os, time
        os.environ["TPU_SKIP_MDS_QUERY"] = "1"
        from pjrt_plugins.runtime import Client, PjrtError
        start = time.monotonic()
        try:
            Client({str(path)!r}, initialize_timeout=60)
        except PjrtError as exc:
            print("ERROR", exc.code_name, exc.message)
        print("SECONDS", time.monotonic() - start)
        """
    )
    result = python_subprocess(code, timeout=180)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ERROR" in result.stdout and "TPU initialization failed" in result.stdout


def test_cuda_plugin_fails_fast_with_code_9_without_a_gpu_and_opens_with_one(python_subprocess):
    from pjrt_plugin_gpu._plugin import gpu_count

    path = _cuda_plugin()
    code = textwrap.dedent(
        f"""
        from pjrt_plugins.runtime import Client, PjrtError
        try:
            with Client({str(path)!r}, {{"preallocate": False}}) as client:
                print("OPENED", client.platform_name, len(client.devices))
        except PjrtError as exc:
            print("ERROR", exc.code, exc.code_name, exc.message)
        """
    )
    result = python_subprocess(code)
    assert result.returncode == 0, result.stderr[-2000:]  # and no crash at interpreter exit
    if gpu_count():  # a GPU machine (tests/plugins/test_gpu_hardware.py has the rest)
        assert f"OPENED cuda {gpu_count()}" in result.stdout, result.stdout
    else:
        assert "ERROR 9 FAILED_PRECONDITION No visible GPU devices." in result.stdout


def test_stub_plugin_loads_and_runs_buffers(stub_library):
    path = stub_library
    lib = load_library(path)
    assert lib.api_version[0] == 0 and lib.api_version[1] >= MIN_SUPPORTED_MINOR
    with Client(lib, {"num_devices": 2}, schema={"num_devices": int}) as client:
        assert len(client.devices) == 2
        data = np.arange(6, dtype=np.float32).reshape(2, 3)
        buf = client.buffer_from_host(data, device=client.devices[1])
        np.testing.assert_array_equal(buf.to_numpy(), data)


def test_loading_never_initializes(build_shim):
    lib = load_library(build_shim(SHIM_INIT_SLEEP_MS=1))
    assert not lib.initialized
    assert os.path.isabs(lib.path)
