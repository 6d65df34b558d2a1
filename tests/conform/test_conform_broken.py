"""Broken libraries and broken plugins are reported as FAIL, never crash or hang the harness."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest


def test_a_file_that_is_not_a_shared_library_fails_abi_load(run_cli, tmp_path):
    fake = tmp_path / "libnot_elf.so"
    fake.write_text("this is not an ELF file\n")
    run = run_cli("conform", str(fake), "--json")
    assert run.returncode == 1, run
    report = run.report()
    status, reason = report["abi.load"]
    assert status == "FAIL" and "not a shared library" in reason and "ELF" in reason
    assert report["abi.version"] == ("SKIP", "needs abi.load (FAIL)")
    assert report["_raw"]["summary"]["FAIL"] == 1  # one defect, everything after it skipped


def test_a_library_without_GetPjrtApi_fails_abi_load(run_cli, no_get_pjrt_api_library):
    run = run_cli("conform", str(no_get_pjrt_api_library))
    assert run.returncode == 1, run
    line = next(line for line in run.stdout.splitlines() if " abi.load " in line)
    assert line.split()[0] == "FAIL" and "does not export GetPjrtApi" in line
    assert "1 defect found" in run.stdout


def test_a_missing_file_fails_abi_load(run_cli, tmp_path):
    run = run_cli("conform", str(tmp_path / "libgone.so"), "--json")
    assert run.returncode == 1, run
    assert "does not exist" in run.report()["abi.load"][1]


def test_a_healthy_library_outside_any_plugin_is_checked_bare(run_cli, fake_plugin):
    run = run_cli("conform", str(fake_plugin()), "--json")
    assert run.returncode == 0, run
    report = run.report()
    assert report["_raw"]["target"]["mode"] == "library"
    assert report["buffers.float32"][0] == "PASS" and report["client.devices"][0] == "PASS"
    assert report["compile.program"][0] == "UNSUPPORTED"


def test_an_abort_in_client_create_fails_that_check_and_the_run_goes_on(run_cli, fake_plugin):
    run = run_cli("conform", str(fake_plugin("FAKE_ABORT_CLIENT_CREATE")), "--json")
    assert run.returncode == 1, run
    report = run.report()
    status, reason = report["client.create"]
    assert status == "FAIL" and "SIGABRT" in reason and "aborting in PJRT_Client_Create" in reason
    assert report["plugin.attributes"][0] == "PASS"  # checks before the crash keep their results
    assert report["client.devices"] == ("SKIP", "needs client.create (FAIL)")
    assert report["process.exit"][0] == "PASS"  # the fresh process for the remaining checks exited cleanly


def test_a_crash_in_one_dtype_fails_only_that_dtype(run_cli, fake_plugin):
    run = run_cli("conform", str(fake_plugin("FAKE_SEGV_F16")), "--json")
    assert run.returncode == 1, run
    report = run.report()
    status, reason = report["buffers.float16"]
    assert status == "FAIL" and "SIGSEGV" in reason
    for other in ("buffers.float32", "buffers.bfloat16", "buffers.int8", "buffers.every_device"):
        assert report[other][0] == "PASS", (other, report[other])
    assert report["_raw"]["summary"]["FAIL"] == 1


def test_a_hanging_initialize_is_cut_off_at_the_timeout(run_cli, fake_plugin):
    run = run_cli("conform", str(fake_plugin("FAKE_HANG_INITIALIZE")), "--timeout", "2", "--json", timeout=120)
    assert run.returncode == 1, run
    report = run.report()
    status, reason = report["plugin.initialize"]
    assert status == "FAIL" and ("did not return within 2 s" in reason or "timed out" in reason), reason
    assert report["client.create"] == ("SKIP", "needs plugin.initialize (FAIL)")


def test_wrong_data_from_the_device_is_a_fail(run_cli, fake_plugin):
    run = run_cli("conform", str(fake_plugin("FAKE_CORRUPT_READS")), "--json")
    assert run.returncode == 1, run
    report = run.report()
    status, reason = report["buffers.int32"]
    assert status == "FAIL" and reason.startswith("read back")
    assert report["client.devices"][0] == "PASS"


def test_an_unsupported_api_version_fails_abi_version(run_cli, fake_plugin):
    run = run_cli("conform", str(fake_plugin("FAKE_OLD_VERSION")), "--json")
    assert run.returncode == 1, run
    report = run.report()
    assert report["abi.load"][0] == "PASS"
    status, reason = report["abi.version"]
    assert status == "FAIL" and "0.40" in reason and "older than 0.57" in reason


def test_a_table_smaller_than_its_version_fails_abi_struct_sizes(run_cli, fake_plugin):
    run = run_cli("conform", str(fake_plugin("FAKE_SMALL_TABLE")), "--json")
    assert run.returncode == 1, run
    status, reason = run.report()["abi.struct_sizes"]
    assert status == "FAIL" and "PJRT_Api.struct_size is" in reason and "0.81" in reason


# -- the Python side of a broken plugin -------------------------------------------------------


@pytest.fixture
def broken_hooks_site(tmp_path: Path, stub_library: Path) -> Path:
    """A distribution on a PYTHONPATH directory whose plugins answer hooks wrongly."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "fake_badhooks.py").write_text(textwrap.dedent(f'''
        import pjrt_plugins
        from pjrt_plugins import hookimpl

        class BadHooks(pjrt_plugins.DevicePlugin):
            @hookimpl
            def pjrt_library_path(self):
                return {str(stub_library)!r}

            @hookimpl
            def pjrt_priority(self):
                return "high"

            @hookimpl
            def pjrt_client_option_schema(self):
                return {{"num_devices": int}}

            @hookimpl
            def pjrt_client_create_options(self):
                return {{"num_devices": "4"}}

        class Plain:
            """Not a DevicePlugin: import torch_xla would crash on it."""
            def library_path(self):
                return {str(stub_library)!r}
    '''))
    dist = site / "fake_badhooks-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-badhooks\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[torch_xla.plugins]\nfake_badhooks = fake_badhooks:BadHooks\nfake_plain = fake_badhooks:Plain\n"
    )
    return site


def test_hooks_of_the_wrong_type_and_refused_default_options_are_fails(run_cli, broken_hooks_site):
    run = run_cli("conform", "fake_badhooks", "--json", env={"PYTHONPATH": str(broken_hooks_site)})
    assert run.returncode == 1, run
    report = run.report()
    status, reason = report["python.hooks"]
    assert status == "FAIL" and "pjrt_priority() returned 'high'" in reason and "an int" in reason
    status, reason = report["python.create_options"]
    assert status == "FAIL" and "num_devices" in reason and "int64" in reason
    assert report["client.create"] == ("SKIP", "needs python.create_options (FAIL)")
    assert report["abi.functions"][0] == "PASS"  # the library itself is fine
    # Its entry point is spelt fake_badhooks: PyTorch/XLA would take PJRT_DEVICE=FAKE_BADHOOKS as device type FAKE.
    status, reason = report["python.torch_xla"]
    assert status == "FAIL" and "entry point 'fake_badhooks'" in reason and "device type 'FAKE'" in reason
    assert "'fake-badhooks' instead" in reason


def test_a_plain_class_entry_point_breaks_the_torch_xla_contract(run_cli, broken_hooks_site):
    run = run_cli("conform", "fake_plain", "--json", env={"PYTHONPATH": str(broken_hooks_site)})
    assert run.returncode == 1, run
    status, reason = run.report()["python.torch_xla"]
    assert status == "FAIL" and "not a DevicePlugin subclass" in reason and "import torch_xla" in reason


def test_an_entry_point_that_fails_to_import_fails_python_load(run_cli, tmp_path):
    site = tmp_path / "site"
    (site / "fake_broken-0.1.dist-info").mkdir(parents=True)
    (site / "fake_broken.py").write_text("raise ImportError('needs libacme-runtime.so')\n")
    (site / "fake_broken-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-broken\nVersion: 0.1\n")
    (site / "fake_broken-0.1.dist-info" / "entry_points.txt").write_text("[torch_xla.plugins]\nfake_broken = fake_broken:X\n")
    run = run_cli("conform", "fake_broken", "--json", env={"PYTHONPATH": str(site)})
    assert run.returncode == 1, run
    report = run.report()
    status, reason = report["python.load"]
    assert status == "FAIL" and "needs libacme-runtime.so" in reason
    assert report["abi.load"] == ("SKIP", "needs python.load (FAIL)")
