"""Device memory: statistics (get_memory_info, memory_stats) and memory descriptions, on real plugins.

None of the plugins that run here report statistics (the XLA CPU builds answer UNIMPLEMENTED,
the stub too) or describe memories (the CPU plugin's MemoryDescriptions extension lists none):
those are the degrade paths, each with its clear error. The answers of a plugin that has them
(the CUDA and TPU plugins, on their hardware) come from the test shim, a mock that forwards
to the CPU plugin (SHIM_MEMORY_STATS, SHIM_MEMORY_DESCRIPTIONS in shim_plugin.c);
tests/plugins/test_gpu_hardware.py checks a real GPU where there is one.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _support import clean_environment

import pjrt_plugins
from pjrt_plugins import UnsupportedExtensionError, UnsupportedFunctionError
from pjrt_plugins.runtime import Client


@pytest.fixture(scope="module")
def stub_client(stub_library):
    with Client(stub_library, plugin_name="stub-neuron") as client:
        yield client


def test_the_cpu_plugin_says_it_has_no_memory_statistics(client8):
    device = client8.devices[3]
    with pytest.raises(UnsupportedFunctionError) as caught:
        device.get_memory_info()
    message = str(caught.value)
    assert message.startswith("plugin 'cpu' does not provide device memory statistics: ")
    assert "PJRT_Device_MemoryStats answered UNIMPLEMENTED: GetAllocatorStats is not supported" in message
    assert caught.value.function == "PJRT_Device_MemoryStats"
    with pytest.raises(UnsupportedFunctionError):
        device.memory_stats()
    assert isinstance(caught.value, NotImplementedError)


def test_the_stub_says_it_has_no_memory_statistics(stub_client):
    with pytest.raises(UnsupportedFunctionError, match="plugin 'stub-neuron' does not provide device memory statistics: "
                                                       ".*the stub_neuron plugin has no memory statistics"):
        stub_client.devices[0].get_memory_info()


def test_statistics_come_back_by_pytorch_xla_and_jax_names(build_shim):
    with Client(build_shim(SHIM_MEMORY_STATS=True), {"cpu_device_count": 2}) as client:
        first, second = client.devices
        assert first.get_memory_info() == {"bytes_used": 1000, "peak_bytes_used": 5000, "bytes_limit": 1 << 30}
        assert second.get_memory_info()["bytes_used"] == 1001  # asked of that device, not of the first
        # Only what the plugin set: the other statistics are left out, not reported as 0.
        assert first.memory_stats() == {"bytes_in_use": 1000, "peak_bytes_in_use": 5000, "bytes_limit": 1 << 30,
                                        "num_allocs": 7}


def test_a_plugin_without_the_function_says_so(build_shim):
    with Client(build_shim(SHIM_NULL_SLOT="PJRT_Device_MemoryStats"), {"cpu_device_count": 1}) as client:
        with pytest.raises(UnsupportedFunctionError, match=r"does not provide device memory statistics: "
                                                           r"PJRT_Device_MemoryStats is not available .*unset \(NULL\)"):
            client.devices[0].get_memory_info()


def test_statistics_of_a_closed_client_raise_client_closed(build_shim):
    client = Client(build_shim(SHIM_MEMORY_STATS=True), {"cpu_device_count": 1})
    device = client.devices[0]
    client.close()
    with pytest.raises(pjrt_plugins.ClientClosedError):
        device.get_memory_info()


def test_the_cpu_plugin_has_memories_and_describes_none(client8):
    device = client8.devices[0]
    assert [memory.kind for memory in device.memories] == ["device", "pinned_host", "unpinned_host"]
    assert device.default_memory.kind == "device"
    # It has the MemoryDescriptions extension, and answers it with no descriptions.
    assert "MemoryDescriptions" in [name for _, name in client8.library.extensions]
    assert device.memory_descriptions == []


def test_memory_descriptions_list_kinds_default_first(build_shim):
    with Client(build_shim(SHIM_MEMORY_DESCRIPTIONS=True), {"cpu_device_count": 2}) as client:
        for device in client.devices:
            descriptions = device.memory_descriptions
            assert [(d.kind, d.kind_id, d.is_default) for d in descriptions] == [
                ("device", 0, True), ("pinned_host", 1, False)
            ]


def test_a_plugin_without_the_extension_says_so(stub_client):
    with pytest.raises(UnsupportedExtensionError) as caught:
        stub_client.devices[0].memory_descriptions
    assert str(caught.value) == (
        "plugin 'stub-neuron' (libpjrt_stub_neuron.so) does not provide memory descriptions "
        "(the MemoryDescriptions extension): it has no such extension"
    )
    assert caught.value.extension == "MemoryDescriptions"
    assert [memory.kind for memory in stub_client.devices[0].memories] == ["device"]  # still listed


# -- in the command line -----------------------------------------------------------------------------


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pjrt_plugins", *args], capture_output=True, text=True, timeout=180,
                          env=clean_environment(env))


def test_doctor_shows_memory_statistics_where_the_plugin_has_them(build_shim):
    result = run_cli("doctor", "library", "--json", PJRT_LIBRARY_PATH=str(build_shim(SHIM_MEMORY_STATS=True)))
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {c["check"]: c for c in json.loads(result.stdout)["plugins"][0]["checks"]}
    assert checks["memory"] == {"check": "memory", "ok": True, "detail": "device 0: 1000 B in use, peak 4.9 KiB, limit 1.0 GiB",
                                "fix": ""}


def test_doctor_skips_memory_statistics_the_plugin_does_not_provide(cpu_library_path):
    result = run_cli("doctor", "library", PJRT_LIBRARY_PATH=str(cpu_library_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert ("[skip] memory       skipped: plugin 'library' does not provide device memory statistics: "
            "PJRT_Device_MemoryStats answered UNIMPLEMENTED: GetAllocatorStats is not supported") in result.stdout
    assert "=> ok" in result.stdout


def test_devices_lists_each_devices_memories_and_described_kinds(build_shim, stub_library):
    cpu = run_cli("devices", "library", "-o", "cpu_device_count=2", "--json",
                  PJRT_LIBRARY_PATH=str(build_shim(SHIM_MEMORY_DESCRIPTIONS=True)))
    assert cpu.returncode == 0, cpu.stderr
    devices = json.loads(cpu.stdout)["devices"]
    assert [m["kind"] for m in devices[1]["memories"]] == ["device", "pinned_host", "unpinned_host"]
    assert [m["default"] for m in devices[1]["memories"]] == [True, False, False]
    assert devices[1]["memory_descriptions"] == [{"kind": "device", "kind_id": 0, "default": True},
                                                 {"kind": "pinned_host", "kind_id": 1, "default": False}]
    text = run_cli("devices", "library", "-o", "cpu_device_count=2",
                   PJRT_LIBRARY_PATH=str(build_shim(SHIM_MEMORY_DESCRIPTIONS=True)))
    assert "device*, pinned_host, unpinned_host  device*, pinned_host" in text.stdout, text.stdout
    stub = run_cli("devices", "library", PJRT_LIBRARY_PATH=str(stub_library))
    assert stub.returncode == 0, stub.stderr
    assert "memory descriptions: plugin 'library' (libpjrt_stub_neuron.so) does not provide memory descriptions" in stub.stdout
