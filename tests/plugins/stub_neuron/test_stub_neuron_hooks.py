"""The stub's Python half: its hooks, the Neuron environment variables, and its entry point."""

from __future__ import annotations

import importlib.metadata
import os
import shutil

import pytest

import pjrt_plugins
from pjrt_plugins import OptionType, PluginConfigurationError, PluginUnavailableError
from pjrt_plugin_stub_neuron import KV_KEY_PREFIX, StubNeuronPlugin, _topology, stub_library_path
from stub_neuron_testkit import NEURON_ENV_VARS

# -- entry point and registration ---------------------------------------------------------


def test_entry_point_is_stub_neuron_not_neuron():
    eps = importlib.metadata.entry_points(group="torch_xla.plugins")
    ours = [ep for ep in eps if ep.value == "pjrt_plugin_stub_neuron:StubNeuronPlugin"]
    # never "neuron": that is torch_xla's real plugin; '-', not '_': torch_xla cuts PJRT_DEVICE at the first '_'
    assert [ep.name for ep in ours] == ["stub-neuron"]
    assert ours[0].dist is not None and ours[0].dist.name == "pjrt-plugin-stub-neuron"


def test_registry_holds_the_stub_under_its_name():
    plugin = pjrt_plugins.get_plugin("stub-neuron")
    assert isinstance(plugin, StubNeuronPlugin)
    assert plugin.name == "stub-neuron"
    assert plugin.distribution == "pjrt-plugin-stub-neuron"
    assert pjrt_plugins.get_plugin("  STUB_NEURON ") is plugin  # JAX's spelling (stub_neuron) reaches it too


