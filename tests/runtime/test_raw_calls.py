"""The raw C API surface: new_args, Client.c_pointer, Buffer.c_pointer, Library.call and .invoke on the real CPU plugin."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_support import CPU_OPTION_SCHEMA

from pjrt_plugins.runtime import Client, ClientClosedError, new_args
from pjrt_plugins.runtime._cdef import STRUCT_SIZE, ffi


def test_a_raw_call_with_the_client_pointer_agrees_with_the_wrapper(client8):
    args = new_args("PJRT_Client_PlatformName_Args")
    assert args.struct_size == STRUCT_SIZE["PJRT_Client_PlatformName_Args"]
    args.client = client8.c_pointer()
    client8.library.call("PJRT_Client_PlatformName", args)
    assert ffi.unpack(args.platform_name, args.platform_name_size).decode() == client8.platform_name


def test_a_raw_call_with_the_buffer_pointer_sees_the_uploaded_shape(client8):
    buffer = client8.buffer_from_host(np.zeros((2, 5), np.float32))
    args = new_args("PJRT_Buffer_Dimensions_Args")
    args.buffer = buffer.c_pointer()
    client8.library.call("PJRT_Buffer_Dimensions", args)
    assert list(ffi.unpack(args.dims, args.num_dims)) == [2, 5]
    buffer.delete()
    with pytest.raises(ValueError, match="deleted"):
        buffer.c_pointer()


def test_invoke_makes_the_args_struct_from_fields_and_returns_it(client8):
    buffer = client8.buffer_from_host(np.zeros((3, 4), np.float32))
    args = client8.library.invoke("PJRT_Buffer_Dimensions", buffer=buffer.c_pointer())
    assert args.struct_size == STRUCT_SIZE["PJRT_Buffer_Dimensions_Args"]
    assert list(ffi.unpack(args.dims, args.num_dims)) == [3, 4]
    with pytest.raises(KeyError, match="not a PJRT C API function"):
        client8.library.invoke("PJRT_Buffer_NoSuchFunction", buffer=buffer.c_pointer())


def test_pointers_are_refused_once_the_client_is_closed(cpu_library_path):
    client = Client(cpu_library_path, {"cpu_device_count": 1}, schema=CPU_OPTION_SCHEMA)
    buffer = client.buffer_from_host(np.arange(3.0))
    assert client.c_pointer() != ffi.NULL and buffer.c_pointer() != ffi.NULL
    client.close()
    with pytest.raises(ClientClosedError):
        client.c_pointer()
    with pytest.raises(ClientClosedError):
        buffer.c_pointer()


def test_the_library_reports_its_version_struct_size(client8):
    # The CPU plugin is built from the same header generation: its version struct is the full one.
    assert client8.library.api_version_struct_size == STRUCT_SIZE["PJRT_Api_Version"]
