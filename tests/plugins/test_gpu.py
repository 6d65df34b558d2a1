"""The gpu backend: CUDA library lookup, torchrun ranks -> options, GPU counting, and failing fast with no GPU."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
from packaging.version import Version

import pjrt_plugins
from pjrt_plugins import OptionType, installed_library
from pjrt_plugins.options import validate_options
from pjrt_plugin_gpu import GpuPlugin
from pjrt_plugin_gpu._devices import installed_gpu_count, visible_gpu_count
from pjrt_plugin_gpu._plugin import OPTION_SCHEMA


@pytest.fixture
def gpu() -> GpuPlugin:
    return GpuPlugin()


def test_entry_point_registers_gpu_plugin_class():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="torch_xla.plugins")}
    assert eps.get("gpu") == "pjrt_plugin_gpu:GpuPlugin"
    assert isinstance(pjrt_plugins.get_plugin("gpu"), GpuPlugin)


def test_library_is_found_inside_installed_jax_cuda13_pjrt(gpu):
    dist = importlib.metadata.distribution("jax-cuda13-pjrt")
    expected = Path(str(dist.locate_file("jax_plugins/xla_cuda13/xla_cuda_plugin.so"))).absolute()
    assert expected.is_file()
    assert Path(gpu.library_path()) == expected


def test_asking_the_plugin_never_imports_jax_or_opens_the_library(run_python):
    result = run_python(
        """
        import sys, pjrt_plugins
        gpu = pjrt_plugins.get_plugin("gpu")
        path = gpu.library_path()
        gpu.unavailable_reason(); gpu.physical_chip_count(); gpu.client_create_options(); gpu.option_schema()
        with open("/proc/self/maps") as maps:
            mapped = path in maps.read()
        print(sorted(m for m in sys.modules if m == "jax" or m.startswith(("jax.", "jax_plugins"))), mapped)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "False"]


def test_library_lookup_falls_back_to_the_next_distribution(tmp_path, monkeypatch):
    # A real (if tiny) installed distribution on sys.path stands in for jax-cuda12-pjrt.
    site = tmp_path / "site"
    (site / "fake_cuda12_pjrt-1.0.dist-info").mkdir(parents=True)
    metadata = "Metadata-Version: 2.1\nName: fake-cuda12-pjrt\nVersion: 1.0\n"
    (site / "fake_cuda12_pjrt-1.0.dist-info" / "METADATA").write_text(metadata)
    library = site / "jax_plugins" / "xla_cuda12" / "xla_cuda_plugin.so"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    monkeypatch.syspath_prepend(str(site))
    found = installed_library(
        (
            ("not-installed-cuda-pjrt", "jax_plugins/x/xla_cuda_plugin.so"),
            ("fake-cuda12-pjrt", "jax_plugins/xla_cuda12/xla_cuda_plugin.so"),
        )
    )
    assert found == library.absolute()
    assert installed_library((("not-installed-cuda-pjrt", "x.so"),)) is None


def test_library_path_env_overrides_and_is_checked(gpu, monkeypatch, tmp_path):
    other = tmp_path / "xla_cuda_plugin.so"
    other.write_bytes(b"")
    monkeypatch.setenv("PJRT_GPU_LIBRARY_PATH", str(other))
    assert gpu.library_path() == str(other)
    monkeypatch.setenv("PJRT_GPU_LIBRARY_PATH", str(tmp_path / "missing.so"))
    assert "PJRT_GPU_LIBRARY_PATH" in gpu.unavailable_reason()
    with pytest.raises(pjrt_plugins.PluginConfigurationError, match="PJRT_GPU_LIBRARY_PATH"):
        gpu.preflight()


def test_single_process_options(gpu):
    assert gpu.client_create_options() == {"allocator": "default", "node_id": 0, "num_nodes": 1}
    assert gpu.requires_xla_coordinator() is False
    assert gpu.host_index() == 0


