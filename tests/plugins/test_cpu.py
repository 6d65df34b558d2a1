"""The cpu backend: library lookup, CPU_NUM_DEVICES, the option schema, and real programs on 8 devices."""

from __future__ import annotations

import importlib.metadata
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pjrt_plugins
from pjrt_plugins import OptionType, PluginConfigurationError
from pjrt_plugins.conform._programs import ADD_F32, spmd_square_and_sum
from pjrt_plugins.options import validate_options
from pjrt_plugin_cpu import CpuPlugin
from pjrt_plugin_cpu._plugin import client_environment, keep_freed_host_memory, stall_timeout

# Squares a 16-vector split over 8 devices and sums the squares across them (the partitioner adds the all-reduce).
SPMD_PROGRAM = spmd_square_and_sum(8, shard_length=2)


@pytest.fixture
def cpu() -> CpuPlugin:
    return CpuPlugin()


def test_entry_point_registers_cpu_plugin_class():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="torch_xla.plugins")}
    assert eps.get("cpu") == "pjrt_plugin_cpu:CpuPlugin"
    assert isinstance(pjrt_plugins.get_plugin("cpu"), CpuPlugin)


def test_library_is_found_inside_installed_xla_cpu_pjrt(cpu):
    dist = importlib.metadata.distribution("xla-cpu-pjrt")
    expected = Path(str(dist.locate_file("xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so"))).absolute()
    assert Path(cpu.library_path()) == expected
    assert expected.is_file()
    assert cpu.unavailable_reason() is None
    assert cpu.is_available()