def test_importing_the_plugin_package_first_registers_it_without_warnings(run_python):
    done = run_python(
        """
        import warnings
        warnings.simplefilter("error")
        import pjrt_plugin_stub_neuron
        import pjrt_plugins
        print(type(pjrt_plugins.get_plugin("stub_neuron")).__name__)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "StubNeuronPlugin"


@pytest.mark.parametrize("device", ["STUB-NEURON", "STUB_NEURON"])
def test_pjrt_device_selects_the_stub_despite_its_low_priority(run_python, device):
    done = run_python("import pjrt_plugins; print(pjrt_plugins.default_plugin().name)", env={"PJRT_DEVICE": device})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "stub-neuron"


# -- plain hook values ----------------------------------------------------------------


def test_priority_is_below_every_real_backend(stub):
    assert stub.priority() == -100


def test_dense_gather_factor_is_8192_and_env_overrides_it(stub, monkeypatch):
    assert stub.dense_gather_factor() == 8192
    monkeypatch.setenv("XLA_DENSE_GATHER_FACTOR", "64")
    assert stub.dense_gather_factor() == 64


def test_option_schema_names_the_stub_options_as_int64(stub):
    assert stub.option_schema() == {
        "num_devices": OptionType.INT64,
        "node_id": OptionType.INT64,
        "num_nodes": OptionType.INT64,
        "kv_timeout_ms": OptionType.INT64,
    }
    assert KV_KEY_PREFIX == "stub_neuron/devices/"


def test_chip_count_defaults_to_4_and_follows_neuroncore_num_devices(stub, monkeypatch):
    assert stub.physical_chip_count() == 4
    assert stub.client_create_options() == {"num_devices": 4}
    monkeypatch.setenv("NEURONCORE_NUM_DEVICES", "2")
    assert stub.physical_chip_count() == 2
    assert stub.client_create_options() == {"num_devices": 2}


def test_malformed_chip_count_names_the_variable(stub, monkeypatch):
    monkeypatch.setenv("NEURONCORE_NUM_DEVICES", "many")
    with pytest.raises(ValueError, match="NEURONCORE_NUM_DEVICES='many'"):
        stub.physical_chip_count()
    assert "NEURONCORE_NUM_DEVICES" in stub.unavailable_reason()


def test_zero_cores_make_the_stub_unavailable_and_refuse_a_client(stub, monkeypatch):
    monkeypatch.setenv("NEURONCORE_NUM_DEVICES", "0")
    assert not stub.is_available()
    with pytest.raises(PluginUnavailableError, match="NEURONCORE_NUM_DEVICES=0"):
        stub.create_client()


def test_visible_cores_decide_how_many_devices_this_process_gets(stub, monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "4-6")
    assert stub.client_create_options() == {"num_devices": 3}
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "0,5")
    assert stub.client_create_options() == {"num_devices": 2}


def test_library_is_the_stub_built_into_the_package(stub, stub_library):
    assert stub.library_path() == str(stub_library)
    assert stub_library.name == "libpjrt_stub_neuron.so"
    assert stub.is_available()
    assert stub.unavailable_reason() is None


def test_neuron_library_path_selects_a_vendor_library_and_drops_stub_options(stub, stub_library, monkeypatch, tmp_path):
    vendor = tmp_path / "libneuronpjrt.so"
    shutil.copy(stub_library, vendor)
    monkeypatch.setenv("NEURON_LIBRARY_PATH", str(vendor))
    monkeypatch.setenv("NEURONCORE_NUM_DEVICES", "2")
    assert stub.library_path() == str(vendor)
    assert stub.client_create_options() == {}  # the vendor library has its own options
    assert stub.option_schema() is None
    assert stub.is_available()


def test_a_neuron_library_path_naming_no_file_is_a_configuration_error_not_the_stub(stub, monkeypatch, tmp_path):
    # dlopen would search its library path for a bare name: the value is taken relative to the
    # working directory, where no such file is.
    for value in ("libneuronpjrt.so", str(tmp_path / "missing.so"), str(tmp_path)):
        monkeypatch.setenv("NEURON_LIBRARY_PATH", value)
        assert f"NEURON_LIBRARY_PATH={value!r}" in str(stub.configuration_error())
        with pytest.raises(PluginConfigurationError, match="NEURON_LIBRARY_PATH"):
            stub.preflight()
        with pytest.raises(PluginConfigurationError, match="NEURON_LIBRARY_PATH"):
            stub.library_path()
    monkeypatch.setenv("NEURON_LIBRARY_PATH", " ")  # blank counts as unset: the stub
    assert stub.library_path() == str(stub_library_path()) and stub.configuration_error() is None


# -- multi-process configuration ------------------------------------------------------------


@pytest.mark.parametrize("local_rank", [0, 1, 2, 3])
def test_configure_multiprocess_gives_each_local_rank_its_own_core(stub, monkeypatch, local_rank):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    stub.configure_multiprocess(local_rank, 4)
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == str(local_rank)
    assert os.environ["NEURON_PJRT_PROCESS_INDEX"] == str(local_rank)
    assert os.environ["NEURON_PJRT_PROCESSES_NUM_DEVICES"] == "1,1,1,1"
    assert os.environ["NEURON_RT_ROOT_COMM_ID"] == "10.0.0.7:62182"
    assert stub.client_create_options() == {"num_devices": 1}


def test_configure_multiprocess_uses_the_global_rank_on_a_second_host(stub, monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    stub.configure_multiprocess(1, 4)
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == "1"
    assert os.environ["NEURON_PJRT_PROCESS_INDEX"] == "5"
    assert os.environ["NEURON_PJRT_PROCESSES_NUM_DEVICES"] == ",".join(["1"] * 8)
    assert os.environ["NEURON_RT_ROOT_COMM_ID"] == "localhost:62182"


def test_configure_multiprocess_picks_from_cores_the_user_made_visible(stub, monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "4-7")
    monkeypatch.setenv("NEURON_RT_ROOT_COMM_ID", "keep:1")
    stub.configure_multiprocess(2, 4)
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == "6"
    assert os.environ["NEURON_RT_ROOT_COMM_ID"] == "keep:1"
    # Configuring again (a second client) starts from the user's list, not from "6".
    stub.configure_multiprocess(3, 4)
    assert os.environ["NEURON_RT_VISIBLE_CORES"] == "7"


def test_configure_multiprocess_refuses_more_processes_than_cores(stub, monkeypatch):
    monkeypatch.setenv("NEURONCORE_NUM_DEVICES", "2")
    with pytest.raises(ValueError, match="3 local processes need 3 NeuronCores but only 2"):
        stub.configure_multiprocess(2, 3)
    assert "NEURON_RT_VISIBLE_CORES" not in os.environ


def test_malformed_visible_cores_are_reported(stub, monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "3-1")
    with pytest.raises(ValueError, match="NEURON_RT_VISIBLE_CORES='3-1' is not a core list"):
        stub.client_create_options()


def test_requires_coordinator_only_with_several_processes(stub, monkeypatch):
    assert stub.requires_coordinator() is False
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert stub.requires_coordinator() is True
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setenv("WORLD_SIZE", "2")  # one process per host, two hosts
    assert stub.requires_coordinator() is True


def test_single_process_configuration_leaves_the_environment_alone(stub):
    stub.configure_single_process()
    assert not any(name in os.environ for name in NEURON_ENV_VARS)


@pytest.mark.parametrize(
    ("text", "cores"),
    [("0", [0]), ("0-3", [0, 1, 2, 3]), ("1,3", [1, 3]), ("0-1, 4-5", [0, 1, 4, 5])],
)
def test_core_lists_parse_and_format_back(text, cores):
    assert _topology.parse_core_list(text) == cores
    assert _topology.parse_core_list(_topology.format_core_list(cores)) == cores


@pytest.mark.parametrize("text", ["", "a", "1-", "2,2", "-1", "3-1"])
def test_bad_core_lists_raise(text):
    with pytest.raises(ValueError, match="NEURON_RT_VISIBLE_CORES"):
        _topology.parse_core_list(text)
