"""create_client_for_plugin: the hooks are honoured in order, on the real CPU plugin library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

import pjrt_plugins
from pjrt_plugins import DevicePlugin, PluginUnavailableError, create_client_for_plugin, hookimpl
from pjrt_plugins.runtime import Client, PluginInitializeTimeoutError, PluginTimeoutError

#: The create options of the CPU plugin (the backend package declares the same schema).
CPU_OPTION_SCHEMA = {"cpu_device_count": int}


class RecordingCpuPlugin(DevicePlugin):
    """A CPU backend defined in the test: real library, real hooks, and a log of hook calls."""

    def __init__(self, library: str, *, refuse: bool = False, timeout: float | None = None) -> None:
        super().__init__()
        self.name = "recording-cpu"
        self.library = library
        self.refuse = refuse
        self.timeout = timeout
        self.log: list[Any] = []

    @hookimpl
    def pjrt_library_path(self) -> str:
        self.log.append("library_path")
        return self.library

    @hookimpl
    def pjrt_client_option_schema(self) -> dict[str, Any]:
        return dict(CPU_OPTION_SCHEMA)

    @hookimpl
    def pjrt_client_create_options(self) -> dict[str, Any]:
        self.log.append("create_options")
        return {"cpu_device_count": 2}

    @hookimpl
    def pjrt_configure_single_process(self) -> None:
        self.log.append("single")

    @hookimpl
    def pjrt_configure_multiprocess(self, local_rank: int, local_world_size: int) -> None:
        self.log.append(("multi", local_rank, local_world_size))

    @hookimpl
    def pjrt_preflight(self) -> None:
        self.log.append("preflight")
        if self.refuse:
            raise PluginUnavailableError("no recording-cpu hardware here; install it")

    @hookimpl
    def pjrt_initialize_timeout(self) -> float | None:
        return self.timeout


def test_hooks_run_in_order_and_options_merge(cpu_library_path):
    plugin = RecordingCpuPlugin(str(cpu_library_path))
    with create_client_for_plugin(plugin) as client:
        assert isinstance(client, Client) and len(client.devices) == 2  # the plugin's own options
        assert client.plugin_name == "recording-cpu"
    # The core asks for the library (to refuse a missing one) before the backend's preflight.
    assert plugin.log == ["single", "library_path", "preflight", "library_path", "create_options"]
    with create_client_for_plugin(plugin, {"cpu_device_count": 5}) as client:
        assert len(client.devices) == 5  # the caller's options are laid over the plugin's


def test_device_plugin_create_client_goes_through_the_same_path(cpu_library_path):
    plugin = RecordingCpuPlugin(str(cpu_library_path))
    with plugin.create_client({"cpu_device_count": 3}) as client:
        assert len(client.devices) == 3


def test_multiprocess_configuration_under_torchrun(cpu_library_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    plugin = RecordingCpuPlugin(str(cpu_library_path))
    with create_client_for_plugin(plugin):
        pass
    assert plugin.log[0] == ("multi", 1, 4)


def test_configure_false_skips_the_configure_hooks(cpu_library_path):
    plugin = RecordingCpuPlugin(str(cpu_library_path))
    with create_client_for_plugin(plugin, configure=False):
        pass
    assert "single" not in plugin.log and plugin.log[:2] == ["library_path", "preflight"]


def test_preflight_refusal_stops_before_the_library_is_opened(cpu_library_path):
    plugin = RecordingCpuPlugin(str(cpu_library_path), refuse=True)
    with pytest.raises(PluginUnavailableError, match="no recording-cpu hardware"):
        create_client_for_plugin(plugin)
    assert plugin.log == ["single", "library_path", "preflight"]  # its path checked, nothing opened or created


def test_options_are_validated_against_the_plugin_schema(cpu_library_path):
    plugin = RecordingCpuPlugin(str(cpu_library_path))
    with pytest.raises(ValueError, match="Known options: cpu_device_count"):
        create_client_for_plugin(plugin, {"devices": 4})
    with pytest.raises(TypeError):
        create_client_for_plugin(plugin, {"cpu_device_count": "4"})


def test_the_plugin_initialize_timeout_bounds_initialization(build_shim):
    plugin = RecordingCpuPlugin(str(build_shim(SHIM_INIT_SLEEP_MS=1200)), timeout=0.1)
    with pytest.raises(PluginInitializeTimeoutError):
        create_client_for_plugin(plugin)


@pytest.mark.parametrize(
    "hang, function",
    [("SHIM_GET_API_SLEEP_MS", "dlopen and GetPjrtApi"), ("SHIM_CREATE_SLEEP_MS", "PJRT_Client_Create")],
)
def test_the_plugin_initialize_timeout_bounds_opening_and_client_creation(build_shim, hang, function):
    """GetPjrtApi or PJRT_Client_Create that does not return: the caller (`pjrt-plugins devices`, ...)
    gets PluginTimeoutError after the plugin's initialize timeout; the call is left on a daemon thread."""
    plugin = RecordingCpuPlugin(str(build_shim(**{hang: 15000})), timeout=0.5)
    started = time.monotonic()
    with pytest.raises(PluginTimeoutError, match=f"{function}.* did not return within 0.5 s"):
        create_client_for_plugin(plugin)
    assert time.monotonic() - started < 10


def test_missing_library_is_reported_by_the_plugin(tmp_path):
    plugin = RecordingCpuPlugin(str(tmp_path / "missing.so"))
    with pytest.raises(PluginUnavailableError, match="does not exist"):
        create_client_for_plugin(plugin)


def test_registered_cpu_backend_if_installed():
    try:
        plugin = pjrt_plugins.get_plugin("cpu")
    except (AttributeError, LookupError):
        pytest.skip("the pjrt-plugin-cpu backend is not installed")
    if not plugin.is_available():
        pytest.skip(f"the cpu backend is unavailable here: {plugin.unavailable_reason()}")
    with plugin.create_client({"cpu_device_count": 2}) as client:
        assert client.platform_name == "cpu" and len(client.devices) == 2


def test_the_old_runtime_name_still_works_with_a_deprecation_warning():
    import pjrt_plugins.runtime as runtime

    with pytest.warns(DeprecationWarning, match="pjrt_plugins.create_client_for_plugin"):
        assert runtime.create_client_for_plugin is create_client_for_plugin


def test_loading_the_runtime_loads_no_client_creation_glue():
    """The runtime is the layer below the hooks: importing it never pulls in the glue above it."""
    code = "import json, sys, pjrt_plugins.runtime; print(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "PJRT_PLUGINS_AUTOLOAD": "0"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    assert "pjrt_plugins.runtime._client" in loaded
    assert not loaded & {"pjrt_plugins._plugin_client", "pjrt_plugins._client_setup", "pjrt_plugins.hookspecs"}