def test_allocator_environment_maps_to_options(gpu, monkeypatch):
    monkeypatch.setenv("PJRT_ALLOCATOR_CUDA_ASYNC", "1")
    monkeypatch.setenv("PJRT_ALLOCATOR_FRACTION", "0.5")
    monkeypatch.setenv("PJRT_ALLOCATOR_PREALLOCATE", "false")
    options = gpu.client_create_options()
    assert options["allocator"] == "cuda_async"
    assert options["memory_fraction"] == 0.5
    assert options["preallocate"] is False


@pytest.mark.parametrize(
    ("name", "value"),
    [("PJRT_ALLOCATOR_FRACTION", "1.5"), ("PJRT_ALLOCATOR_FRACTION", "half"), ("PJRT_ALLOCATOR_PREALLOCATE", "maybe")],
)
def test_malformed_allocator_environment_raises_naming_the_variable(gpu, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        gpu.client_create_options()


def test_torchrun_ranks_give_one_gpu_per_process_and_need_a_coordinator(gpu, monkeypatch):
    for name, value in {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "RANK": "5", "WORLD_SIZE": "8"}.items():
        monkeypatch.setenv(name, value)
    options = gpu.client_create_options()
    assert options["visible_devices"] == [1]
    assert options["node_id"] == 5
    assert options["num_nodes"] == 8
    assert gpu.requires_xla_coordinator() is True
    assert gpu.host_index() == 1  # RANK // LOCAL_WORLD_SIZE
    monkeypatch.setenv("GROUP_RANK", "3")
    assert gpu.host_index() == 3


def test_pjrt_rank_variables_take_precedence_over_torchrun(gpu, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("PJRT_LOCAL_PROCESS_RANK", "2")
    monkeypatch.setenv("PJRT_LOCAL_PROCESS_COUNT", "3")
    assert gpu.client_create_options()["visible_devices"] == [2]
    assert gpu.requires_xla_coordinator() is True  # world size defaults to the local one


def test_rng_default_is_three_fry_unless_overridden(gpu, monkeypatch):
    assert gpu.rng_default() == "three_fry"
    monkeypatch.setenv("XLA_RNG_BIT_GENERATOR", "philox")
    assert gpu.rng_default() == "philox"


def test_priority_and_sparse_gathers(gpu):
    assert gpu.priority() == 200
    assert gpu.dense_gather_factor() == 0


def test_default_options_satisfy_the_schema(gpu, monkeypatch):
    for name, value in {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "PJRT_ALLOCATOR_FRACTION": "0.9",
                        "PJRT_ALLOCATOR_PREALLOCATE": "1"}.items():
        monkeypatch.setenv(name, value)
    typed = {v.name: v.type for v in validate_options(gpu.client_create_options(), gpu.option_schema(), plugin="gpu")}
    assert typed["visible_devices"] is OptionType.INT64_LIST
    assert typed["memory_fraction"] is OptionType.FLOAT
    assert typed["preallocate"] is OptionType.BOOL


def test_schema_refuses_mistyped_and_unknown_options(gpu):
    schema = gpu.option_schema()
    with pytest.raises(TypeError, match="memory_fraction"):
        validate_options({"memory_fraction": "0.5"}, schema, plugin="gpu")
    with pytest.raises(TypeError, match="visible_devices"):
        validate_options({"visible_devices": 0}, schema, plugin="gpu")
    with pytest.raises(ValueError, match="Did you mean 'preallocate'"):
        validate_options({"prealocate": True}, schema, plugin="gpu")


# -- counting GPUs ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        (None, 4),
        ("", 0),
        ("0,1", 2),
        ("3,0", 2),
        ("0,7,1", 1),  # 7 is out of range: CUDA stops there
        ("0,0,1", 1),  # a duplicate also ends the list
        ("-1", 0),
        ("1,x,2", 1),
        (" 2 , 3 ", 2),
        ("GPU-8f6e1d2c,GPU-0a1b", 2),
        ("GPU-a,GPU-b,GPU-c,GPU-d,GPU-e", 4),  # never more than are installed
    ],
)
def test_visible_gpu_count_follows_cuda_visible_devices_rules(visible, expected):
    assert visible_gpu_count(4, visible) == expected


