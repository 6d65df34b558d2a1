"""Every backend's variables: a value that cannot be used is a PluginConfigurationError naming the variable.

One mechanism for all four backends: they read their settings through the core's
``find_library`` / ``env_int`` / ``env_bool`` / ``env_value``, which raise
``PluginConfigurationError``, and the core's availability check turns that into
"misconfigured" (so default selection stops with it instead of choosing another plugin).
Settings read only when a client is made are errors there, naming the variable too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import pytest

from pjrt_plugins import DevicePlugin, PluginConfigurationError
from pjrt_plugin_cpu import CpuPlugin
from pjrt_plugin_gpu import GpuPlugin
from pjrt_plugin_stub_neuron import StubNeuronPlugin
from pjrt_plugin_tpu import TpuPlugin

BACKENDS: dict[str, Callable[[], DevicePlugin]] = {
    "cpu": CpuPlugin,
    "gpu": GpuPlugin,
    "tpu": TpuPlugin,
    "stub-neuron": StubNeuronPlugin,
}
#: Stands for "a library file that exists", so that the check under test is the one reached.
SOME_FILE = __file__

# (backend, the bad setting, other settings that get the check reached)
SEEN_BY_AVAILABILITY = [
    ("cpu", {"PJRT_CPU_LIBRARY_PATH": "/nonexistent/xla_cpu_pjrt.so"}, {}),
    ("cpu", {"PJRT_CPU_LIBRARY_PATH": "/"}, {}),
    ("cpu", {"CPU_NUM_DEVICES": "abc"}, {}),
    ("cpu", {"CPU_NUM_DEVICES": "0"}, {}),
    ("cpu", {"CPU_NUM_DEVICES": "2000"}, {}),
    ("gpu", {"PJRT_GPU_LIBRARY_PATH": "/nonexistent/xla_cuda_plugin.so"}, {}),
    ("gpu", {"GPU_NUM_DEVICES": "two"}, {"PJRT_GPU_LIBRARY_PATH": SOME_FILE}),
    ("gpu", {"GPU_NUM_DEVICES": "-1"}, {"PJRT_GPU_LIBRARY_PATH": SOME_FILE}),
    ("tpu", {"TPU_LIBRARY_PATH": "/nonexistent/libtpu.so"}, {}),
    ("tpu", {"PJRT_TPU_SKIP_CHIP_CHECK": "maybe"}, {"TPU_LIBRARY_PATH": SOME_FILE}),
    ("tpu", {"TPU_PROCESS_BOUNDS": "two"}, {"TPU_LIBRARY_PATH": SOME_FILE, "PJRT_TPU_SKIP_CHIP_CHECK": "1"}),
    ("stub-neuron", {"NEURON_LIBRARY_PATH": "/nonexistent/libneuronpjrt.so"}, {}),
    ("stub-neuron", {"NEURON_LIBRARY_PATH": "libneuronpjrt.so"}, {}),  # relative: not dlopen's search path
    ("stub-neuron", {"NEURONCORE_NUM_DEVICES": "four"}, {}),
    ("stub-neuron", {"NEURONCORE_NUM_DEVICES": "-1"}, {}),
]


def _id(case: tuple) -> str:
    backend, bad, _ = case
    return f"{backend}-" + ",".join(f"{k}={v}" for k, v in bad.items())


@pytest.fixture
def configure(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, str]], None]:
    return lambda env: [monkeypatch.setenv(name, value) for name, value in env.items()]


@pytest.mark.parametrize("case", SEEN_BY_AVAILABILITY, ids=[_id(c) for c in SEEN_BY_AVAILABILITY])
def test_a_bad_setting_makes_the_plugin_misconfigured_not_unavailable(case, configure):
    backend, bad, others = case
    plugin = BACKENDS[backend]()
    configure(others)
    assert plugin.configuration_error() is None, plugin.unavailable_reason()  # the rest of the setting is fine
    configure(bad)
    (variable,) = bad
    error = plugin.configuration_error()
    assert isinstance(error, PluginConfigurationError), plugin.unavailable_reason()
    assert variable in str(error)
    assert plugin.unavailable_reason().startswith("misconfigured: ")


# (backend, the bad setting, the call that reads it)
SEEN_BY_CLIENT_SETUP = [
    ("gpu", {"PJRT_ALLOCATOR_FRACTION": "half"}, lambda p: p.client_create_options()),
    ("gpu", {"PJRT_ALLOCATOR_FRACTION": "1.5"}, lambda p: p.client_create_options()),
    ("gpu", {"PJRT_ALLOCATOR_FRACTION": "nan"}, lambda p: p.client_create_options()),
    ("gpu", {"PJRT_ALLOCATOR_CUDA_ASYNC": "maybe"}, lambda p: p.client_create_options()),
    ("gpu", {"PJRT_ALLOCATOR_PREALLOCATE": "maybe"}, lambda p: p.client_create_options()),
    ("gpu", {"RANK": "first"}, lambda p: p.client_create_options()),
    ("tpu", {"XLA_TPU_MAX_INFLIGHT_COMPUTATIONS": "0"}, lambda p: p.client_create_options()),
    ("tpu", {"PJRT_TPU_INITIALIZE_TIMEOUT": "0"}, lambda p: p.initialize_timeout()),
    ("tpu", {"PJRT_TPU_INITIALIZE_TIMEOUT": "nan"}, lambda p: p.initialize_timeout()),
    ("tpu", {"TPU_WORKER_ID": "three"}, lambda p: p.host_index()),
    ("tpu", {"TPU_SKIP_MDS_QUERY": "maybe"}, lambda p: p.host_index()),
    ("tpu", {"PJRT_TPU_BASE_PORT": "0"}, lambda p: p.configure_multiprocess(0, 1)),
    ("stub-neuron", {"NEURON_RT_VISIBLE_CORES": "0-x"}, lambda p: p.client_create_options()),
    ("stub-neuron", {"WORLD_SIZE": "many"}, lambda p: p.requires_coordinator()),
    ("cpu", {"LOCAL_WORLD_SIZE": "x"}, lambda p: p.local_world_size()),  # a core default, the same for all
]


@pytest.mark.parametrize("case", SEEN_BY_CLIENT_SETUP, ids=[_id(c) for c in SEEN_BY_CLIENT_SETUP])
def test_a_bad_setting_read_when_a_client_is_made_is_an_error_naming_it(case, configure):
    backend, bad, call = case
    plugin = BACKENDS[backend]()
    before = dict(os.environ)
    call(plugin)  # fine without the setting (the configure hooks write variables: undone here)
    os.environ.clear()
    os.environ.update(before)
    configure(bad)
    (variable,) = bad
    with pytest.raises(PluginConfigurationError, match=f"{variable}="):
        call(plugin)


SELECT = """
import json, os, pjrt_plugins as p
out = {}
for variable, value in json.loads(os.environ["CASES"]):
    os.environ[variable] = value
    try:
        p.default_plugin()
        out[variable] = "no error"
    except p.PjrtPluginsError as exc:
        out[variable] = f"{type(exc).__name__}: {exc}"
    del os.environ[variable]
