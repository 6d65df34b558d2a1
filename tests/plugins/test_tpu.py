"""The tpu backend: libtpu lookup, chip detection, topology hooks, and failing fast (never hanging) off a TPU VM."""

from __future__ import annotations

import importlib.metadata
import os
from pathlib import Path

import pytest

import pjrt_plugins
from pjrt_plugins import OptionType, PluginUnavailableError, installed_library
from pjrt_plugins.options import validate_options
from pjrt_plugin_tpu import TpuPlugin
from pjrt_plugin_tpu._host import count_tpu_chips, on_google_compute_engine
from pjrt_plugin_tpu._metadata import parse_tpu_env, parse_worker_endpoints
from pjrt_plugin_tpu._plugin import LIBRARY_DISTRIBUTIONS
from pjrt_plugin_tpu._topology import (
    TpuSlice,
    bounds_size,
    host_layout,
    multiprocess_environment,
    parse_bounds,
    tpu_generation,
)

HAS_TPU = count_tpu_chips() > 0
needs_no_tpu = pytest.mark.skipif(HAS_TPU, reason="this host has TPU chips; the test proves the no-TPU path")


@pytest.fixture
def tpu() -> TpuPlugin:
    return TpuPlugin()


def _fake_pci_device(root: Path, slot: str, vendor: str, device: str, pci_class: str) -> None:
    path = root / slot
    path.mkdir(parents=True)
    (path / "vendor").write_text(vendor + "\n")
    (path / "device").write_text(device + "\n")
    (path / "class").write_text(pci_class + "\n")


# -- library ---------------------------------------------------------------------------


def test_entry_point_registers_tpu_plugin_class():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="torch_xla.plugins")}
    assert eps.get("tpu") == "pjrt_plugin_tpu:TpuPlugin"
    assert isinstance(pjrt_plugins.get_plugin("tpu"), TpuPlugin)