def test_installed_gpu_count_reads_proc_then_dev(tmp_path):
    proc, dev = tmp_path / "proc_gpus", tmp_path / "dev"
    dev.mkdir()
    for node in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (dev / node).write_text("")
    assert installed_gpu_count(proc, dev) == 3  # no /proc entry (a container): the device nodes count
    proc.mkdir()
    for bus_id in ("0000:17:00.0", "0000:65:00.0"):
        (proc / bus_id).mkdir()
    assert installed_gpu_count(proc, dev) == 2
    assert installed_gpu_count(tmp_path / "none", tmp_path / "none") == 0


def test_chip_count_honours_cuda_visible_devices_and_gpu_num_devices(gpu, monkeypatch):
    assert gpu.physical_chip_count() == installed_gpu_count()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert gpu.physical_chip_count() == 0
    assert not gpu.is_available()
    assert "No NVIDIA GPU is visible" in gpu.unavailable_reason()
    monkeypatch.setenv("GPU_NUM_DEVICES", "2")
    assert gpu.physical_chip_count() == 2


#: A valid value for every option the schema lists (the library checks some values too).
VALID_OPTION_VALUES = {
    "platform_name": "cuda",
    "allocator": "bfc",
    "memory_fraction": 0.5,
    "preallocate": False,
    "collective_memory_size": 1 << 20,
    "visible_devices": [0],
    "node_id": 0,
    "num_nodes": 1,
    "enable_mock_nccl": False,
    "mock_gpu_topology": "1x1x1",
    "should_stage_host_to_device_transfers": True,
    "abort_collectives_on_failure": False,
    "use_tfrt_gpu_client": False,
    "max_inflight_computations": 4,
}


#: Schema options that older library releases refuse by name, with the newest release that does
#: (the schema follows 0.11.1; pjrt-plugin-gpu[cuda13-local] resolves to 0.10.2 on Python 3.11).
LAST_RELEASE_WITHOUT = {"max_inflight_computations": Version("0.10.2")}


def test_schema_matches_the_real_cuda_plugin(run_python):
    # The CUDA plugin checks option names and types before it looks for GPUs: with
    # CUDA_VISIBLE_DEVICES="" every option the schema accepts gets as far as "no GPU",
    # and the same name with another type is refused by the plugin itself.
    assert set(VALID_OPTION_VALUES) == set(OPTION_SCHEMA)
    result = run_python(
        f"""
        import pjrt_plugins
        from pjrt_plugins.runtime import Client, load_library
        gpu = pjrt_plugins.get_plugin("gpu")
        library = load_library(gpu.library_path())
        for name, value in {VALID_OPTION_VALUES!r}.items():
            for label, options in (("typed", {{name: value}}), ("mistyped", {{name: [1, 2]}})):
                if label == "mistyped" and isinstance(value, list):
                    options = {{name: 1}}
                try:
                    Client(library, options)  # no schema: the library's own check answers
                except pjrt_plugins.PjrtError as exc:
                    print(label, name, "->", str(exc).splitlines()[0])
        """,
        env={"CUDA_VISIBLE_DEVICES": ""},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2 * len(OPTION_SCHEMA), result.stdout
    release = Version(importlib.metadata.version("jax-cuda13-pjrt"))
    for line in lines:
        name = line.split()[1]
        if name in LAST_RELEASE_WITHOUT and release <= LAST_RELEASE_WITHOUT[name]:
            assert f"Unexpected option name passed to PJRT_Client_Create: {name}" in line, line
        elif line.startswith("typed"):
            assert "No visible GPU devices" in line, line
        else:
            assert "type index" in line, line


def test_client_without_gpu_fails_fast_with_the_plugin_reason_and_a_hint(run_python):
    # CUDA_VISIBLE_DEVICES="" hides every GPU, so this runs the no-GPU path on any host.
    result = run_python(
        """
        import pjrt_plugins
        from pjrt_plugins import PjrtError
        try:
            pjrt_plugins.create_client("gpu")
        except PjrtError as exc:
            print("PjrtError:", exc)
        """,
        env={"CUDA_VISIBLE_DEVICES": ""},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "PjrtError:" in result.stdout
    assert "No visible GPU devices." in result.stdout
    assert "Hint:" in result.stdout and "nvidia-smi" in result.stdout
