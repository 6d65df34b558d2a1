"""The stub library through pjrt_plugins.runtime: devices, memories, buffers of every dtype, errors.

Real library, real runtime: the plugin's hooks create the client exactly as users do.
"""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from _support import run_on_threads

from pjrt_plugins import PjrtError, UnsupportedFunctionError
from pjrt_plugins.runtime import load_library
from pjrt_plugin_stub_neuron import __version__ as VERSION

DTYPES = [
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128,
    ml_dtypes.bfloat16, ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e4m3b11fnuz,
    ml_dtypes.float8_e5m2fnuz, ml_dtypes.float8_e4m3fnuz,
]


def _sample(dtype, shape=(3, 5)) -> np.ndarray:
    raw = np.random.default_rng(7).standard_normal(shape) * 4
    if np.dtype(dtype) == np.bool_:
        return raw > 0
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        return (raw + 1j * raw[::-1]).astype(dtype)
    return raw.astype(dtype)


@pytest.fixture
def client(stub):
    with stub.create_client() as c:
        yield c


def test_client_reports_neuron_platform_and_default_four_devices(client):
    assert client.platform_name == "neuron"
    assert client.platform_version.startswith(f"stub_neuron {VERSION} (PJRT C API 0.")
    assert client.process_index == 0
    assert [d.id for d in client.devices] == [0, 1, 2, 3]
    assert client.addressable_devices == client.devices


def test_num_devices_follows_neuroncore_num_devices_and_options(stub, monkeypatch):
    monkeypatch.setenv("NEURONCORE_NUM_DEVICES", "2")
    with stub.create_client() as c:
        assert len(c.devices) == 2
    with stub.create_client({"num_devices": 16}) as c:
        assert len(c.devices) == 16
        assert [d.local_hardware_id for d in c.devices] == list(range(16))


def test_device_descriptions(client):
    device = client.devices[3]
    assert device.kind == "NeuronCore (stub)"
    assert device.process_index == 0
    assert device.local_hardware_id == 3
    assert device.is_addressable
    assert device.attributes == {"core_index": 3, "node_id": 0, "vendor": "stub"}
    assert str(device) == "NeuronDevice(id=3)"
    assert "StubNeuronDevice(id=3, process_index=0, core_index=3" in device.debug_string
    assert client.lookup_device(2) is client.devices[2]
    assert client.lookup_addressable_device(1) is client.devices[1]


def test_missing_device_is_a_not_found_error(client):
    with pytest.raises(PjrtError) as info:
        client.lookup_device(4)
    assert info.value.code_name == "NOT_FOUND"
    assert "ids are 0..3" in info.value.message


def test_each_device_has_one_device_memory(client):
    assert [m.id for m in client.memories] == [0, 1, 2, 3]
    for device in client.devices:
        memory = device.default_memory
        assert device.memories == [memory]
        assert memory.kind == "device"
        assert memory.id == device.id
        assert memory.addressable_by_devices == [device]
        assert str(memory) == f"NeuronMemory(id={device.id})"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_buffer_round_trip_for_every_dtype(client, dtype):
    host = _sample(dtype)
    buffer = client.buffer_from_host(host, device=client.devices[1])
    assert buffer.shape == host.shape
    assert buffer.dtype == np.dtype(dtype)
    assert buffer.device is client.devices[1]
    assert buffer.on_device_size == host.nbytes
    back = buffer.to_numpy()
    assert back.dtype == host.dtype
    np.testing.assert_array_equal(back.view(np.uint8), host.view(np.uint8))  # bit-exact, NaNs included


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a.T,
        lambda a: a[::-1, ::2],
        lambda a: a[1:, 2:4],
        lambda a: np.asfortranarray(a),
        lambda a: a[0, 0],  # a 0-d array
        lambda a: a[:0],  # an empty one
    ],
    ids=["transposed", "reversed_strided", "sliced", "fortran", "scalar", "empty"],
)
def test_non_contiguous_and_degenerate_arrays_round_trip(client, view):
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    host = view(base)
    np.testing.assert_array_equal(client.buffer_from_host(host).to_numpy(), host)


def test_torch_tensor_round_trip(client):
    torch = pytest.importorskip("torch", reason="torch is an optional dependency of the core")
    tensor = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    back = client.buffer_from_host(tensor, device=client.devices[2]).to_torch()
    assert back.dtype == torch.bfloat16
    assert torch.equal(back, tensor)


def test_deleted_buffer_refuses_reads(client):
    buffer = client.buffer_from_host(np.ones(4, np.int32))
    assert buffer.is_ready
    buffer.delete()
    assert buffer.is_deleted
    with pytest.raises(Exception, match="deleted"):
        buffer.to_numpy()