def test_libtpu_is_found_from_package_metadata_without_importing_it(tpu, run_python):
    dist = importlib.metadata.distribution("libtpu")
    expected = Path(str(dist.locate_file("libtpu/libtpu.so"))).absolute()
    assert expected.is_file()
    assert Path(tpu.library_path()) == expected
    # `import libtpu` would set TPU_LIBRARY_PATH: the plugin must not have imported it.
    result = run_python(
        """
        import os, sys, pjrt_plugins
        plugin = pjrt_plugins.get_plugin("tpu")
        plugin.library_path(); plugin.unavailable_reason(); plugin.physical_chip_count()
        print("libtpu" in sys.modules, "TPU_LIBRARY_PATH" in os.environ)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_tpu_library_path_env_overrides_and_is_checked(tpu, monkeypatch, tmp_path):
    other = tmp_path / "libtpu.so"
    other.write_bytes(b"")
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(other))
    assert tpu.library_path() == str(other)
    monkeypatch.setenv("TPU_LIBRARY_PATH", str(tmp_path / "missing.so"))
    assert "TPU_LIBRARY_PATH" in tpu.unavailable_reason()
    assert installed_library(LIBRARY_DISTRIBUTIONS) is not None  # the package is still there; the override wins


# -- chips and host -----------------------------------------------------------------------


def test_count_tpu_chips_counts_google_tpu_devices_only(tmp_path):
    pci = tmp_path / "devices"
    _fake_pci_device(pci, "0000:00:04.0", "0x1ae0", "0x005e", "0x120000")  # v4
    _fake_pci_device(pci, "0000:00:05.0", "0x1ae0", "0x0063", "0xff0000")  # v5e, other class
    _fake_pci_device(pci, "0000:00:06.0", "0x1ae0", "0x0042", "0x020000")  # gVNIC: Google, but a NIC
    _fake_pci_device(pci, "0000:00:07.0", "0x1ae0", "0x0099", "0x120000")  # a newer Google accelerator
    _fake_pci_device(pci, "0000:00:08.0", "0x10de", "0x2330", "0x030200")  # an NVIDIA GPU
    _fake_pci_device(pci, "0000:00:09.0", "0x8086", "0x005e", "0x120000")  # right device id, wrong vendor
    assert count_tpu_chips(pci) == 3
    assert count_tpu_chips(tmp_path / "no-such-dir") == 0


def test_on_google_compute_engine_reads_dmi(tmp_path):
    dmi = tmp_path / "dmi"
    dmi.mkdir()
    assert on_google_compute_engine(dmi) is False
    (dmi / "product_name").write_text("Google Compute Engine\n")
    assert on_google_compute_engine(dmi) is True


@needs_no_tpu
def test_no_chips_makes_tpu_unavailable_with_what_to_do(tpu):
    assert tpu.physical_chip_count() == 0
    reason = tpu.unavailable_reason()
    assert "no TPU chips found" in reason and "PJRT_DEVICE=CPU" in reason
    with pytest.raises(PluginUnavailableError, match="no TPU chips found"):
        tpu.preflight()


def test_chip_count_is_capped_by_process_bounds(tpu, monkeypatch):
    chips = count_tpu_chips()
    assert tpu.physical_chip_count() == chips
    monkeypatch.setenv("TPU_PROCESS_BOUNDS", "1,1,1")
    assert tpu.physical_chip_count() == min(chips, 1)
    monkeypatch.setenv("TPU_PROCESS_BOUNDS", "two")
    with pytest.raises(ValueError, match="TPU_PROCESS_BOUNDS"):
        tpu.physical_chip_count()


# -- hooks ----------------------------------------------------------------------------------


def test_dense_gather_factor_is_8192_and_env_overridable(tpu, monkeypatch):
    assert tpu.dense_gather_factor() == 8192
    monkeypatch.setenv("XLA_DENSE_GATHER_FACTOR", "16")
    assert tpu.dense_gather_factor() == 16


def test_priority_rng_and_coordinator(tpu):
    assert tpu.priority() == 300
    assert tpu.rng_default() == "default"
    assert tpu.requires_xla_coordinator() is False


def test_create_options_and_schema(tpu, monkeypatch):
    options = tpu.client_create_options()
    assert options["max_inflight_computations"] == 32
    assert options["ml_framework_name"] == "pjrt-plugins"
    assert options["ml_framework_version"] == importlib.metadata.version("pjrt-plugins")
    assert tpu.option_schema()["max_inflight_computations"] is OptionType.INT64
    validate_options(options, tpu.option_schema(), plugin="tpu")
    monkeypatch.setenv("XLA_TPU_MAX_INFLIGHT_COMPUTATIONS", "4")
    assert tpu.client_create_options()["max_inflight_computations"] == 4
    monkeypatch.setenv("XLA_TPU_MAX_INFLIGHT_COMPUTATIONS", "0")
    with pytest.raises(ValueError, match="XLA_TPU_MAX_INFLIGHT_COMPUTATIONS"):
        tpu.client_create_options()
    with pytest.raises(TypeError, match="max_inflight_computations"):
        validate_options({"max_inflight_computations": "4"}, tpu.option_schema(), plugin="tpu")


def test_initialize_timeout_is_bounded_and_configurable(tpu, monkeypatch):
    assert tpu.initialize_timeout() == 120.0
    monkeypatch.setenv("PJRT_TPU_INITIALIZE_TIMEOUT", "7.5")
    assert tpu.initialize_timeout() == 7.5
    monkeypatch.setenv("PJRT_TPU_INITIALIZE_TIMEOUT", "0")
    with pytest.raises(ValueError, match="PJRT_TPU_INITIALIZE_TIMEOUT"):
        tpu.initialize_timeout()


def test_host_index_is_the_worker_id(tpu, monkeypatch):
    assert tpu.host_index() == 0
    monkeypatch.setenv("TPU_WORKER_ID", "3")
    assert tpu.host_index() == 3
    monkeypatch.setenv("TPU_WORKER_ID", "three")
    with pytest.raises(ValueError, match="TPU_WORKER_ID"):
        tpu.host_index()


def test_configure_multiprocess_gives_each_process_its_chip(tpu, monkeypatch):
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v4-8")
    monkeypatch.setenv("TPU_CHIPS_PER_HOST_BOUNDS", "2,2,1")
    tpu.configure_multiprocess(2, 4)
    assert os.environ["TPU_VISIBLE_CHIPS"] == "2"
    assert os.environ["TPU_PROCESS_BOUNDS"] == "2,2,1"
    assert os.environ["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,1,1"
    assert os.environ["TPU_PROCESS_PORT"] == "8478"
    assert os.environ["CLOUD_TPU_TASK_ID"] == "2"
    assert os.environ["TPU_PROCESS_ADDRESSES"] == "localhost:8476,localhost:8477,localhost:8478,localhost:8479"


def test_configure_multiprocess_keeps_a_topology_set_by_the_user(tpu, monkeypatch):
    monkeypatch.setenv("TPU_PROCESS_BOUNDS", "1,1,1")
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "3")
    tpu.configure_multiprocess(0, 4)
    assert os.environ["TPU_VISIBLE_CHIPS"] == "3"
    assert "TPU_PROCESS_ADDRESSES" not in os.environ


def test_configure_single_process_leaves_all_chips_visible(tpu):
    tpu.configure_single_process()
    assert "TPU_VISIBLE_CHIPS" not in os.environ


# -- topology arithmetic (pure) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("accelerator", "generation"),
    [("v2-8", 2), ("v3-32", 3), ("v4-8", 4), ("v5litepod-16", 5), ("v5p-8", 5), ("v6e-8", 6), ("tpu", None)],
)
def test_tpu_generation(accelerator, generation):
    assert tpu_generation(accelerator) == generation


@pytest.mark.parametrize("text", ["2,2", "2,2,1,1", "a,b,c", "0,1,1", ""])
def test_parse_bounds_refuses_malformed_bounds(text):
    with pytest.raises(ValueError, match="three positive integers"):
        parse_bounds(text)


def test_bounds_size():
    assert bounds_size("2,2,4") == 16


def test_host_layout_from_accelerator_type_description_or_chip_count():
    assert host_layout(TpuSlice(accelerator_type="v3-32"), 4) == ((2, 2, 1), (2, 2, 1))
    assert host_layout(TpuSlice(accelerator_type="v4-32", host_bounds="1,1,4", chips_per_host_bounds="2,2,1"), 4) == (
        (1, 1, 4),
        (2, 2, 1),
    )
    assert host_layout(TpuSlice(), 8) == ((1, 1, 1), (2, 4, 1))
    with pytest.raises(ValueError, match="TPU_CHIPS_PER_HOST_BOUNDS"):
        host_layout(TpuSlice(), 6)


def test_multihost_environment_lists_every_process_in_task_order():
    tpu_slice = TpuSlice(
        accelerator_type="v4-32",
        host_bounds="1,1,4",
        chips_per_host_bounds="2,2,1",
        worker_id=2,
        worker_addresses=("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"),
    )
    env = multiprocess_environment(1, 4, tpu_slice, local_chips=4, base_port=9000)
    assert env["TPU_PROCESS_BOUNDS"] == "2,2,4"
    assert env["CLOUD_TPU_TASK_ID"] == "9"
    assert env["TPU_VISIBLE_CHIPS"] == "1"
    assert env["TPU_PROCESS_PORT"] == "9001"
    addresses = env["TPU_PROCESS_ADDRESSES"].split(",")
    assert len(addresses) == 16
    assert addresses[:5] == ["10.0.0.1:9000", "10.0.0.1:9001", "10.0.0.1:9002", "10.0.0.1:9003", "10.0.0.2:9000"]


def test_multiprocess_environment_refuses_a_world_size_that_does_not_match_the_chips():
    with pytest.raises(ValueError, match="one process per chip"):
        multiprocess_environment(0, 2, TpuSlice(), local_chips=4)
    with pytest.raises(ValueError, match="outside the local world size"):
        multiprocess_environment(4, 4, TpuSlice(), local_chips=4)


def test_parse_metadata_attributes():
    text = "ACCELERATOR_TYPE: 'v4-32'\nWORKER_ID: '2'\nTPU_PROCESS_BOUNDS: '1,1,4'\n# comment\n\n"
    assert parse_tpu_env(text) == {"ACCELERATOR_TYPE": "v4-32", "WORKER_ID": "2", "TPU_PROCESS_BOUNDS": "1,1,4"}
    assert parse_worker_endpoints("w0:uid0:10.0.0.1,w1:uid1:10.0.0.2") == ["10.0.0.1", "10.0.0.2"]


# -- never hang ---------------------------------------------------------------------------------


@needs_no_tpu
def test_tpu_client_without_chips_fails_fast_with_real_libtpu_installed(run_python):
    assert installed_library(LIBRARY_DISTRIBUTIONS) is not None, "libtpu must be installed for this test to prove anything"
    result = run_python(
        """
        import os, sys, pjrt_plugins
        from pjrt_plugins import PluginUnavailableError
        for attempt in (lambda: pjrt_plugins.get_plugin("tpu").create_client(),
                        lambda: pjrt_plugins.create_client("tpu")):
            try:
                attempt()
            except PluginUnavailableError as exc:
                print("PluginUnavailableError:", exc)
        print("libtpu imported:", "libtpu" in sys.modules)
        """,
        timeout=60,  # libtpu's own initialization would block for more than 10 minutes
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("PluginUnavailableError:") == 2
    assert "no TPU chips found" in result.stdout
    assert "libtpu imported: False" in result.stdout


@needs_no_tpu
@pytest.mark.skipif(
    on_google_compute_engine(), reason="on a GCE VM libtpu asks the metadata server; the off-GCE defence is not used"
)
def test_skipping_the_chip_check_still_cannot_hang_off_gce(run_python):
    # Past the chip check the plugin sets TPU_SKIP_MDS_QUERY=1 off GCE, so libtpu gives
    # up at once instead of retrying the metadata server for minutes.
    result = run_python(
        """
        import os, pjrt_plugins
        try:
            pjrt_plugins.create_client("tpu")
        except Exception as exc:
            print(type(exc).__name__ + ":", str(exc).splitlines()[0])
        print("TPU_SKIP_MDS_QUERY =", os.environ.get("TPU_SKIP_MDS_QUERY"))
        print("topology =", os.environ.get("TPU_WORKER_HOSTNAMES"), os.environ.get("TPU_HOST_BOUNDS"))
        """,
        env={"PJRT_TPU_SKIP_CHIP_CHECK": "1", "PJRT_TPU_INITIALIZE_TIMEOUT": "60"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "TPU_SKIP_MDS_QUERY = 1" in result.stdout
    # libtpu's own answer, at once: "TPU initialization failed: No jellyfish device found."
    assert "PjrtError:" in result.stdout and "TPU initialization failed" in result.stdout, result.stdout
    # Without metadata and without a topology in the environment: one host, and none of libtpu's
    # placeholder errors about worker host names and host bounds on stderr.
    assert "topology = localhost 1,1,1" in result.stdout
    for text in ("could not determine", "unexpected worker hostname", "E0000"):
        assert text not in result.stderr, result.stderr


@needs_no_tpu
@pytest.mark.skipif(on_google_compute_engine(), reason="on a GCE VM libtpu asks the metadata server")
def test_a_topology_in_the_environment_is_left_as_it_is_off_gce(run_python):
    result = run_python(
        """
        import os, pjrt_plugins
        try:
            pjrt_plugins.create_client("tpu")
        except Exception as exc:
            pass
        print(os.environ.get("TPU_WORKER_HOSTNAMES"), os.environ.get("TPU_HOST_BOUNDS"))
        """,
        env={"PJRT_TPU_SKIP_CHIP_CHECK": "1", "PJRT_TPU_INITIALIZE_TIMEOUT": "60", "TPU_WORKER_HOSTNAMES": "10.0.0.1,10.0.0.2"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "10.0.0.1,10.0.0.2 None"