def test_asking_the_plugin_never_opens_the_library(run_python):
    result = run_python(
        """
        import pjrt_plugins
        cpu = pjrt_plugins.get_plugin("cpu")
        path = cpu.library_path()
        cpu.unavailable_reason(); cpu.physical_chip_count(); cpu.client_create_options(); cpu.preflight()
        with open("/proc/self/maps") as maps:
            print("mapped:", path in maps.read())
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "mapped: False"


def test_library_path_env_overrides_installed_library(cpu, monkeypatch, tmp_path):
    other = tmp_path / "newer_cpu_plugin.so"
    other.write_bytes(b"")
    monkeypatch.setenv("PJRT_CPU_LIBRARY_PATH", str(other))
    assert cpu.library_path() == str(other)
    assert cpu.unavailable_reason() is None


def test_library_path_env_naming_missing_file_makes_plugin_misconfigured(cpu, monkeypatch, tmp_path):
    monkeypatch.setenv("PJRT_CPU_LIBRARY_PATH", str(tmp_path / "missing.so"))
    reason = cpu.unavailable_reason()
    assert reason is not None and reason.startswith("misconfigured: ") and "PJRT_CPU_LIBRARY_PATH" in reason
    assert isinstance(cpu.configuration_error(), PluginConfigurationError)
    with pytest.raises(PluginConfigurationError, match="PJRT_CPU_LIBRARY_PATH"):
        cpu.preflight()
    with pytest.raises(PluginConfigurationError, match="PJRT_CPU_LIBRARY_PATH"):
        cpu.library_path()


def test_device_count_defaults_to_one(cpu):
    assert cpu.client_create_options() == {"cpu_device_count": 1}
    assert cpu.physical_chip_count() == 1


def test_cpu_num_devices_sets_device_option_and_chip_count(cpu, monkeypatch):
    monkeypatch.setenv("CPU_NUM_DEVICES", "8")
    assert cpu.client_create_options() == {"cpu_device_count": 8}
    assert cpu.physical_chip_count() == 8


@pytest.mark.parametrize("value", ["eight", "0", "-2", "1.5", "1025"])
def test_malformed_cpu_num_devices_raises_naming_the_variable(cpu, monkeypatch, value):
    monkeypatch.setenv("CPU_NUM_DEVICES", value)
    with pytest.raises(ValueError, match="CPU_NUM_DEVICES"):
        cpu.client_create_options()
    with pytest.raises(ValueError, match="CPU_NUM_DEVICES"):
        cpu.preflight()
    assert "CPU_NUM_DEVICES" in (cpu.unavailable_reason() or "")


def test_other_hooks_keep_core_defaults(cpu):
    assert cpu.priority() == 0
    assert cpu.rng_default() == "default"
    assert cpu.dense_gather_factor() == 0
    assert cpu.host_index() == 0
    assert cpu.requires_xla_coordinator() is False


def test_option_schema_is_cpu_device_count_int64(cpu):
    assert cpu.option_schema() == {"cpu_device_count": OptionType.INT64}


def test_schema_refuses_mistyped_and_unknown_options(cpu):
    schema = cpu.option_schema()
    with pytest.raises(TypeError, match="cpu_device_count"):
        validate_options({"cpu_device_count": "8"}, schema, plugin="cpu")
    with pytest.raises(TypeError, match="cpu_device_count"):
        validate_options({"cpu_device_count": 8.0}, schema, plugin="cpu")
    with pytest.raises(ValueError, match="Did you mean 'cpu_device_count'"):
        validate_options({"cpu_devices_count": 8}, schema, plugin="cpu")


def test_mistyped_option_never_reaches_the_library(run_python):
    # This build aborts the process on a string for an int: prove the client raises instead.
    result = run_python(
        """
        import pjrt_plugins
        try:
            pjrt_plugins.get_plugin("cpu").create_client({"cpu_device_count": "8"})
        except TypeError as exc:
            print("TypeError:", exc)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "TypeError:" in result.stdout and "cpu_device_count" in result.stdout


@pytest.mark.parametrize("count", [0, -1, 100_000])
def test_device_counts_the_library_mishandles_are_refused_before_the_call(cpu, count):
    # The library itself makes a client with no devices for 0 or -1 and never finishes for 100000.
    with pytest.raises(ValueError, match="cpu_device_count"):
        cpu.create_client({"cpu_device_count": count})


def test_default_client_has_one_cpu_device(cpu):
    with cpu.create_client() as client:
        assert len(client.devices) == 1
        assert client.platform_name == "cpu"


def test_add_program_runs_on_cpu(cpu):
    with cpu.create_client() as client:
        executable = client.compile(ADD_F32)
        a = client.buffer_from_host(np.arange(4, dtype=np.float32))
        b = client.buffer_from_host(np.full(4, 10, dtype=np.float32))
        [[out]] = executable.execute([[a, b]])
        np.testing.assert_array_equal(out.to_numpy(), np.arange(4, dtype=np.float32) + 10)


def test_eight_device_client_runs_spmd_program(cpu, monkeypatch):
    from pjrt_plugins.runtime import CompileOptions

    monkeypatch.setenv("CPU_NUM_DEVICES", "8")
    x = np.arange(16, dtype=np.float32)
    with cpu.create_client() as client:
        assert len(client.devices) == 8
        assert len({d.id for d in client.devices}) == 8
        executable = client.compile(SPMD_PROGRAM, CompileOptions(num_partitions=8, use_spmd_partitioning=True))
        devices = executable.addressable_devices
        assert len(devices) == 8
        shards = [[client.buffer_from_host(x[2 * i : 2 * i + 2], device=d)] for i, d in enumerate(devices)]
        outputs = executable.execute(shards)
        assert len(outputs) == 8
        squares = np.concatenate([outs[0].to_numpy() for outs in outputs])
        np.testing.assert_array_equal(squares, x * x)
        for outs in outputs:  # every device holds the all-reduced sum of the squares
            assert float(outs[1].to_numpy()) == float((x * x).sum())


def test_caller_options_override_cpu_num_devices(cpu, monkeypatch):
    monkeypatch.setenv("CPU_NUM_DEVICES", "8")
    with cpu.create_client({"cpu_device_count": 2}) as client:
        assert len(client.devices) == 2


def test_client_environment_turns_xnnpack_off_and_keeps_the_librarys_pools():
    assert client_environment(8) == {"XLA_FLAGS": "--xla_cpu_use_xnnpack=false"}


@pytest.mark.parametrize("flag", ["--xla_cpu_use_xnnpack=true", "--xla_cpu_use_xnnpack", "-xla_cpu_use_xnnpack=1"])
def test_xnnpack_turned_back_on_gets_two_threads_per_device(monkeypatch, flag):
    monkeypatch.setenv("XLA_FLAGS", flag)
    assert client_environment(8) == {"XLA_FLAGS": flag, "PJRT_NPROC": str(max(os.cpu_count() or 1, 16))}
    monkeypatch.setenv("XLA_FLAGS", f"{flag} --xla_cpu_use_xnnpack=false")  # the last one wins
    assert "PJRT_NPROC" not in client_environment(8)


def test_client_environment_builds_on_what_the_user_set(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/dump")
    monkeypatch.setenv("NPROC", "3")
    assert client_environment(8) == {"XLA_FLAGS": "--xla_dump_to=/tmp/dump --xla_cpu_use_xnnpack=false"}
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_xnnpack=true --xla_dump_to=/tmp/dump")
    assert client_environment(8) == {"XLA_FLAGS": "--xla_cpu_use_xnnpack=true --xla_dump_to=/tmp/dump"}


@pytest.mark.parametrize(("value", "expected"), [(None, 10.0), ("2.5", 2.5), ("0", None)])
def test_stall_timeout_comes_from_the_environment(monkeypatch, value, expected):
    if value is not None:
        monkeypatch.setenv("PJRT_CPU_STALL_TIMEOUT", value)
    assert stall_timeout() == expected
    assert CpuPlugin().hook.pjrt_stall_timeout() == expected


@pytest.mark.parametrize("value", ["abc", "-1", "inf", "nan"])
def test_bad_stall_timeout_names_the_variable(monkeypatch, value):
    monkeypatch.setenv("PJRT_CPU_STALL_TIMEOUT", value)
    with pytest.raises(ValueError, match="PJRT_CPU_STALL_TIMEOUT"):
        stall_timeout()


@pytest.mark.parametrize(("user_flags", "xnnpack", "threads"), [("", False, 8), ("--xla_cpu_use_xnnpack=true", True, 16)])
def test_the_library_sees_its_environment_only_while_it_creates_the_client(run_python, tmp_path, user_flags, xnnpack, threads):
    """XLA reads the pool size and its flags as the client is created: XNNPACK off and the library's
    own pools (as many threads as devices here), or with XNNPACK on twice the threads."""
    dump = tmp_path / "dump"
    result = run_python(
        f"""
        import glob, os
        import pjrt_plugins
        from pjrt_plugins.conform._programs import spmd_square_and_sum
        from pjrt_plugins.runtime import CompileOptions
        with pjrt_plugins.get_plugin("cpu").create_client({{"cpu_device_count": 8}}) as client:
            names = [open(f"/proc/self/task/{{task}}/comm").read().strip() for task in os.listdir("/proc/self/task")]
            print("intra-op threads:", names.count("tf_XLAEigen"))
            print("stall timeout:", client.stall_timeout)
            print("environment after:", os.environ.get("XLA_FLAGS"), os.environ.get("PJRT_NPROC"))
            client.compile(spmd_square_and_sum(8, 2), CompileOptions(num_partitions=8, use_spmd_partitioning=True))
        options = open(glob.glob("{dump}/*debug_options")[0]).read()
        print("xnnpack off:", "xla_cpu_use_xnnpack: false" in options)
        """,
        env={"XLA_FLAGS": f"--xla_dump_to={dump} {user_flags}".strip()},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"intra-op threads: {max(os.cpu_count() or 1, threads)}",
        "stall timeout: 10.0",
        f"environment after: {f'--xla_dump_to={dump} {user_flags}'.strip()} None",
        f"xnnpack off: {not xnnpack}",
    ]


#: In a child: hold 64 MiB of 8 MiB blocks, free them, five times; print the page faults of the last four rounds.
#: glibc's defaults give the freed top back to the system each round, and the next round faults it in again.
FAULTS_OF_A_STEP_PATTERN = """
import ctypes, resource
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
def round_of_blocks():
    blocks = [libc.malloc(8 << 20) for _ in range(8)]
    for block in blocks:
        libc.memset(block, 1, 8 << 20)
    for block in blocks:
        libc.free(block)
round_of_blocks()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    round_of_blocks()
print("faults per round:", (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) // 4)
"""


@pytest.mark.parametrize(("setting", "kept"), [(None, True), ("1", True), ("0", False)])
def test_a_cpu_client_keeps_the_memory_a_step_frees(run_python, setting, kept):
    """The backend sets malloc's thresholds as the process is configured for its client (the
    device buffers and temporaries are malloc's): memory freed by one step is reused by the next
    without page faults, unless PJRT_CPU_KEEP_FREED_MEMORY=0 leaves glibc's defaults."""
    code = """
    import pjrt_plugins
    with pjrt_plugins.get_plugin("cpu").create_client() as client:
        pass
    """ + textwrap.indent(FAULTS_OF_A_STEP_PATTERN, "    ")
    result = run_python(code, env={} if setting is None else {"PJRT_CPU_KEEP_FREED_MEMORY": setting})
    assert result.returncode == 0, result.stderr
    faults = int(result.stdout.split("faults per round:")[1])
    if kept:
        assert faults < 200, result.stdout  # 16,384 pages are freed and reused each round
    else:
        assert faults > 8000, result.stdout  # the same pages faulted in again (glibc's defaults)


def test_a_malformed_keep_freed_memory_switch_names_the_variable(cpu, monkeypatch):
    monkeypatch.setenv("PJRT_CPU_KEEP_FREED_MEMORY", "sometimes")
    with pytest.raises(PluginConfigurationError, match="PJRT_CPU_KEEP_FREED_MEMORY"):
        cpu.configure_single_process()


def test_keeping_freed_memory_is_applied_once_and_reports_it():
    assert keep_freed_host_memory() is True  # glibc here
    assert keep_freed_host_memory() is True
