"""`pjrt-plugins conform` on the real plugins installed here: CPU and stub clean, libtpu and CUDA sensible."""

from __future__ import annotations

import pytest

from _support import package_file


def statuses(report: dict) -> set[str]:
    return {value[0] for key, value in report.items() if key != "_raw" and not _torch_xla_absent(key, value)}


def _torch_xla_absent(check_id: str, result: tuple[str, str]) -> bool:
    """frameworks.torch_xla skipped because no torch_xla is reachable here (CI installs none)."""
    return check_id == "frameworks.torch_xla" and result[0] == "SKIP" and "torch_xla is not installed" in result[1]


def assert_frameworks_pass(report: dict) -> None:
    """XLA's C++ client, JAX (and torch_xla where reachable) list the devices and round-trip data."""
    for check_id in ("frameworks.slots", "frameworks.xla_client", "frameworks.jax", "frameworks.torch_xla"):
        assert report[check_id][0] == "PASS" or _torch_xla_absent(check_id, report[check_id]), report[check_id]


def test_cpu_plugin_passes_every_check_with_four_devices(run_cli):
    run = run_cli("conform", "cpu", "-o", "cpu_device_count=4", "--json")
    assert run.returncode == 0, run
    report = run.report()
    failing = {k: v for k, v in report.items() if k != "_raw" and v[0] != "PASS" and not _torch_xla_absent(k, v)}
    assert failing == {}, run
    assert_frameworks_pass(report)
    assert "4 devices" in report["frameworks.xla_client"][1] and "came back equal" in report["frameworks.jax"][1]
    raw = report["_raw"]
    assert raw["ok"] is True and raw["options"] == {"cpu_device_count": 4}
    assert raw["target"]["plugin"] == "cpu" and raw["target"]["api_version"] == "0.81"
    # every dtype the runtime carries is round-tripped, multi-device execution really ran
    assert {"buffers.bfloat16", "buffers.float8_e4m3fn", "buffers.complex128", "buffers.bool"} <= set(report)
    assert "4 partitions" in report["execute.spmd"][1]
    assert "the Shardy partitioner" in report["execute.shardy"][1]
    assert "4 replicas" in report["execute.every_device"][1]


def test_cpu_plugin_with_one_device_skips_multi_device_checks_and_says_why(run_cli):
    run = run_cli("conform", "cpu")
    assert run.returncode == 0, run
    assert "=> conforms" in run.stdout
    for check in ("execute.every_device", "execute.spmd", "execute.shardy", "buffers.copy_to_device"):
        line = next(line for line in run.stdout.splitlines() if f" {check} " in line)
        assert line.split()[0] == "SKIP" and "needs at least 2" in line, line


def test_stub_plugin_is_clean_and_its_missing_compiler_is_unsupported(run_cli):
    run = run_cli("conform", "stub_neuron", "--json")
    assert run.returncode == 0, run
    report = run.report()
    assert statuses(report) == {"PASS", "UNSUPPORTED"}
    status, reason = report["compile.program"]
    assert status == "UNSUPPORTED" and "UNIMPLEMENTED" in reason and "no compiler" in reason
    assert report["compile.properties"] == ("UNSUPPORTED", "needs compile.program, which the plugin does not offer")
    for check in ("execute.single", "execute.spmd", "compile.serialize"):
        assert report[check][0] == "UNSUPPORTED", report[check]
    assert report["client.default_assignment"][0] == "UNSUPPORTED"
    assert report["buffers.float8_e8m0fnu"][0] == "PASS" and report["buffers.lifecycle"][0] == "PASS"
    assert report["python.torch_xla"][0] == "PASS" and report["errors.struct_size"][0] == "PASS"
    assert report["_raw"]["summary"]["FAIL"] == 0
    # JAX and torch_xla load the stub (they crashed on its NULL PJRT_Client_TopologyDescription before)
    assert_frameworks_pass(report)
    assert "NeuronDevice(id=0)" in report["frameworks.xla_client"][1]
    assert report["_raw"]["verdict"] == "conforms"


def _tpu_available() -> bool:
    import pjrt_plugins

    return pjrt_plugins.get_plugin("tpu").unavailable_reason() is None


@pytest.fixture(scope="module")
def libtpu() -> str:
    path = package_file("libtpu", "libtpu.so")
    if path is None or package_file("pjrt_plugin_tpu", "__init__.py") is None:
        pytest.skip("libtpu or pjrt-plugin-tpu is not installed")
    return str(path)


@pytest.mark.parametrize("by", ["name", "library path"])
def test_libtpu_is_checked_through_the_tpu_preflight_and_never_hangs(run_cli, libtpu, by):
    target = "tpu" if by == "name" else libtpu
    run = run_cli("conform", target, "--json", timeout=180)
    assert run.returncode == 0, run
    report = run.report()
    assert report["_raw"]["target"]["plugin"] == "tpu"
    assert report["abi.functions"][0] == "PASS" and report["abi.version"][0] == "PASS"
    status, reason = report["plugin.initialize"]
    if _tpu_available():  # a Cloud TPU VM
        assert status == "PASS", reason
    else:
        assert status == "SKIP" and "no TPU chips" in reason, reason
        assert report["client.create"] == ("SKIP", "needs plugin.initialize (SKIP)")
        # no FAIL, but nothing was really tried: never "conforms"
        assert report["_raw"]["verdict"] == "inconclusive", report["_raw"]["summary"]
        assert "plugin.initialize: " in report["_raw"]["inconclusive_reason"]
    if by == "library path":
        assert "is the library of the registered plugin 'tpu'" in report["_raw"]["notes"][0]


@pytest.fixture(scope="module")
def cuda_library() -> str:
    path = package_file("jax_plugins.xla_cuda13", "xla_cuda_plugin.so") or package_file(
        "jax_plugins.xla_cuda12", "xla_cuda_plugin.so"
    )
    if path is None:
        pytest.skip("no CUDA PJRT plugin wheel (jax-cuda13-pjrt / jax-cuda12-pjrt) is installed")
    return str(path)


def _gpu_visible() -> bool:
    from pjrt_plugin_gpu._plugin import gpu_count

    return gpu_count() > 0


def test_cuda_plugin_without_a_gpu_is_a_skip_with_the_library_s_reason(run_cli, cuda_library):
    run = run_cli("conform", "gpu", "--json")
    assert run.returncode == 0, run
    report = run.report()
    assert report["plugin.initialize"][0] == "PASS" and report["plugin.attributes"][0] == "PASS"
    status, reason = report["client.create"]
    if _gpu_visible():
        assert status == "PASS", reason
    else:
        assert status == "SKIP" and "No visible GPU devices." in reason, reason
        assert "unavailable_reason" in report["_raw"]["target"]
        assert report["_raw"]["verdict"] == "inconclusive" and "No visible GPU" in report["_raw"]["inconclusive_reason"]


def test_bare_cuda_library_without_a_gpu_is_a_skip(run_cli, cuda_library):
    run = run_cli("conform", "--bare", cuda_library, "--json")
    assert run.returncode == 0, run
    report = run.report()
    assert report["_raw"]["target"]["mode"] == "library"
    assert report["python.hooks"] == ("SKIP", "no Python plugin: a bare library path was given")
    status, reason = report["client.create"]
    if not _gpu_visible():
        assert status == "SKIP" and reason.startswith("no usable device here") and "FAILED_PRECONDITION" in reason