print(json.dumps(out))
"""


def test_default_selection_stops_at_the_misconfigured_plugin_of_each_backend(run_python):
    # The installed backends by priority: tpu 300, gpu 200, cpu 0, stub-neuron -100. A broken library
    # path of tpu or gpu stops the selection instead of quietly falling through to cpu; the stub is
    # below cpu, so its setting matters only when it is asked for (PJRT_DEVICE, next test).
    cases = [("TPU_LIBRARY_PATH", "/nonexistent/libtpu.so"), ("PJRT_GPU_LIBRARY_PATH", "/nonexistent/cuda.so"),
             ("PJRT_CPU_LIBRARY_PATH", "/nonexistent/cpu.so")]
    result = run_python(SELECT, env={"CASES": json.dumps(cases)})
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.splitlines()[-1])
    for (variable, value), plugin in zip(cases, ("tpu", "gpu", "cpu")):
        assert out[variable].startswith(f"PluginConfigurationError: plugin {plugin!r} would be the default"), out
        assert f"{variable}={value!r}" in out[variable]


def test_a_plugin_asked_for_by_name_refuses_its_broken_setting_before_opening_anything(run_python):
    result = run_python(
        """
        import pjrt_plugins as p
        try:
            p.create_client()
        except p.PluginConfigurationError as exc:
            print(exc)
        """,
        env={"PJRT_DEVICE": "STUB_NEURON", "NEURON_LIBRARY_PATH": "/nonexistent/libneuronpjrt.so"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "NEURON_LIBRARY_PATH='/nonexistent/libneuronpjrt.so'" in result.stdout  # not the stub library instead
