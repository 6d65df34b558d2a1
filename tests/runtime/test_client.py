"""Client, Device and Memory on the real CPU plugin: facts, options, lifetime and destroy order."""

from __future__ import annotations

import gc
import textwrap
import weakref

import numpy as np
import pytest
from runtime_support import ADD_F32_4, CPU_OPTION_SCHEMA, shim_report

from pjrt_plugins.runtime import Client, ClientClosedError, Device, PjrtError, load_library


def test_platform_and_process_facts(client8):
    assert client8.platform_name == "cpu"
    assert isinstance(client8.platform_version, str) and client8.platform_version
    assert client8.process_index == 0
    assert client8.plugin_name == "cpu"


def test_devices(client8):
    devices = client8.devices
    assert [d.id for d in devices] == list(range(8))
    assert client8.addressable_devices == devices
    for device in devices:
        assert isinstance(device, Device)
        assert device.kind == "cpu"
        assert device.process_index == 0
        assert device.is_addressable
        assert isinstance(device.local_hardware_id, int)
        assert isinstance(device.attributes, dict)
        assert str(device) == f"CpuDevice(id={device.id})"
        assert f"id={device.id}" in repr(device)
        assert device.debug_string
    assert client8.devices[3] is devices[3]  # one Device object per PJRT_Device


def test_lookup_device(client8):
    assert client8.lookup_device(5) is client8.devices[5]
    with pytest.raises(PjrtError) as info:
        client8.lookup_device(99)
    assert info.value.code_name == "INVALID_ARGUMENT" and "99" in info.value.message
    assert info.value.function == "PJRT_Client_LookupDevice"


def test_memories(client8):
    kinds = {m.kind for m in client8.memories}
    assert "device" in kinds
    device = client8.devices[2]
    default = device.default_memory
    assert default.kind == "device"
    assert default in device.memories
    assert device in default.addressable_by_devices
    assert isinstance(default.kind_id, int)
    assert str(default) and repr(default).startswith("<pjrt Memory")


def test_default_device_assignment(client8):
    assert client8.default_device_assignment(1, 8) == [list(range(8))]
    replicas = client8.default_device_assignment(8)
    assert len(replicas) == 8 and all(len(row) == 1 for row in replicas)
    assert sorted(d for row in replicas for d in row) == list(range(8))
    grid = client8.default_device_assignment(2, 4)
    assert sorted(d for row in grid for d in row) == list(range(8))
    with pytest.raises(ValueError):
        client8.default_device_assignment(0, 1)


def test_default_device_assignment_needs_that_many_devices(cpu_library_path):
    """The CPU plugin answers 4 replicas on 1 device with ids 0..3, three of which do not exist."""
    with Client(cpu_library_path, {"cpu_device_count": 1}, schema=CPU_OPTION_SCHEMA) as client:
        assert client.default_device_assignment(1) == [[0]]
        with pytest.raises(ValueError, match="4 replica\\(s\\) x 1 partition\\(s\\) need 4 devices, but .* has 1"):
            client.default_device_assignment(4)
        with pytest.raises(ValueError, match="need 2 devices"):
            client.default_device_assignment(1, 2)