def test_compile_raises_unimplemented(client):
    with pytest.raises(PjrtError) as info:
        client.compile("module @m { func.func public @main() { return } }")
    assert info.value.code_name == "UNIMPLEMENTED"
    assert "no compiler" in str(info.value)


def test_a_null_slot_is_an_unsupported_function_error(client):
    assert not client.library.has_function("PJRT_Client_DefaultDeviceAssignment")
    assert not client.library.has_function("PJRT_LoadedExecutable_Execute")
    assert client.library.has_function("PJRT_Client_Compile")
    with pytest.raises(UnsupportedFunctionError, match="PJRT_Client_DefaultDeviceAssignment"):
        client.default_device_assignment(1, 1)


def test_library_reports_its_version_and_attributes(stub_library):
    library = load_library(stub_library)
    assert library.api_version == (0, 81)
    attributes = library.attributes
    assert attributes["pjrt_c_api_minor_version"] == 81
    assert attributes["stub_neuron_version"] == VERSION
    assert attributes["supports_compile"] is False


def test_schema_rejects_a_mistyped_option_before_the_c_call(stub):
    with pytest.raises(TypeError, match="num_devices"):
        stub.create_client({"num_devices": "8"})
    with pytest.raises(ValueError, match="Did you mean 'num_devices'"):
        stub.create_client({"num_device": 8})


def test_the_library_itself_rejects_a_mistyped_option_without_aborting(run_python, stub_library):
    # No schema: the string reaches PJRT_Client_Create. Run in a child in case it ever aborted.
    done = run_python(
        f"""
        from pjrt_plugins import PjrtError
        from pjrt_plugins.runtime import Client
        for options in ({{"num_devices": "8"}}, {{"num_devices": 2.5}}, {{"num_devices": True}},
                        {{"num_devices": [1, 2]}}, {{"cpu_device_count": 8}}, {{"num_devices": 100000}}):
            try:
                Client({str(stub_library)!r}, options)
            except PjrtError as exc:
                print(exc.code_name, "|", exc.message)
        print("alive")
        """
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "alive"
    assert len(lines) == 7 and all(line.startswith("INVALID_ARGUMENT |") for line in lines[:6])
    assert "'num_devices' must be an int64, got a string" in lines[0]
    assert "got a float" in lines[1] and "got a bool" in lines[2] and "got a int64 list" in lines[3]
    assert "unknown create option 'cpu_device_count'" in lines[4]
    assert "out of range" in lines[5]


def test_vendor_library_from_neuron_library_path_is_the_one_loaded(stub, stub_library, monkeypatch, tmp_path):
    vendor = tmp_path / "libneuronpjrt.so"
    shutil.copy(stub_library, vendor)
    monkeypatch.setenv("NEURON_LIBRARY_PATH", str(vendor))
    monkeypatch.setenv("NEURONCORE_NUM_DEVICES", "2")  # a stub option: not passed to a vendor library
    with stub.create_client() as c:
        assert Path(c.library.path) == vendor.resolve()
        assert len(c.devices) == 4  # the library's own default, not NEURONCORE_NUM_DEVICES


def test_concurrent_uploads_from_threads(client):
    def work(seed: int) -> None:
        for i in range(50):
            host = np.full((8, 8), seed * 1000 + i, np.int64)
            np.testing.assert_array_equal(client.buffer_from_host(host, device=seed % 4).to_numpy(), host)

    run_on_threads(work, [(s,) for s in range(6)])


def test_closing_the_client_frees_every_plugin_object(stub, live_objects):
    with stub.create_client():  # warm up the library
        pass
    before = live_objects()
    with stub.create_client({"num_devices": 3}) as c:
        buffers = [c.buffer_from_host(np.arange(10.0) * i, device=i % 3) for i in range(12)]
        _ = [b.to_numpy() for b in buffers]
        _ = [b.is_ready for b in buffers]
        buffers[0].delete()
        with pytest.raises(PjrtError):
            c.compile("module {}")
        assert live_objects() > before
    assert live_objects() == before


def test_buffers_outlive_a_closed_client_safely(stub):
    c = stub.create_client()
    buffer = c.buffer_from_host(np.arange(3))
    c.close()
    with pytest.raises(Exception):  # the runtime released it with the client; no crash
        buffer.to_numpy()


def test_import_opens_no_library(run_python):
    done = run_python(
        textwrap.dedent(
            """
            import pjrt_plugins, pjrt_plugin_stub_neuron
            from pjrt_plugins.runtime import loaded_libraries
            print(len(loaded_libraries()))
            with open("/proc/self/maps") as maps:
                print("libpjrt_stub_neuron" in maps.read())
            """
        )
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "False"]