def test_a_client_create_that_returns_no_client_is_refused(build_shim, python_subprocess):
    """A plugin reporting success with a NULL client: today's runtime accepts it and the first use crashes."""
    code = f"""
from pjrt_plugins.runtime import Client, PjrtError
try:
    client = Client({str(build_shim(SHIM_NULL_CLIENT=True))!r})
except PjrtError as exc:
    print("refused:", exc)
else:
    print("accepted", client.devices)
"""
    result = python_subprocess(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "refused: PJRT_Client_Create failed with INTERNAL: PJRT_Client_Create reported success but returned no client" in result.stdout


def test_create_options_reach_the_plugin(cpu_library_path):
    with Client(cpu_library_path, {"cpu_device_count": 3}, schema=CPU_OPTION_SCHEMA) as client:
        assert len(client.devices) == 3


def test_unknown_option_lists_the_known_ones(cpu_library_path):
    with pytest.raises(ValueError, match="unknown client option 'cpu_device_cnt'.*Did you mean 'cpu_device_count'"):
        Client(cpu_library_path, {"cpu_device_cnt": 2}, schema=CPU_OPTION_SCHEMA)


def test_mistyped_option_raises_type_error(cpu_library_path):
    with pytest.raises(TypeError, match="cpu_device_count"):
        Client(cpu_library_path, {"cpu_device_count": "8"}, schema=CPU_OPTION_SCHEMA)
    with pytest.raises(TypeError, match="mapping"):
        Client(cpu_library_path, [("cpu_device_count", 8)], schema=CPU_OPTION_SCHEMA)  # type: ignore[arg-type]


def test_bad_options_never_kill_the_process(cpu_library_path, python_subprocess):
    # The CPU plugin aborts the whole process on a string for an int option: the
    # schema check must stop it in Python. Run where an abort could not hide.
    code = textwrap.dedent(
        f"""
        from pjrt_plugins.runtime import Client
        path, schema = {str(cpu_library_path)!r}, {{"cpu_device_count": int}}
        for options in ({{"cpu_device_count": "8"}}, {{"cpu_device_count": 2.5}},
                        {{"cpu_device_count": True}}, {{"cpu_devices": 8}}):
            try:
                Client(path, options, schema=schema)
            except (TypeError, ValueError) as exc:
                print(type(exc).__name__, "|", exc)
        with Client(path, {{"cpu_device_count": 2}}, schema=schema) as client:
            print("alive", len(client.devices))
        """
    )
    result = python_subprocess(code)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert [line.split(" |")[0] for line in lines[:4]] == ["TypeError", "TypeError", "TypeError", "ValueError"]
    assert "Known options: cpu_device_count" in lines[3]
    assert lines[4] == "alive 2"


def test_context_manager_and_close(cpu_library_path):
    with Client(cpu_library_path) as client:
        assert not client.closed
    assert client.closed
    client.close()  # idempotent
    with pytest.raises(ClientClosedError):
        client.devices
    with pytest.raises(ClientClosedError):
        client.compile(ADD_F32_4)
    assert "closed" in repr(client)


def test_devices_and_memories_of_a_closed_client_raise_instead_of_crashing(cpu_library_path, python_subprocess):
    # The plugin frees devices and memories with the client: reading one afterwards must not reach it.
    code = textwrap.dedent(
        f"""
        from pjrt_plugins.runtime import Client, ClientClosedError
        client = Client({str(cpu_library_path)!r})
        device = client.devices[0]
        memory = device.default_memory
        client.close()
        for read in (lambda: device.debug_string, lambda: device.attributes, lambda: device.local_hardware_id,
                     lambda: device.memories, lambda: memory.kind_id, lambda: memory.addressable_by_devices):
            try:
                read()
            except ClientClosedError:
                print("closed")
        print(str(device) == repr(device), str(memory) == repr(memory), device.id, memory.kind)
        """
    )
    result = python_subprocess(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["closed"] * 6 + ["True", "True", "0", "device"]


def test_client_accepts_a_loaded_library(cpu_library_path):
    with Client(load_library(cpu_library_path)) as client:
        assert client.library is load_library(cpu_library_path)


def test_close_with_live_buffers_and_executables(cpu_library_path):
    client = Client(cpu_library_path, {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA)
    exe = client.compile(ADD_F32_4)
    x = client.buffer_from_host(np.ones(4, np.float32))
    out = exe.execute([[x, x]])[0][0]
    zero_copy = client.buffer_from_host(np.ones(1024, np.float32), copy=False)
    client.close()
    for buf in (x, out, zero_copy):
        assert buf.is_deleted
        with pytest.raises(ClientClosedError, match="client has been closed"):
            buf.to_numpy()
        buf.delete()  # harmless
    assert exe.is_deleted
    with pytest.raises(ClientClosedError, match="closed"):
        exe.execute([[x, x]])
    del x, out, zero_copy, exe
    gc.collect()


def test_close_releases_everything_when_the_plugin_fails_to_destroy_a_buffer(build_shim):
    path = build_shim(SHIM_FAIL_BUFFER_DESTROY=True)
    client = Client(path, {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA)
    exe = client.compile(ADD_F32_4)
    buffers = [client.buffer_from_host(np.full(4, i, np.float32)) for i in range(3)]
    with pytest.raises(PjrtError) as raised:
        client.close()
    assert raised.value.code_name == "INVALID_ARGUMENT"  # the plugin's own error, not a crash
    assert "2 more error(s)" in "".join(raised.value.__notes__)
    assert client.closed and all(b.is_deleted for b in buffers) and exe.is_deleted
    calls = shim_report(path)
    assert calls.count("buffer_destroy;") == 3  # the first failure did not stop the others
    assert calls.count("executable_destroy;") == 1
    assert calls.endswith("client_destroy;")  # and the client itself was destroyed
    client.close()  # closing again is a no-op


def test_a_plugin_that_cannot_say_whether_a_transfer_is_done_keeps_its_host_memory(build_shim):
    path = build_shim(SHIM_FAIL_EVENT_IS_READY=True)
    client = Client(path, {"cpu_device_count": 2}, schema=CPU_OPTION_SCHEMA)
    host = np.arange(1 << 16, dtype=np.float32)
    owner = weakref.ref(host)
    buffer = client.buffer_from_host(host, copy=False)  # the plugin may read `host` until its event fires
    also = client.buffer_from_host(np.ones(4, np.float32))  # Event_IsReady fails: the upload still works
    np.testing.assert_array_equal(also.to_numpy(), np.ones(4, np.float32))
    del host
    buffer.delete()  # Event_IsReady fails while settling: the memory is kept, not freed
    gc.collect()
    assert owner() is not None
    client.close()  # awaits the event, then lets go
    gc.collect()
    assert owner() is None
    assert shim_report(path).endswith("client_destroy;")


def test_buffers_and_executables_keep_their_client_alive(cpu_library_path):
    client = Client(cpu_library_path)
    exe = client.compile(ADD_F32_4)
    buf = client.buffer_from_host(np.arange(4, dtype=np.float32))
    ref = weakref.ref(client)
    del client
    gc.collect()
    assert ref() is not None and not ref().closed
    np.testing.assert_array_equal(exe.execute([[buf, buf]])[0][0].to_numpy(), [0, 2, 4, 6])
    del exe
    gc.collect()
    assert ref() is not None
    del buf
    gc.collect()
    assert ref() is None  # the last owner gone, the client was destroyed


@pytest.mark.parametrize("order", ["buffers-first", "client-first", "interpreter-exit", "cycle"])
def test_no_destroy_order_crashes(cpu_library_path, python_subprocess, order):
    code = textwrap.dedent(
        f"""
        import gc
        import numpy as np
        from pjrt_plugins.runtime import Client
        client = Client({str(cpu_library_path)!r})
        exe = client.compile({ADD_F32_4!r})
        a = client.buffer_from_host(np.ones(4, np.float32))
        b = client.buffer_from_host(np.ones(1024, np.float32), copy=False)
        out = exe.execute([[a, a]])
        order = {order!r}
        if order == "buffers-first":
            del a, b, out, exe
            gc.collect()
            client.close()
        elif order == "client-first":
            client.close()
            del client
            gc.collect()
            del a, b, out, exe
            gc.collect()
        elif order == "cycle":
            holder = {{"client": client, "buffers": [a, b], "exe": exe}}
            holder["self"] = holder
            del client, a, b, out, exe, holder
            gc.collect()
        print("done")
        """
    )
    result = python_subprocess(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "done"
